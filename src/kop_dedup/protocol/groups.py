"""Consumer groups as pure data: membership, assignment, where a member starts, what a
commit may do (RocketMQ's RIP-48 rules), all without I/O or a clock.

Modes: in **clustering** a group's partitions are spread over its live members (one
reader per partition); in **broadcast** every member reads every partition and
commits under its own identity. A member that misses its session (no heartbeat or
pull for ``session_timeout_ms``) leaves; each change of membership bumps the
generation and reassigns.

Where a member starts on a partition (:func:`start_offset`): its own delivery
position when it has one; else, in clustering, the group's committed offset; in
broadcast, its own committed offset, else the **minimum** committed offset over the
members seen within ``broadcast_expire_ms`` (a member that restarts after losing its
state must not skip what it never processed), else the group's stored floor; else
``auto_offset_reset``.

Inflight ages (:func:`inflight_after_pull`, :func:`oldest_inflight_ms`): a delivery
keeps, per pull not fully committed, the pull's first offset and when it was answered;
the oldest inflight record is the committed offset, delivered by the last pull that
starts at or before it. Counts (:func:`counts`) are exact: offsets count records.

>>> assign(Mode.CLUSTERING, {"a": ("t",), "b": ("t",)}, {"t": 3})
{'a': (('t', 0), ('t', 2)), 'b': (('t', 1),)}
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kop_dedup import errors

__all__ = [
    "AutoReset",
    "Counts",
    "GroupConfig",
    "LagRow",
    "Member",
    "Mode",
    "Start",
    "assign",
    "broadcast_minimum",
    "counts",
    "expired",
    "inflight_after_commit",
    "inflight_after_pull",
    "oldest_inflight_ms",
    "start_offset",
]

TopicPartition = tuple[str, int]


class Mode(enum.Enum):
    CLUSTERING = "clustering"
    BROADCAST = "broadcast"


class AutoReset(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    mode: Mode = Mode.CLUSTERING
    auto_offset_reset: AutoReset = AutoReset.LATEST
    session_timeout_ms: int = 30_000
    broadcast_expire_ms: int = 120_000


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    topics: tuple[str, ...]
    joined_ms: int
    last_seen_ms: int


def expired(member: Member, config: GroupConfig, now_ms: int) -> bool:
    """Missed its session: no heartbeat, pull or commit for ``session_timeout_ms``."""
    return now_ms - member.last_seen_ms >= config.session_timeout_ms


def assign(
    mode: Mode, members: Mapping[str, Iterable[str]], partitions: Mapping[str, int]
) -> dict[str, tuple[TopicPartition, ...]]:
    """Partitions per member. Clustering: each topic's partitions round-robin over its
    subscribers in member-id order (deterministic: every sidecar computes the same);
    broadcast: every subscriber gets every partition of its topics."""
    subscribers: dict[str, list[str]] = {}
    for member in sorted(members):
        for topic in dict.fromkeys(members[member]):
            subscribers.setdefault(topic, []).append(member)
    out: dict[str, list[TopicPartition]] = {m: [] for m in members}
    for topic in sorted(subscribers):
        who = subscribers[topic]
        for p in range(partitions.get(topic, 0)):
            if mode is Mode.BROADCAST:
                for member in who:
                    out[member].append((topic, p))
            else:
                out[who[p % len(who)]].append((topic, p))
    return {m: tuple(sorted(tps)) for m, tps in out.items()}


def broadcast_minimum(
    committed: Iterable[tuple[int, int]], now_ms: int, expire_ms: int
) -> int | None:
    """The minimum committed offset over members seen within ``expire_ms``
    (``committed``: (offset, when that member was last seen)); a member seen exactly
    ``expire_ms`` ago still counts.

    >>> broadcast_minimum([(5, 1_000), (2, 0)], now_ms=1_500, expire_ms=1_000)
    5
    """
    recent = [offset for offset, seen in committed if now_ms - seen <= expire_ms]
    return min(recent) if recent else None


InflightEntry = tuple[int, int]
"""(first offset of a pull, when it was answered in epoch ms)."""
_MAX_INFLIGHT_ENTRIES = 64


def inflight_after_commit(
    entries: Sequence[InflightEntry], committed: int | None
) -> list[InflightEntry]:
    """The entries still needed once ``committed`` is the committed offset: from the
    last pull that starts at or before it."""
    out = sorted(entries)
    if committed is None:
        return out
    keep = 0
    for i, (offset, _) in enumerate(out):
        if offset <= committed:
            keep = i
    return out[keep:]


def inflight_after_pull(
    entries: Sequence[InflightEntry],
    committed: int | None,
    start: int,
    end: int,
    now_ms: int,
) -> list[InflightEntry]:
    """The entries once a pull answered offsets ``start`` up to ``end`` (exclusive) at
    ``now_ms``. Bounded: past 64 entries the second is merged into the first (whose time
    is older, so an age is never under-stated)."""
    out = inflight_after_commit([e for e in entries if e[0] < start], committed)
    if end > start and (committed is None or end > committed):
        out.append((start, now_ms))
    while len(out) > _MAX_INFLIGHT_ENTRIES:
        del out[1]
    return out


def oldest_inflight_ms(
    entries: Sequence[InflightEntry], committed: int | None, pulled: int | None
) -> int | None:
    """When the oldest record handed out and not committed was answered; None when
    nothing is inflight.

    >>> oldest_inflight_ms([(0, 100), (5, 200)], committed=6, pulled=9)
    200
    """
    if pulled is None or not entries or (committed is not None and committed >= pulled):
        return None
    ordered = sorted(entries)
    if committed is None:
        return ordered[0][1]
    at = ordered[0][1]
    for offset, ms in ordered:
        if offset <= committed:
            at = ms
    return at


@dataclass(frozen=True, slots=True)
class Counts:
    """One partition's numbers, in records (None: not known, e.g. nothing committed)."""

    end: int
    committed: int | None
    pulled: int | None
    ready: int | None
    inflight: int | None
    lag: int | None


def counts(end: int, committed: int | None, pulled: int | None) -> Counts:
    """ready = end - pulled (on the server, not handed out), inflight = pulled -
    committed (handed out, not committed), lag = end - committed; ``pulled`` None: the
    member stands at its committed offset. Never negative (a commit may name an
    offset past what was pulled, or past the end of a topic that was recreated).

    >>> counts(10, 3, 5)
    Counts(end=10, committed=3, pulled=5, ready=5, inflight=2, lag=7)
    """
    pulled = committed if pulled is None else pulled
    return Counts(
        end,
        committed,
        pulled,
        None if pulled is None else max(end - pulled, 0),
        None if pulled is None or committed is None else max(pulled - committed, 0),
        None if committed is None else max(end - committed, 0),
    )


class Start(enum.Enum):
    DELIVERED = "delivered"
    """Where the member's last pull ended."""
    COMMITTED = "committed"
    """Its committed offset (clustering: the group's)."""
    GROUP_MINIMUM = "group-minimum"
    """Broadcast: the minimum over the members seen recently."""
    FLOOR = "floor"
    """The group's stored offset (a plain commit or a reset for the group)."""
    EARLIEST = "earliest"
    LATEST = "latest"


def start_offset(
    mode: Mode,
    *,
    delivered: int | None,
    own: int | None,
    others: Iterable[tuple[int, int]],
    floor: int | None,
    auto_offset_reset: AutoReset,
    now_ms: int,
    expire_ms: int,
) -> tuple[int | None, Start]:
    """Where a member starts reading a partition (None with EARLIEST/LATEST: resolve
    against the topic). Raises OFFSET_OUT_OF_RANGE for ``none`` with nothing stored."""
    if delivered is not None:
        return delivered, Start.DELIVERED
    if own is not None:
        return own, Start.COMMITTED
    if mode is Mode.BROADCAST:
        minimum = broadcast_minimum(others, now_ms, expire_ms)
        if minimum is not None:
            return minimum, Start.GROUP_MINIMUM
    if floor is not None:
        return floor, Start.FLOOR
    if auto_offset_reset is AutoReset.EARLIEST:
        return None, Start.EARLIEST
    if auto_offset_reset is AutoReset.LATEST:
        return None, Start.LATEST
    raise errors.OffsetOutOfRange(
        "no committed offset for this member and partition, and autoOffsetReset is none"
    )


@dataclass(frozen=True, slots=True)
class LagRow:
    """One partition of one group (``member`` set: a broadcast member; ``minimum``: the
    broadcast group's minimum row, whose ``committed`` is that minimum)."""

    group: str
    topic: str
    partition: int
    member: str | None
    minimum: bool
    end: int
    committed: int | None
    ready: int | None
    inflight: int | None
    lag: int | None
    oldest_inflight_s: float | None
