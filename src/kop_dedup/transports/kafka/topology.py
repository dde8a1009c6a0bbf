"""What the Kafka listener tells clients about the cluster, and the refusals that send
them elsewhere (Kafka's ``MetadataCache`` answers and ``NOT_LEADER_OR_FOLLOWER`` /
``NOT_COORDINATOR``).

In **cluster mode** (the default) clients see the real cluster, the same from every
node (:mod:`kop_dedup.cluster.ownership`): Metadata lists every live node and each
partition's leader, FindCoordinator names the key's coordinator, and a request for a
partition this node does not lead is answered 6 (for a key it does not coordinate, 16):
clients refresh their metadata, or find the coordinator again, and go there.

In **sidecar mode** the listener answers as a one-node cluster (this node leads every
partition and coordinates every key: its clients can reach no other node) and the
handlers forward to the owner what this node does not own.

Before the node has joined its cluster (the moment between the listener's start and
the first listing of the members) it answers as a one-node cluster too.
"""

from __future__ import annotations

from dataclasses import dataclass

from kop_dedup import errors
from kop_dedup.cluster.placement import GROUP_LOG, Member
from kop_dedup.transports.kafka.registry import Session

__all__ = [
    "Broker",
    "brokers",
    "controller",
    "coordinator_of",
    "leader_elsewhere",
    "leaders",
    "listed_group_partitions",
    "lists_transaction",
    "local_only",
    "not_coordinator",
    "not_leader",
]


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


def _self(session: Session) -> Broker:
    node = session.shared.node
    return Broker(node.node_id, node.host, node.port)


def local_only(session: Session) -> bool:
    """Whether this listener answers as a one-node cluster (sidecar mode, or not joined)."""
    cluster = session.runtime.cluster
    return cluster.mode == "sidecar" or not cluster.membership.joined


def _broker(member: Member) -> Broker:
    return Broker(member.node_id, member.host, member.port)


def brokers(session: Session) -> list[Broker]:
    """The brokers Metadata (and DescribeCluster) lists."""
    if local_only(session):
        return [_self(session)]
    return [_broker(m) for m in session.runtime.cluster.members]


def controller(session: Session) -> int:
    """Metadata's controller id: the lowest live node id (the same from every node)."""
    if local_only(session):
        return session.shared.node.node_id
    return session.runtime.cluster.view.controller or session.shared.node.node_id


def leaders(session: Session, topic: str, count: int) -> dict[int, int]:
    """Partition -> leader node id, for every partition of a topic of ``count``."""
    me = session.shared.node.node_id
    if local_only(session):
        return dict.fromkeys(range(count), me)
    placed = session.runtime.cluster.leaders(topic, count)
    return {p: placed[p].node_id if p in placed else me for p in range(count)}


def listed_group_partitions(session: Session, count: int) -> list[int]:
    """The consumer-groups partitions whose groups ListGroups answers: Kafka's broker lists
    the groups it coordinates (admin clients ask every broker and merge); a one-node
    listener lists them all."""
    if local_only(session):
        return list(range(count))
    cluster = session.runtime.cluster
    return sorted(cluster.view.owned_by(cluster.me.node_id, GROUP_LOG, count))


def lists_transaction(session: Session, transactional_id: str) -> bool:
    """Whether ListTransactions of this node names the id: Kafka's broker lists the
    transactions it coordinates (admin clients ask every broker and merge); a one-node
    listener lists them all."""
    if local_only(session):
        return True
    cluster = session.runtime.cluster
    return cluster.is_me(cluster.txn_coordinator(transactional_id))


def coordinator_of(session: Session, key_type: int, key: str) -> Broker:
    """FindCoordinator's answer for a group (0) or transactional id (1)."""
    if local_only(session):
        return _self(session)
    cluster = session.runtime.cluster
    owner = cluster.group_coordinator(key) if key_type == 0 else cluster.txn_coordinator(key)
    return _self(session) if owner is None else _broker(owner)


async def leader_elsewhere(session: Session, topic: str, partition: int) -> Member | None:
    """The leader of the partition when it is another node (None: this one, or it
    cannot be told: the handler answers the topic's own problem)."""
    cluster = session.runtime.cluster
    if not cluster.membership.joined:
        return None
    try:
        leader = await cluster.leader_of(topic, partition)
    except (errors.KafkaError, ValueError):  # no such topic or partition, a name refused
        return None
    return None if leader is None or cluster.is_me(leader) else leader


async def not_leader(session: Session, topic: str, partition: int) -> errors.KafkaError | None:
    """6 NOT_LEADER_OR_FOLLOWER for a partition another node leads (cluster mode; in
    sidecar mode the handler forwards instead)."""
    if local_only(session):
        return None
    leader = await leader_elsewhere(session, topic, partition)
    if leader is None:
        return None
    cluster = session.runtime.cluster
    cluster.stats.not_leader += 1
    return errors.NotLeaderOrFollower(
        f"{topic}-{partition} is led by {cluster.describe(leader)}; refresh the metadata"
    )


def not_coordinator(session: Session, key_type: int, key: str) -> errors.KafkaError | None:
    """16 NOT_COORDINATOR for a group (0) or transactional id (1) another node
    coordinates (cluster mode)."""
    if local_only(session):
        return None
    cluster = session.runtime.cluster
    owner = cluster.group_coordinator(key) if key_type == 0 else cluster.txn_coordinator(key)
    if owner is None or cluster.is_me(owner):
        return None
    cluster.stats.not_coordinator += 1
    what = "group" if key_type == 0 else "transactional id"
    return errors.NotCoordinator(
        f"{what} {key!r} is coordinated by {cluster.describe(owner)}; find the coordinator again"
    )
