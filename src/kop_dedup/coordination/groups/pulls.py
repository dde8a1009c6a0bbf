"""Pulls of the group coordinator: plan, read, record, answer.

A pull is planned as the owner of the group's store partition (where each assigned
partition stands, resets applied), reads outside the lock (long poll), and records the
new delivery position as the owner again, after checking nothing moved meanwhile (a
rebalance, a reset, another pull of the member): only then are the records answered.
When something moved, nothing is answered from that read and the pull is planned
again (within its wait), so a pull that says a reset was applied holds nothing from
before the reset. A pull that applies a reset commits the reset's target in the same
record (:func:`~kop_dedup.protocol.groups.committed_at_reset`).

Between its record and its answer a pull is *answering*: an empty-body commit of the
same member through this sidecar meanwhile commits only what earlier pulls answered
(:meth:`Pulls.answered`). A commit through another sidecar cannot know; it names the
pull it committed (its token), and a pull whose client went away puts its delivery
back and, if such a commit took it, the committed offset too: what was never answered
is never left committed.

Offsets are Kafka-style integers from the broker's entry index
(:mod:`kop_dedup.pulsar.positions`); each is kept with its Pulsar position when known,
so a pull starts reading without a lookup.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.access import CoordinatorAccess
from kop_dedup.coordination.groups.api import AppliedReset, Clamped, PullResult
from kop_dedup.coordination.groups.locks import MemberLocks
from kop_dedup.coordination.groups.stable import settle
from kop_dedup.coordination.groups.store import key
from kop_dedup.protocol.groups import (
    Committed,
    Delivery,
    Group,
    Mode,
    Reset,
    Start,
    TopicPartition,
    committed_at_reset,
    delivery_after_pull,
    plan_start,
    same_standing,
)
from kop_dedup.pulsar.message_ids import (
    MessagePosition,
    decode_message_position,
    encode_message_position,
)
from kop_dedup.pulsar.reading import Pulled, after

__all__ = ["Pulls"]

log = logging.getLogger(__name__)

_POLL_S = 0.02
_PULL_ATTEMPTS = 3
"""Plans of one pull when the group keeps moving under it; then it answers nothing."""
_EMPTY_POLL_S = 0.1
"""How often a long poll on partitions that are all still empty plans again."""


async def _present() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class _Plan:
    tp: TopicPartition
    offset: int
    position: MessagePosition | None
    reset_epoch: int
    """The epoch the delivery carries once recorded."""
    version: int
    """The delivery doc's version when planned (0: none): a pull that finds it moved
    since answers nothing."""
    reset_seen: int
    """The epoch of the latest reset targeting the member when planned: a reset that
    lands meanwhile makes the pull plan again."""
    start: Start
    reset: Reset | None
    clamped: Clamped | None = None


@dataclass(frozen=True, slots=True)
class _Written:
    """A delivery a pull recorded: its key, the delivery before, the pull's token and
    where its answer starts (what was answered before it)."""

    key: str
    before: Delivery
    pull: str
    start: int
    committed_key: str


_Answer = tuple[list[_Plan], Group, dict[TopicPartition, list[Pulled]]]
Topics = Callable[[list[str]], Awaitable[None]]


class Pulls:
    """The pulls of one coordinator (see the module docstring)."""

    def __init__(self, groups: CoordinatorAccess) -> None:
        self._groups = groups
        self.locks = MemberLocks()
        self.in_flight = 0
        self.stopping = False
        """Set at shutdown: long polls answer what they have at once."""
        self._answering: dict[tuple[str, str, str], tuple[str, Delivery]] = {}
        """(group, delivery key, member) -> (token, delivery before) of pulls recorded
        here and not answered yet."""

    def answered(
        self, group_id: str, owner: str, tp: TopicPartition, delivery: Delivery
    ) -> tuple[int, str | None, str | None] | None:
        """What an empty-body commit takes on a partition: (offset, position, token of
        the pull it comes from) of what was answered; None when nothing was."""
        k = key("d", group_id, owner, tp[0], tp[1])
        answering = [v for (g, dk, _), v in self._answering.items() if g == group_id and dk == k]
        if answering and answering[0][0] == delivery.pull:
            delivery = answering[0][1]  # recorded here, not answered yet: what was before
        if delivery.offset is None:
            return None
        return delivery.offset, delivery.position, delivery.pull

    async def pull(
        self,
        group_id: str,
        member: str,
        *,
        max_records: int,
        max_bytes: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[bool]] | None = None,
        may_read: Topics | None = None,
    ) -> PullResult:
        """Up to ``max_records`` records from the member's positions, waiting up to
        ``wait_ms`` (at most half the group's session) for some to arrive (``gone``:
        the client went away: nothing is answered, nothing moves). ``may_read`` is
        asked about the topics of each plan before they are read (it raises to refuse:
        nothing read, nothing moves), from the group as loaded here, never skipped."""
        self.in_flight += 1
        try:
            async with self.locks.hold(group_id, member):
                answered = await self._pull(
                    group_id, member, max_records, max_bytes, wait_ms, gone or _present, may_read
                )
        finally:
            self.in_flight -= 1
        if isinstance(answered, PullResult):
            return answered
        plans, group, records = answered
        result = PullResult(
            [(plan.tp, r) for plan in plans for r in records.get(plan.tp, [])],
            group.generation,
            list(group.assigned(member)),
            [
                AppliedReset(p.tp[0], p.tp[1], p.reset.offset, p.reset.epoch, p.reset.to)
                for p in plans
                if p.reset is not None
            ],
        )
        for plan in plans:
            got = records.get(plan.tp)
            result.next_offsets[plan.tp] = got[-1].offset + 1 if got else plan.offset
            if plan.clamped is not None:
                result.clamped.append(plan.clamped)
            reader = self._groups.readers.current(group_id, member, plan.tp)
            if reader is not None and reader.clamped_from is not None and got:
                result.clamped.append(
                    Clamped(plan.tp[0], plan.tp[1], reader.clamped_from, got[0].offset)
                )
                reader.clamped_from = None
        return result

    async def _pull(
        self,
        group_id: str,
        member: str,
        max_records: int,
        max_bytes: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[bool]],
        may_read: Topics | None,
    ) -> PullResult | _Answer:
        """Plan, read, record (under the member's lock); an empty PullResult when nothing
        is to be answered."""
        try:
            return await self._plan_read_record(
                group_id, member, max_records, max_bytes, wait_ms, gone, may_read
            )
        except BaseException:
            if any(k[0] == group_id and k[2] == member for k in self._answering):
                # recorded and neither answered nor put back (cancelled by a stop, or
                # the store failed): the partition must not be handed over as clean
                self._groups.store.unclean(self._groups.store.partition_of(group_id))
            raise
        finally:  # answered, or not: no longer answering
            for k in [k for k in self._answering if k[0] == group_id and k[2] == member]:
                del self._answering[k]

    async def _plan_read_record(
        self,
        group_id: str,
        member: str,
        max_records: int,
        max_bytes: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[bool]],
        may_read: Topics | None,
    ) -> PullResult | _Answer:
        store = self._groups.store
        began = time.monotonic()
        attempts = 0
        while attempts < _PULL_ATTEMPTS:
            plans, group = await store.owned(group_id, lambda p: self._plan(p, group_id, member))
            if may_read is not None:
                await may_read(list(dict.fromkeys(plan.tp[0] for plan in plans)))
            deadline = began + min(wait_ms, group.config.session_timeout_ms // 2) / 1000
            records = await self._read(
                group_id, member, group, plans, max_records, max_bytes, deadline, gone
            )
            if await gone():
                self._rewind(group_id, member, plans)
                return PullResult([], group.generation, list(group.assigned(member)))
            if (
                plans
                and all(plan.position is None for plan in plans)
                and time.monotonic() < deadline
                and not self.stopping
                and not any(plan.reset for plan in plans)
            ):
                # every partition is still empty (no position to read from): the long
                # poll waits for a first record by planning again
                await asyncio.sleep(min(_EMPTY_POLL_S, max(0.0, deadline - time.monotonic())))
                continue
            attempts += 1
            written = await store.owned(
                group_id,
                functools.partial(
                    self._record,
                    group_id=group_id,
                    member=member,
                    planned=group,
                    plans=plans,
                    records=records,
                ),
                caught_up=True,  # by the plan: a takeover since fails the record's write
            )
            if written is not None:
                break
            # the group moved meanwhile (a rebalance, a reset, another pull): what was
            # read is not answered; plan again from where the member now stands
            self._rewind(group_id, member, plans)
        else:
            latest = self._groups.group(group_id) or group
            return PullResult([], latest.generation, list(latest.assigned(member)))
        if self._groups.settings.answer_delay_s:
            await asyncio.sleep(self._groups.settings.answer_delay_s)
        if written and await gone():
            # recorded, but the client is gone: put the deliveries back as they were,
            # so that what it was not answered stays ready
            await store.owned(group_id, lambda p: self._unrecord(p, written))
            self._rewind(group_id, member, plans)
            return PullResult([], group.generation, list(group.assigned(member)))
        return plans, group, records

    async def _plan(self, p: int, group_id: str, member: str) -> tuple[list[_Plan], Group]:
        groups = self._groups
        group = await groups.seen(p, group_id, member)
        owner = group.owner(member)
        now = now_ms()
        state = groups.state(group_id) if group.mode is Mode.BROADCAST else None
        plans = []
        for tp in group.assigned(member):
            delivery = groups.delivery(group_id, owner, tp)
            reset = groups.resets_of(group_id, tp).for_member(member)
            planned = plan_start(
                group,
                delivery,
                reset,
                groups.committed(group_id, group.mode, member, tp),
                () if state is None else state.broadcast_others(member, tp),
                Committed.from_doc(groups.store.doc(group_id, "o", tp[0], tp[1])),
                now,
            )
            position = decode_message_position(planned.position) if planned.position else None
            clamped = None
            if position is None:
                offset, position, was_clamped = await self._resolve(
                    tp, planned.start, planned.offset
                )
                if was_clamped:
                    clamped = Clamped(tp[0], tp[1], planned.offset, offset)
            else:
                assert planned.offset is not None  # a position is always kept with its offset
                offset = planned.offset
                topic = groups.partition_topic(tp)
                if offset < await groups.positions.floor(topic):  # DeleteRecords passed it
                    offset, position, _ = await self._resolve(tp, planned.start, offset)
                    clamped = Clamped(tp[0], tp[1], planned.offset, offset)
            plans.append(
                _Plan(
                    tp,
                    offset,
                    position,
                    planned.reset_epoch,
                    delivery.version,
                    0 if reset is None else reset.epoch,
                    planned.start,
                    planned.reset,
                    clamped,
                )
            )
        return plans, group

    async def _resolve(
        self, tp: TopicPartition, start: Start, offset: int | None
    ) -> tuple[int, MessagePosition | None, bool]:
        """(offset, position, clamped) for a planned start."""
        positions = self._groups.positions
        topic = self._groups.partition_topic(tp)
        if offset is None:  # EARLIEST or LATEST (the last stable offset)
            if start is Start.LATEST:
                found, at = await self._groups.stable.exact_at(*tp)
            else:
                found, at = await positions.earliest(topic)
            return found, at, False
        try:
            return offset, await positions.locate(topic, offset), False
        except errors.OffsetOutOfRange:
            first, at = await positions.earliest(topic)
            if offset < first:  # deleted by retention: clamped to the earliest still there
                return first, at, True
            end, at = await positions.end(topic)
            return end, at, True

    def _moved(self, group_id: str, member: str, planned: Group, plans: list[_Plan]) -> bool:
        """Whether this sidecar has seen the group move since the plan (a rebalance or a
        reset made here): a long poll stops waiting then. The owner's check when
        recording is the one that counts."""
        doc = self._groups.store.doc(group_id, "g")  # every 20 ms of a long poll: not parsed
        if doc is None or int(doc["generation"]) != planned.generation:
            return True
        return any(self._reset_seen(group_id, member, plan.tp) != plan.reset_seen for plan in plans)

    def _reset_seen(self, group_id: str, member: str, tp: TopicPartition) -> int:
        reset = self._groups.resets_of(group_id, tp).for_member(member)
        return 0 if reset is None else reset.epoch

    async def _read(
        self,
        group_id: str,
        member: str,
        planned: Group,
        plans: list[_Plan],
        max_records: int,
        max_bytes: int | None,
        deadline: float,
        gone: Callable[[], Awaitable[bool]],
    ) -> dict[TopicPartition, list[Pulled]]:
        groups = self._groups
        readers = [
            (
                plan,
                groups.readers.reader(
                    group_id,
                    member,
                    plan.tp,
                    groups.partition_topic(plan.tp),
                    plan.offset,
                    plan.position,
                ),
            )
            for plan in plans
            if plan.position is not None
        ]
        out: dict[TopicPartition, list[Pulled]] = {}
        asked: set[TopicPartition] = set()
        with groups.readers.using(group_id, member, [p.tp for p, _ in readers]):  # kept meanwhile
            while True:
                left = max_records - sum(len(v) for v in out.values())
                budget = max_bytes
                for plan, reader in readers:
                    if left <= 0:
                        break
                    got = await reader.read(left, budget)
                    if got:
                        out.setdefault(plan.tp, []).extend(got)
                        left -= len(got)
                        if budget is not None:
                            budget -= sum(r.size for r in got)
                            if budget <= 0:
                                left = 0
                if out or time.monotonic() >= deadline or not readers or self.stopping:
                    return out
                if self._moved(group_id, member, planned, plans) or await gone():
                    return out
                if not await settle(self._groups.stable, [(p.tp, r) for p, r in readers], asked):
                    await asyncio.sleep(_POLL_S)

    def _rewind(self, group_id: str, member: str, plans: list[_Plan]) -> None:
        """Records read but not answered: the readers go (the next pull reads again)."""
        for plan in plans:
            self._groups.readers.drop(group_id, member, plan.tp)

    async def _record(
        self,
        p: int,
        *,
        group_id: str,
        member: str,
        planned: Group,
        plans: list[_Plan],
        records: dict[TopicPartition, list[Pulled]],
    ) -> list[_Written] | None:
        """Store where deliveries now stand, unless the group moved since the plan (then
        None); the deliveries written."""
        groups = self._groups
        group = groups.group(group_id)
        if group is None or group.generation != planned.generation or member not in group.members:
            return None
        owner = group.owner(member)
        for plan in plans:
            if groups.delivery(group_id, owner, plan.tp).version != plan.version:
                return None  # another pull of this member (through another sidecar) moved it
            if self._reset_seen(group_id, member, plan.tp) != plan.reset_seen:
                return None  # a reset landed meanwhile: the next plan applies it
        now = now_ms()
        token = uuid.uuid4().hex[:16]
        writes: list[tuple[str, dict[str, Any]]] = []
        written: list[_Written] = []
        for plan in plans:
            got = records.get(plan.tp, [])
            current = groups.delivery(group_id, owner, plan.tp)
            committed_key = groups.committed_key(group_id, group.mode, member, plan.tp)
            committed = groups.committed(group_id, group.mode, member, plan.tp)
            if plan.reset is not None:  # applied: its target is committed with it
                applied = committed_at_reset(plan.reset, now)
                writes.append((committed_key, applied.to_doc()))
                committed = applied
            end = got[-1].offset + 1 if got else plan.offset
            position = after(got[-1].position) if got else plan.position
            fresh = delivery_after_pull(
                current,
                committed=None if committed is None else committed.offset,
                reset_epoch=plan.reset_epoch,
                first=got[0].offset if got else None,
                end=end,
                position=None if position is None else encode_message_position(position),
                member=member,
                pull=token,
                now_ms=now,
            )
            if not same_standing(fresh, current):
                k = key("d", group_id, owner, plan.tp[0], plan.tp[1])
                writes.append((k, fresh.to_doc()))
                written.append(_Written(k, current, token, plan.offset, committed_key))
                # answering from now on (the lock is released before the write is stored)
                self._answering[group_id, k, member] = (token, current)
        # every partition's delivery in one round trip (a member may read many partitions)
        await groups.store.write_all(p, writes)
        return written

    async def _unrecord(self, p: int, written: list[_Written]) -> None:
        """Put deliveries back as they were before a pull that was not answered (those
        no other pull recorded since), and a committed offset an empty-body commit took
        from that pull back to what was answered before it."""
        store = self._groups.store
        for w in written:
            current = Delivery.from_doc(store.view_doc(p, w.key))
            if current.pull != w.pull:
                continue
            await store.write(p, w.key, w.before.to_doc())  # a reset it applied is pending again
            committed = Committed.from_doc(store.view_doc(p, w.committed_key))
            if committed is not None and committed.pull == w.pull:
                back = w.before.offset if w.before.offset is not None else w.start
                position = w.before.position if w.before.offset is not None else None
                await store.write(
                    p,
                    w.committed_key,
                    Committed(back, position, "", committed.commit_ms, committed.seen_ms).to_doc(),
                )
                log.info(
                    "a commit took records of a pull that was not answered (%s): its offset "
                    "goes back to %d",
                    w.committed_key,
                    back,
                )
