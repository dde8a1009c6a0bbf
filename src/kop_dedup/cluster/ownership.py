"""The one place that answers "is this mine, and if not, whose?" (Kafka's metadata cache).

:class:`Cluster` joins this node to the cluster (:mod:`.members`), and answers from the
latest view of the live members, with the pure placement rule of :mod:`.placement`:

- the **leader** of a data partition (``leader_of``): the node that serves produce for
  it (Kafka clients are told so in Metadata; another node answers them 6
  NOT_LEADER_OR_FOLLOWER; HTTP requests are forwarded to it);
- the **coordinator** of a group id or a transactional id (``group_coordinator``,
  ``txn_coordinator``): the owner of the key's state partition (FindCoordinator's
  answer; another node answers 16 NOT_COORDINATOR or forwards).

After every listing of the members it hands each coordinator log its share
(:meth:`kop_dedup.coordination.partitions.StatePartitions.assign`) and tells the
listeners of data partitions (the produce channels close what moved away, so the new
leader can open the producer names at once).

In **sidecar mode** (``KOP_DEDUP_CLUSTER_MODE=sidecar``: a sidecar per application pod,
its Kafka listener on loopback) Kafka clients can reach only their own sidecar: it
answers them as a one-node cluster and forwards what others own. Ownership is the same
in both modes; only what the Kafka listener tells its clients differs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from kop_dedup.cluster.members import Membership
from kop_dedup.cluster.placement import GROUP_LOG, TRANSACTION_LOG, ClusterView, Member
from kop_dedup.coordination.partitions import StatePartitions, partition_of

__all__ = ["Cluster", "ClusterStats", "DataListener", "Mode"]

log = logging.getLogger(__name__)

Mode = Literal["cluster", "sidecar"]
DataListener = Callable[[ClusterView], Awaitable[None]]
"""Called after every listing with the view (a data partition's leader may have moved)."""


def _topic_group(topic: str) -> str:
    return f"topic:{topic}"


@dataclass(slots=True)
class ClusterStats:
    """What the cluster did on this node (``/metrics``, ``GET /v1/cluster``)."""

    forwarded: int = 0
    """HTTP requests (or parts of one) sent on to the node that owns what they name."""
    forward_failures: int = 0
    not_leader: int = 0
    """Kafka requests answered 6 NOT_LEADER_OR_FOLLOWER (a partition another node leads)."""
    not_coordinator: int = 0
    """Kafka requests answered 16 NOT_COORDINATOR (a key another node coordinates)."""

    def counters(self, moves: int) -> list[tuple[str, str, list[tuple[dict[str, str], float]]]]:
        """The Prometheus counter families (``/metrics``)."""
        return [
            (
                "cluster_ownership_moves_total",
                "State partitions this node loaded or released (membership changes).",
                [({}, float(moves))],
            ),
            (
                "cluster_forwarded_total",
                "Requests (or parts of one) sent on to the node that owns what they name.",
                [
                    ({"result": "ok"}, float(self.forwarded)),
                    ({"result": "unreachable"}, float(self.forward_failures)),
                ],
            ),
            (
                "cluster_refused_total",
                (
                    "Kafka requests refused for another node: 6 NOT_LEADER_OR_FOLLOWER, 16 "
                    "NOT_COORDINATOR (clients go to the owner)."
                ),
                [
                    ({"code": "6"}, float(self.not_leader)),
                    ({"code": "16"}, float(self.not_coordinator)),
                ],
            ),
        ]


class Cluster:
    def __init__(
        self,
        membership: Membership,
        *,
        mode: Mode = "cluster",
        partitions_of: Callable[[str], Awaitable[int]],
    ) -> None:
        self.membership, self.mode = membership, mode
        self._partitions_of = partitions_of
        self._logs: list[tuple[str, StatePartitions]] = []
        self._data: list[DataListener] = []
        self.stats = ClusterStats()
        membership.listen(self._on_view)

    # -- the view -------------------------------------------------------------------------

    @property
    def me(self) -> Member:
        return self.membership.me

    @property
    def view(self) -> ClusterView:
        return self.membership.view

    @property
    def members(self) -> tuple[Member, ...]:
        return self.view.members

    async def relist(self) -> None:
        """List the members now: a node could not be reached (it stopped or died a moment
        ago), so the next answer routes by the members Pulsar lists now."""
        try:
            await self.membership.refresh()
        except Exception as exc:  # the admin API away: the last view stays
            log.debug("cluster: listing the members again failed: %r", exc)

    def excluded(self, node_id: str) -> bool:
        """Whether ``node_id`` (as a forwarded request names it) is a node left out of this
        cluster for authenticating differently (:mod:`.members`)."""
        return node_id.strip() in {str(n) for n in self.membership.excluded}

    def is_me(self, member: Member | None) -> bool:
        return member is not None and member.node_id == self.me.node_id

    def describe(self, member: Member | None) -> str:
        """A node, for messages: ``node 3 (10.0.0.7:9092)``."""
        if member is None:
            return "no live node"
        return f"node {member.node_id} ({member.host}:{member.port})"

    # -- what the placement says -------------------------------------------------------------

    def leader(self, topic: str, partition: int, count: int) -> Member | None:
        """The leader of ``topic``-``partition`` of a topic with ``count`` partitions (None:
        this node has not joined, or no node is live as it last listed)."""
        view = self.view
        if not view or not self.membership.joined:
            return None
        return view.member(view.owner(_topic_group(topic), partition, count))

    async def leader_of(self, topic: str, partition: int) -> Member | None:
        """:meth:`leader`, the partition count asked of Pulsar (cached); a node alone in
        its cluster leads everything without asking."""
        view = self.view
        if len(view.members) == 1 and self.membership.joined:
            return view.members[0]
        return self.leader(topic, partition, await self._partitions_of(topic))

    def leader_at(
        self, topic: str, partition: int, view: ClusterView | None = None
    ) -> Member | None:
        """The leader of ``topic``-``partition`` whatever the topic's count (adding
        partitions moves no leader: it depends on the index and the members only), in
        ``view`` (default: the latest); None before this node has joined."""
        view = self.view if view is None else view
        if not view or not self.membership.joined:
            return None
        return view.member(view.owner_at(_topic_group(topic), partition))

    def leaders(self, topic: str, count: int) -> dict[int, Member]:
        """Partition -> leader of every partition of a topic (for Metadata)."""
        view = self.view
        if not view:
            return {}
        placed = view.place(_topic_group(topic), count)
        return {p: m for p, n in placed.items() if (m := view.member(n)) is not None}

    def log_owner(self, log_name: str, partition: int) -> Member | None:
        """The owner of a coordinator log's partition (``log_name``: a registered log)."""
        view = self.view
        if not view:
            return None
        return view.member(view.owner(log_name, partition, self._log(log_name).count))

    def group_coordinator(self, group_id: str) -> Member | None:
        """The coordinator of a consumer group (the owner of its state partition); None
        before this node has joined (it then serves everything itself)."""
        if not self.membership.joined:
            return None
        return self.log_owner(GROUP_LOG, partition_of(group_id, self._log(GROUP_LOG).count))

    def txn_coordinator(self, transactional_id: str) -> Member | None:
        """The coordinator of a transactional id (the owner of its log partition); None
        before this node has joined."""
        if not self.membership.joined:
            return None
        tid_partition = partition_of(transactional_id, self._log(TRANSACTION_LOG).count)
        return self.log_owner(TRANSACTION_LOG, tid_partition)

    def owner_text(self, log_name: str) -> Callable[[int], str]:
        """For :class:`StatePartitions` messages: who owns partition ``p`` of the log."""
        return lambda p: self.describe(self.log_owner(log_name, p))

    def _log(self, log_name: str) -> StatePartitions:
        for name, parts in self._logs:
            if name == log_name:
                return parts
        raise KeyError(f"no coordinator log {log_name!r} is registered")

    # -- wiring ------------------------------------------------------------------------------

    def register_log(self, log_name: str, parts: StatePartitions) -> None:
        """Hand ``parts`` this node's share of the log after every listing."""
        self._logs.append((log_name, parts))
        if self.membership.joined:
            parts.assign(self.view.owned_by(self.me.node_id, log_name, parts.count))

    def on_data(self, listener: DataListener) -> None:
        self._data.append(listener)

    async def _on_view(self, view: ClusterView) -> None:
        mine = self.me.node_id if self.membership.joined else None
        for name, parts in self._logs:
            owned = frozenset() if mine is None else view.owned_by(mine, name, parts.count)
            parts.assign(owned)
        for listener in self._data:
            await listener(view)

    async def loaded(self, timeout_s: float) -> bool:
        """Whether every state partition this node owns is loaded (waits ``timeout_s``)."""
        ok = True
        for _name, parts in self._logs:
            ok = await parts.loaded(timeout_s) and ok
        return ok

    def owned_partitions(self) -> dict[str, list[int]]:
        """Per coordinator log, the partitions this node owns and has loaded."""
        return {
            name: [p for p in range(parts.count) if parts.owned(p)] for name, parts in self._logs
        }

    def moves(self) -> int:
        """State partitions loaded or released on this node since it started."""
        return sum(parts.moves for _name, parts in self._logs)

    def describe_cluster(self) -> dict[str, object]:
        """What ``GET /v1/cluster`` shows: the nodes, who owns each state partition, what
        this node owns and has loaded, and its counters."""
        view = self.view
        me = self.membership.me if self.membership.joined else None
        return {
            "nodeId": None if me is None else me.node_id,
            "mode": self.mode,
            "joined": self.membership.joined,
            "controller": view.controller,
            "excluded": sorted(self.membership.excluded),
            "nodes": [
                {
                    "nodeId": m.node_id,
                    "kafka": f"{m.host}:{m.port}",
                    "peer": m.peer_url,
                    "startedMs": m.started_ms,
                    "self": me is not None and m.node_id == me.node_id,
                }
                for m in view.members
            ],
            "stateOwners": {
                name: {str(p): n for p, n in view.place(name, parts.count).items()} if view else {}
                for name, parts in self._logs
            },
            "owned": self.owned_partitions(),
            "membershipChanges": self.membership.changes,
            "ownershipMoves": self.moves(),
            "forwarded": self.stats.forwarded,
            "forwardFailures": self.stats.forward_failures,
            "refusedNotLeader": self.stats.not_leader,
            "refusedNotCoordinator": self.stats.not_coordinator,
        }
