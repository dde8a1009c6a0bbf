"""The server-side assignors of the consumer group protocol (KIP-848): ``uniform`` (the
default, as Kafka's ``group.consumer.assignors``) and ``range``, after Kafka's
``UniformAssignor`` and ``RangeAssignor``. Pure: members' subscriptions, the partition
counts, the previous target and the static members' instance ids in, the new target out.

``uniform`` spreads every subscribed partition so that members' counts differ by at
most one (among members subscribed to the same topics), keeping each member's previous
partitions where the balance allows, so that a member joining or leaving moves only the
partitions it must. ``range`` gives each topic's partitions in contiguous ranges to the
members subscribed to it (the first ``partitions % members`` get one more), so that
members of co-partitioned topics get the same partition numbers. As Kafka 4.1's (since
KAFKA-16944) it is not sticky: the members are ordered static members first by instance
id (``group.instance.id``), then the others by member id, and the ranges follow that
order whatever the previous target was; a static member keeps its ranges across
restarts as long as the membership and the topics stay the same, a member joining or
leaving may move every other member's ranges
(``tests/integration/test_kafka_range_assignor_java.py`` compares it with Kafka's own
class).

>>> got = uniform({"a": ("t",), "b": ("t",)}, {"t": 4}, {})
>>> sorted(got["a"]), sorted(got["b"])
([('t', 0), ('t', 2)], [('t', 1), ('t', 3)])
>>> got = range_assign({"a": ("t",), "b": ("t",)}, {"t": 3}, {})
>>> sorted(got["a"]), sorted(got["b"])
([('t', 0), ('t', 1)], [('t', 2)])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = [
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "Assignment",
    "TopicPartition",
    "range_assign",
    "range_order",
    "uniform",
]

TopicPartition = tuple[str, int]
Assignment = frozenset[TopicPartition]
Subscriptions = Mapping[str, Sequence[str]]
"""Member id -> the topic names it subscribes to."""
Instances = Mapping[str, str]
"""Member id -> its instance id (static members only)."""
Assignor = Callable[
    [Subscriptions, Mapping[str, int], Mapping[str, Assignment], Instances],
    dict[str, Assignment],
]


def _partitions(topics: Sequence[str], counts: Mapping[str, int]) -> list[TopicPartition]:
    return [(t, p) for t in sorted(set(topics)) for p in range(counts.get(t, 0))]


def uniform(
    subscriptions: Subscriptions,
    counts: Mapping[str, int],
    previous: Mapping[str, Assignment],
    instances: Instances | None = None,  # noqa: ARG001 - the assignors' common signature
) -> dict[str, Assignment]:
    """Balanced and sticky: each partition to one member subscribed to its topic."""
    members = sorted(subscriptions)
    out: dict[str, set[TopicPartition]] = {m: set() for m in members}
    eligible: dict[TopicPartition, list[str]] = {}
    for m in members:
        for tp in _partitions(subscriptions[m], counts):
            eligible.setdefault(tp, []).append(m)
    if not members or not eligible:
        return {m: frozenset() for m in members}
    total = len(eligible)
    floor, extra = divmod(total, len(members))
    # sticky pass: a member keeps its previous partitions up to its quota (floor, plus
    # one while the extra slots last)
    taken: set[TopicPartition] = set()
    for m in members:
        kept = sorted(tp for tp in previous.get(m, frozenset()) if m in eligible.get(tp, ()))
        quota = floor
        if len(kept) > floor and extra > 0:
            quota, extra = floor + 1, extra - 1
        for tp in kept[:quota]:
            out[m].add(tp)
            taken.add(tp)
    # the rest, in order, each to the eligible member holding the fewest
    for tp in sorted(eligible):
        if tp in taken:
            continue
        m = min(eligible[tp], key=lambda c: (len(out[c]), c))
        out[m].add(tp)
    return {m: frozenset(a) for m, a in out.items()}


def range_order(members: Iterable[str], instances: Instances) -> list[str]:
    """Kafka's ``RangeAssignor.sortMemberIds``: static members first, by instance id,
    then the others by member id."""
    return sorted(
        members,
        key=lambda m: (0, instances[m], "") if m in instances else (1, "", m),
    )


def range_assign(
    subscriptions: Subscriptions,
    counts: Mapping[str, int],
    previous: Mapping[str, Assignment],  # noqa: ARG001 - the assignors' common signature
    instances: Instances | None = None,
) -> dict[str, Assignment]:
    """Per topic, contiguous ranges to its subscribers in :func:`range_order`."""
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    order = range_order(subscriptions, instances or {})
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        subscribers = [m for m in order if topic in subscriptions[m]]
        n = counts.get(topic, 0)
        each, extra = divmod(n, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = each + (1 if i < extra else 0)
            out[m].update((topic, p) for p in range(start, start + size))
            start += size
    return {m: frozenset(a) for m, a in out.items()}


ASSIGNORS: Mapping[str, Assignor] = {"uniform": uniform, "range": range_assign}
"""The server-side assignors by name (a heartbeat naming another: UNSUPPORTED_ASSIGNOR)."""
DEFAULT_ASSIGNOR = "uniform"
