"""Where a member's deliveries stand, as pure data: where it starts reading a partition,
what a pull records, what a commit takes, and the counts the lag view reports (RocketMQ's
RIP-48 rules), without I/O or a clock.

Where a member starts on a partition (:func:`plan_start`): at a reset that targets it
and that it has not applied; else its own delivery position when it has one; else,
in clustering, the group's committed offset; in broadcast, its own committed offset,
else the **minimum** committed offset over the members seen within
``broadcast_expire_ms`` (a member that restarts after losing its state must not skip
what it never processed), else the group's stored floor; else ``auto_offset_reset``.
A pull that applies a reset commits its target (:func:`committed_at_reset`): a rewind
(rejoin, leave, session expiry, rebalance, a new owner's recovery) goes back to it,
not to what was committed before the reset.

Inflight ages (:func:`inflight_after_pull`, :func:`oldest_inflight_ms`): a delivery
keeps, per pull not fully committed, the pull's first offset and when it was answered;
the oldest inflight record is the committed offset, delivered by the last pull that
starts at or before it. Counts (:func:`counts`) are exact: offsets count records.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kop_dedup import errors
from kop_dedup.protocol.groups.metadata import (
    AutoReset,
    Committed,
    Delivery,
    Group,
    InflightEntry,
    Mode,
    StaleMember,
    TopicPartition,
)
from kop_dedup.protocol.groups.resets import Reset

__all__ = [
    "Counts",
    "LagRow",
    "PlannedStart",
    "Start",
    "broadcast_minimum",
    "commit_offsets",
    "committed_at_reset",
    "counts",
    "delivery_after_commit",
    "delivery_after_pull",
    "inflight_after_commit",
    "inflight_after_pull",
    "oldest_inflight_ms",
    "plan_start",
    "same_standing",
    "start_offset",
    "started_at",
]


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


def counts(
    end: int, committed: int | None, pulled: int | None, started: int | None = None
) -> Counts:
    """ready = end - pulled (on the server, not handed out), inflight = pulled -
    committed (handed out, not committed), lag = end - committed; ``pulled`` None: the
    member stands at its committed offset. With nothing committed, inflight counts from
    ``started``, where the member's deliveries began (None: not known). Never negative
    (a commit may name an offset past what was pulled, or past the end of a topic that
    was recreated).

    >>> counts(10, 3, 5)
    Counts(end=10, committed=3, pulled=5, ready=5, inflight=2, lag=7)
    >>> counts(100, None, 30, started=0)
    Counts(end=100, committed=None, pulled=30, ready=70, inflight=30, lag=None)
    """
    pulled = committed if pulled is None else pulled
    base = committed if committed is not None else started
    return Counts(
        end,
        committed,
        pulled,
        None if pulled is None else max(end - pulled, 0),
        None if pulled is None or base is None else max(pulled - base, 0),
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
    RESET = "reset"
    """A server-side reset this pull applies."""
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
class PlannedStart:
    """Where a pull starts on one partition."""

    offset: int | None
    """None with EARLIEST/LATEST: resolve against the topic."""
    position: str | None
    start: Start
    reset: Reset | None
    """The reset this pull applies, if any."""
    reset_epoch: int
    """The reset epoch the delivery carries once the pull is recorded."""


def plan_start(
    group: Group,
    delivery: Delivery,
    reset: Reset | None,
    committed: Committed | None,
    others: Iterable[tuple[int, int]],
    floor: Committed | None,
    now_ms: int,
) -> PlannedStart:
    """Where a member starts (see the module docstring). ``reset``: the latest reset
    targeting it; ``committed``: its committed offset (clustering: the group's);
    ``others``: the other broadcast members' (offset, last seen); ``floor``: the group's
    committed offset (broadcast). Raises OFFSET_OUT_OF_RANGE for ``none`` with nothing
    stored."""
    if reset is not None and reset.epoch > delivery.reset_epoch:
        return PlannedStart(reset.offset, reset.position, Start.RESET, reset, reset.epoch)
    c = group.config
    offset, start = start_offset(
        c.mode,
        delivered=delivery.offset,
        own=None if committed is None else committed.offset,
        others=others if c.mode is Mode.BROADCAST else (),
        floor=None if floor is None else floor.offset,
        auto_offset_reset=c.auto_offset_reset,
        now_ms=now_ms,
        expire_ms=c.broadcast_expire_ms,
    )
    position = None
    if start is Start.DELIVERED:
        position = delivery.position
    elif start is Start.COMMITTED and committed is not None:
        position = committed.position
    return PlannedStart(offset, position, start, None, delivery.reset_epoch)


def delivery_after_pull(
    current: Delivery,
    *,
    committed: int | None,
    reset_epoch: int,
    first: int | None,
    end: int,
    position: str | None,
    member: str,
    pull: str,
    now_ms: int,
) -> Delivery:
    """The delivery once a pull answered offsets ``first`` (None: nothing) up to ``end``
    (exclusive: where the next pull starts)."""
    kept = current.inflight if current.offset is not None else ()
    inflight = inflight_after_pull(
        kept, committed, first if first is not None else end, end, now_ms
    )
    return Delivery(end, position, reset_epoch, tuple(inflight), member, pull, now_ms)


def same_standing(a: Delivery, b: Delivery) -> bool:
    """Whether two deliveries stand at the same place (a pull that answered nothing
    need not write)."""
    return (a.offset, a.position, a.reset_epoch, a.inflight, a.member) == (
        b.offset,
        b.position,
        b.reset_epoch,
        b.inflight,
        b.member,
    )


def committed_at_reset(reset: Reset, now_ms: int) -> Committed:
    """What a pull that applies ``reset`` commits: its target (a rewind comes back
    here, not to the offset committed before the reset)."""
    return Committed(reset.offset, reset.position, "", now_ms, now_ms)


def started_at(delivery: Delivery) -> int | None:
    """Where a delivery's inflight records begin when nothing is committed: the first
    pull's first offset."""
    if delivery.offset is None or not delivery.inflight:
        return None
    return min(o for o, _ in delivery.inflight)


def commit_offsets(
    group_id: str,
    group: Group,
    member: str,
    offsets: Sequence[tuple[str, int, int]] | None,
    deliveries: Mapping[TopicPartition, Delivery],
    resets: Mapping[TopicPartition, Reset | None],
) -> list[tuple[TopicPartition, int | None]]:
    """The partitions a member's commit names (all assigned ones for an empty body,
    offset None: what was delivered), each checked: assigned to the member, and no
    reset targeting it that it has not pulled since (its commit would undo the reset).
    Nothing is committed unless all pass (StaleMember, 22)."""
    assigned = set(group.assigned(member))
    wanted: list[tuple[TopicPartition, int | None]]
    if offsets is None:
        wanted = [(tp, None) for tp in sorted(assigned)]
    else:
        wanted = [((t, p), o) for t, p, o in offsets]
    for tp, _ in wanted:
        if tp not in assigned:
            raise StaleMember(
                errors.IllegalGeneration(
                    f"{tp[0]}-{tp[1]} is not assigned to member {member!r} in generation "
                    f"{group.generation} of group {group_id!r}"
                )
            )
        reset = resets.get(tp)
        delivery = deliveries.get(tp) or Delivery()
        if reset is not None and reset.epoch > delivery.reset_epoch:
            raise StaleMember(
                errors.IllegalGeneration(
                    f"{tp[0]}-{tp[1]} was reset (to offset {reset.offset}) after this "
                    "member's last pull: pull again before committing; a commit of an "
                    "earlier position would undo the reset"
                )
            )
    return wanted


def delivery_after_commit(delivery: Delivery, offset: int) -> Delivery | None:
    """The delivery once ``offset`` is committed (None: unchanged)."""
    if delivery.offset is None or not delivery.inflight:
        return None
    kept = inflight_after_commit(delivery.inflight, offset) if delivery.offset > offset else []
    if tuple(kept) == delivery.inflight:
        return None
    return Delivery(
        delivery.offset,
        delivery.position,
        delivery.reset_epoch,
        tuple(kept),
        delivery.member,
        delivery.pull,
        delivery.at_ms,
        delivery.version,
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
