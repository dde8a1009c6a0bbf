"""Who owns what: a pure function of the cluster's members, the same on every node.

Every sidecar of a cluster computes the owner of each data partition and of each state
partition (a coordinator's log partition) from the same inputs: the live members Pulsar
lists (:mod:`kop_dedup.cluster.members`) and the thing's name. Nothing is stored and
nothing is negotiated, so two nodes that see the same members give the same answer,
and Kafka clients get the same Metadata and FindCoordinator answers from every node.

Two rules, both rendezvous hashing (a thing goes to the node that ranks it highest, a
stable hash of node and thing) with a balance on top, one per kind of group:

**A topic's partitions: in rounds** (:func:`place` of a group ``topic:<name>``). With
``n`` nodes the partitions are taken ``n`` at a time (round ``r``: ``r*n`` ..
``r*n + n - 1``), and each round gives one to each node: of the round's (partition,
node) pairs, taken from the highest rank down, a pair is kept when neither its
partition nor its node is taken yet. A round is matched whole, whether or not its last
partitions exist. So:

- the loads differ by at most one at every count (12 over 3 nodes: 4, 4, 4; 4 over 3:
  2, 1, 1);
- **adding partitions never moves a leader**: a partition's leader depends on its index
  and the nodes only (:func:`owner_at`), never on the count, as Kafka keeps every leader
  when partitions are added; the producers open on a partition stay where they are;
- a membership change moves the share of the node that came or went and, as the rounds
  regroup, some others: on average about a fifth (a node leaves) to a quarter (one
  joins) of the partitions the change does not force to move, over 2-8 nodes and 8-64
  partitions (a few times more than the bounded load below).

**A coordinator log's partitions: bounded load** (:data:`FIXED_GROUPS`, whose count is
fixed for the cluster's life). The partitions are placed in order; each goes to its
highest-ranked node among those not yet holding ``ceil(count / n)``. A node that joins
takes about its share and little else moves (the highest-ranked node of a thing changes
only when the new node ranks above it, or when a cap moves the cascade); a node that
leaves hands its things to the nodes that rank them next. A different count would move
owners, which is why topics do not use it.

Every move is handed over (:mod:`kop_dedup.cluster.handover`, and the state partitions'
load and release in :mod:`kop_dedup.coordination.partitions`).

>>> from collections import Counter
>>> view = ClusterView.of([Member(1, "h", 9092), Member(2, "h", 9093), Member(3, "h", 9094)])
>>> sorted(Counter(view.place("topic:orders", 12).values()).values())
[4, 4, 4]
>>> view.place("topic:orders", 12)[5] == view.owner_at("topic:orders", 5)
True
>>> view.owner(TRANSACTION_LOG, 5, 8) == view.place(TRANSACTION_LOG, 8)[5]
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = [
    "FIXED_GROUPS",
    "GROUP_LOG",
    "TRANSACTION_LOG",
    "ClusterView",
    "Member",
    "owner_at",
    "place",
    "score",
]

TRANSACTION_LOG = "__transaction_state"
"""The group name of the transaction log's partitions (Kafka's topic name for them)."""
GROUP_LOG = "__consumer_offsets"
"""The group name of the consumer-groups log's partitions."""
FIXED_GROUPS = frozenset({TRANSACTION_LOG, GROUP_LOG})
"""Groups whose count never changes on a running cluster: placed with bounded load."""


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
    ``nodes``: bounded load for :data:`FIXED_GROUPS`; else rounds of ``len(nodes)``
    things, one to each node, so that ``place(g, c, nodes)`` is the first ``c`` of
    ``place(g, c + k, nodes)``."""
    ordered = tuple(sorted(set(nodes)))
    if not ordered:
        raise ValueError("no nodes to place on")
    if group in FIXED_GROUPS:
        return _bounded(group, count, ordered)
    return _in_rounds(group, count, ordered)


def owner_at(group: str, index: int, nodes: Sequence[int]) -> int:
    """The owner of thing ``index`` of a group placed in rounds, whatever its count."""
    if group in FIXED_GROUPS:
        raise ValueError(f"{group}: its owners depend on its count; ask place()")
    ordered = tuple(sorted(set(nodes)))
    if not ordered:
        raise ValueError("no nodes to place on")
    return _round(group, index // len(ordered), ordered)[index % len(ordered)]


@lru_cache(maxsize=256)
def _bounded(group: str, count: int, nodes: tuple[int, ...]) -> tuple[int, ...]:
    cap = -(-count // len(nodes))
    load = dict.fromkeys(nodes, 0)
    owners = []
    for i in range(count):
        thing = f"{group}/{i}"
        ranked = sorted(nodes, key=lambda n: (score(n, thing), n), reverse=True)
        owner = next(n for n in ranked if load[n] < cap)
        load[owner] += 1
        owners.append(owner)
    return tuple(owners)


@lru_cache(maxsize=4096)
def _in_rounds(group: str, count: int, nodes: tuple[int, ...]) -> tuple[int, ...]:
    rounds = -(-count // len(nodes))
    owners = [n for r in range(rounds) for n in _round(group, r, nodes)]
    return tuple(owners[:count])


@lru_cache(maxsize=16_384)
def _round(group: str, r: int, nodes: tuple[int, ...]) -> tuple[int, ...]:
    """The owners of round ``r``'s things (one each), each pair taken highest rank first."""
    first = r * len(nodes)
    ranked = sorted(
        ((score(n, f"{group}/{i}"), n, i) for i in range(first, first + len(nodes)) for n in nodes),
        reverse=True,
    )
    owners: dict[int, int] = {}
    taken: set[int] = set()
    for _rank, node, thing in ranked:
        if thing not in owners and node not in taken:
            owners[thing] = node
            taken.add(node)
    return tuple(owners[i] for i in range(first, first + len(nodes)))


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

    def owner_at(self, group: str, index: int) -> int:
        """The owner of thing ``index`` of ``group``, whatever the group's count (the same
        for every count above ``index``)."""
        if index < 0:
            raise ValueError(f"{group}: index {index} is negative")
        return owner_at(group, index, self.node_ids)

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
