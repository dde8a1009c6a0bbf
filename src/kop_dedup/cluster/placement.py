"""Who owns what: a pure function of the cluster's members, the same on every node.

Every sidecar of a cluster computes the owner of each data partition and of each state
partition (a coordinator's log partition) from the same inputs: the live members Pulsar
lists (:mod:`kop_dedup.cluster.members`) and the thing's name. Nothing is stored and
nothing is negotiated, so two nodes that see the same members give the same answer,
and Kafka clients get the same Metadata and FindCoordinator answers from every node.

The rule is **rendezvous hashing with bounded load**, per group of things (the
partitions of one topic, the partitions of one coordinator log): the things are placed
in order; each goes to the node that ranks it highest (a stable hash of node and thing)
among the nodes not yet holding ``ceil(things / nodes)``. So:

- a group is spread evenly (12 partitions over 3 nodes: 4, 4, 4);
- a node that joins takes about its share from the others and little else moves (the
  highest-ranked node of a thing changes only when the new node ranks above it, or
  when a capacity moves the cascade);
- a node that leaves hands its things to the nodes that rank them next.

>>> view = ClusterView.of([Member(1, "h", 9092), Member(2, "h", 9093), Member(3, "h", 9094)])
>>> sorted(Counter(view.place("orders", 12).values()).values())
[4, 4, 4]
>>> view.owner("orders", 5, 12) == view.place("orders", 12)[5]
True
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = ["GROUP_LOG", "TRANSACTION_LOG", "ClusterView", "Member", "place", "score"]

TRANSACTION_LOG = "__transaction_state"
"""The group name of the transaction log's partitions (Kafka's topic name for them)."""
GROUP_LOG = "__consumer_offsets"
"""The group name of the consumer-groups log's partitions."""


@dataclass(frozen=True, slots=True, order=True)
class Member:
    """A live node: its Kafka node id and what others reach it at."""

    node_id: int
    host: str
    """The advertised Kafka host (what Metadata tells clients)."""
    port: int
    """The advertised Kafka port."""
    peer_url: str = ""
    """The base URL of its HTTP API, for forwarded requests (``http://host:port``)."""
    instance: str = ""
    """This run of the node (a new one at every start)."""
    started_ms: int = 0
    security: str = ""
    """Its security fingerprint (:mod:`kop_dedup.security.fingerprint`): the nodes of a
    cluster must agree on it."""


def score(node_id: int, thing: str) -> int:
    """The rank of ``thing`` on a node: a stable 64-bit hash (the same in every process,
    on every platform, in every version)."""
    digest = hashlib.blake2b(f"{node_id}\x00{thing}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def place(group: str, count: int, nodes: Sequence[int]) -> tuple[int, ...]:
    """The owner of each of ``count`` things of ``group`` (``group/0`` ..), over
    ``nodes``: rendezvous hashing with each node holding at most ``ceil(count / n)``."""
    return _place(group, count, tuple(sorted(set(nodes))))


@lru_cache(maxsize=4096)
def _place(group: str, count: int, nodes: tuple[int, ...]) -> tuple[int, ...]:
    if not nodes:
        raise ValueError("no nodes to place on")
    cap = -(-count // len(nodes))
    load: Counter[int] = Counter()
    owners = []
    for i in range(count):
        thing = f"{group}/{i}"
        ranked = sorted(nodes, key=lambda n: (score(n, thing), n), reverse=True)
        owner = next(n for n in ranked if load[n] < cap)
        load[owner] += 1
        owners.append(owner)
    return tuple(owners)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The live members as one node last saw them (sorted by node id)."""

    members: tuple[Member, ...]
    by_id: dict[int, Member] = field(compare=False, repr=False)

    @classmethod
    def of(cls, members: Iterable[Member]) -> ClusterView:
        """A view of ``members``; a node id listed twice keeps its earliest start (a
        second process started with the same id is not a member until the first one
        goes: see :mod:`kop_dedup.cluster.members`)."""
        chosen: dict[int, Member] = {}
        for m in sorted(members, key=lambda m: (m.node_id, m.started_ms, m.instance)):
            chosen.setdefault(m.node_id, m)
        ordered = tuple(sorted(chosen.values()))
        return cls(ordered, {m.node_id: m for m in ordered})

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(m.node_id for m in self.members)

    def __bool__(self) -> bool:
        return bool(self.members)

    def member(self, node_id: int) -> Member | None:
        return self.by_id.get(node_id)

    def place(self, group: str, count: int) -> dict[int, int]:
        """Thing index -> owner node id for ``count`` things of ``group``."""
        return dict(enumerate(place(group, count, self.node_ids)))

    def owner(self, group: str, index: int, count: int) -> int:
        """The owner of thing ``index`` of ``count`` in ``group``."""
        if not 0 <= index < count:
            raise ValueError(f"{group}: index {index} is not in 0..{count - 1}")
        return place(group, count, self.node_ids)[index]

    def owned_by(self, node_id: int, group: str, count: int) -> frozenset[int]:
        """The indexes of ``group`` that ``node_id`` owns."""
        if node_id not in self.by_id:
            return frozenset()
        owners = place(group, count, self.node_ids)
        return frozenset(i for i, n in enumerate(owners) if n == node_id)

    @property
    def controller(self) -> int | None:
        """Kafka's controller id in Metadata: the lowest live node id (the same answer from
        every node)."""
        return self.members[0].node_id if self.members else None
