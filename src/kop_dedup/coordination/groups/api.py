"""The typed requests and answers of the group coordinator (what a transport passes in
and renders; see the package docstring for the methods)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.protocol.groups import TopicPartition
from kop_dedup.pulsar.reading import Pulled

__all__ = [
    "Joined",
    "LagReport",
    "PartitionLag",
    "PartitionOffset",
    "PullResult",
    "ResetRequest",
    "ResetStatus",
    "ResolvedReset",
    "UnknownGroup",
]


class UnknownGroup(errors.GroupIdNotFound):
    """No such group: nothing of it is stored (HTTP 404)."""


@dataclass(frozen=True, slots=True)
class Joined:
    """A member's place in the group: its id, the generation and its partitions (join
    and heartbeat answer this)."""

    member_id: str
    generation: int
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class PartitionOffset:
    """An offset of one partition (a commit answers what it committed)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class ResetRequest:
    topic: str
    to: str
    """earliest, latest, timestamp or offset"""
    value: int | None = None
    partitions: tuple[int, ...] | None = None
    members: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ResolvedReset:
    """A reset's target on one partition, resolved when it was asked for."""

    topic: str
    partition: int
    offset: int
    position: str | None
    clamped: bool
    clamped_to: str | None
    """earliest or end: a timestamp before the first record or after the last."""
    epoch: int = 0
    applied_at: str = "pull"
    """Where the reset takes effect: ``pull`` (an HTTP group: each member's next pull),
    ``rebalance`` (a Kafka group with members: committed now, the members rejoin and
    fetch it), ``committed`` (a Kafka group with no member: committed now)."""
    fenced_below: int | None = None
    """A Kafka group with members: calls and commits at a generation below this are
    ILLEGAL_GENERATION (22): the generation the reset's rebalance completes."""


@dataclass(frozen=True, slots=True)
class ResetStatus:
    """One stored reset and, per member it applies to, ``applied`` or ``pending``."""

    topic: str
    partition: int
    epoch: int
    offset: int
    to: str
    value: int | None
    at_ms: int
    members: dict[str, str]


@dataclass(frozen=True, slots=True)
class AppliedReset:
    """A reset a pull applied (it starts there)."""

    topic: str
    partition: int
    offset: int
    epoch: int
    to: str


@dataclass(frozen=True, slots=True)
class Clamped:
    """A partition whose start had been deleted by retention: ``start`` is where it
    would have started, ``earliest`` the earliest still stored, where it started."""

    topic: str
    partition: int
    start: int | None
    earliest: int


@dataclass(slots=True)
class PullResult:
    records: list[tuple[TopicPartition, Pulled]]
    generation: int
    assignment: list[TopicPartition]
    resets_applied: list[AppliedReset] = field(default_factory=list)
    clamped: list[Clamped] = field(default_factory=list)
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition's numbers (per member in broadcast mode; ``minimum`` set: the
    broadcast group's minimum row, which has only ``end`` and ``lag``)."""

    topic: str
    partition: int
    member: str | None
    end: int
    committed: int | None = None
    pulled: int | None = None
    ready: int | None = None
    inflight: int | None = None
    lag: int | None = None
    oldest_inflight_ms: int | None = None
    """Age of the oldest record handed out and not committed."""
    minimum: int | None = None
    is_minimum: bool = False


@dataclass(frozen=True, slots=True)
class LagReport:
    group_id: str
    mode: str
    generation: int
    partitions: tuple[PartitionLag, ...]
