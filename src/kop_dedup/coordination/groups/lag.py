"""What a consumer group has left to read, counted in records, and what Pulsar sees of it.

:meth:`GroupLag.lag` answers ``GET /v1/groups/{groupId}/lag``: per partition (per
member in broadcast mode, plus the group's minimum) ``end``, ``committed``,
``pulled``, ``ready`` (end - pulled), ``inflight`` (pulled - committed), ``lag`` (end -
committed) and the age of the oldest inflight record. ``end`` is the partition's last
stable offset as the transaction log bounds it
(:meth:`~kop_dedup.coordination.transactions.stable.StableOffsets.bound`): the end,
less a committed transaction's copy still in progress, which no pull hands out yet.
Offsets come from the broker's entry index, which counts messages with no gaps (a
batched entry of n messages takes n offsets), so these differences are exact record
counts; Pulsar's own backlog counts entries. A Kafka group (JoinGroup) reports the
same per partition it has committed offsets for; the server does not see what its
members fetched, so ``pulled`` is where it committed (``inflight`` 0, ``ready`` =
``lag``).

:meth:`GroupLag.refresh` (a loop on every sidecar) computes the same numbers for the
groups whose store partition this sidecar owns and keeps them as :attr:`GroupLag.rows`
for ``/metrics``: a scrape reads memory, never the admin API.

:meth:`GroupLag.follow_cursors` (another loop, on the owner) moves one durable
subscription per group and partition, ``kop-group-<group>``, to the group's committed
offset (broadcast: the group's minimum), so Pulsar's retention keeps what the group has
not consumed and ``pulsar-admin topics stats`` shows its backlog (in entries).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Collection

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.api import LagReport, PartitionLag, UnknownGroup
from kop_dedup.coordination.groups.coordinator import GroupCoordinator
from kop_dedup.coordination.groups.state import GroupState
from kop_dedup.protocol import groups as proto
from kop_dedup.protocol.groups import LagRow, Mode, TopicPartition
from kop_dedup.pulsar import subscriptions
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.message_ids import MessagePosition, decode_message_position

__all__ = ["GroupLag", "subscription_name"]

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def subscription_name(group: str) -> str:
    """The durable Pulsar subscription that follows a group's committed offsets."""
    if _SAFE_NAME.match(group):
        return f"kop-group-{group}"
    return f"kop-group-{hashlib.sha1(group.encode()).hexdigest()[:16]}"  # noqa: S324 - a name


class GroupLag:
    def __init__(self, groups: GroupCoordinator, admin: PulsarAdmin) -> None:
        self._groups, self._admin = groups, admin
        self.rows: list[LagRow] = []
        """The latest refresh: groups whose store partition this sidecar owns."""
        self.refreshed_ms: int | None = None
        self._cursor_at: dict[tuple[str, TopicPartition], int] = {}
        """Where each followed subscription was last moved (groups of owned partitions
        only: rebuilt each round)."""

    def followed(self, groups: Collection[str] | None = None) -> int:
        """Subscriptions this sidecar follows (bounded state), of ``groups`` if given."""
        if groups is None:
            return len(self._cursor_at)
        return sum(1 for group, _ in self._cursor_at if group in groups)

    # -- the numbers --------------------------------------------------------------------------

    async def lag(
        self, group: str, ends: dict[TopicPartition, int] | None = None, *, read: bool = True
    ) -> LagReport:
        """The group's numbers (see the module docstring); UnknownGroup when nothing of
        it is stored. ``ends``: end offsets already known (a refresh shares them);
        ``read`` False: the caller caught up with the group's store partition already."""
        if read:
            await self._groups.read(group)
        ends = {} if ends is None else ends
        state = self._groups.state(group)
        kafka = self._groups.classic.group(group)  # a Kafka group: its committed offsets
        if state.group is None and not state.offsets and kafka is None:
            raise UnknownGroup(f"no group {group!r}")
        now = now_ms()
        members = [] if state.group is None else sorted(state.group.members)
        rows: list[PartitionLag] = []
        missing = [tp for tp in state.partitions() if tp not in ends]
        if missing:  # the last stable offsets: what the group can read
            ends.update(await self._groups.stable.bounds(missing))
        for tp in state.partitions():
            end = ends[tp]
            owners = [""] if state.mode is Mode.CLUSTERING else members
            rows.extend(self._row(state, owner, tp, end, now) for owner in owners)
            if state.mode is Mode.BROADCAST and state.group is not None:
                minimum = proto.broadcast_minimum(
                    state.broadcast_others("", tp), now, state.group.config.broadcast_expire_ms
                )
                rows.append(
                    PartitionLag(
                        tp[0],
                        tp[1],
                        None,
                        end,
                        lag=None if minimum is None else max(end - minimum, 0),
                        minimum=minimum,
                        is_minimum=True,
                    )
                )
        return LagReport(
            group,
            state.mode.value,
            state.group.generation if state.group else kafka.generation if kafka else 0,
            tuple(rows),
        )

    @staticmethod
    def _row(state: GroupState, owner: str, tp: TopicPartition, end: int, now: int) -> PartitionLag:
        committed = state.committed(owner, tp)
        delivery = state.delivery(owner, tp)
        c = proto.counts(
            end,
            None if committed is None else committed.offset,
            delivery.offset,
            proto.started_at(delivery),
        )
        oldest = proto.oldest_inflight_ms(delivery.inflight, c.committed, c.pulled)
        return PartitionLag(
            tp[0],
            tp[1],
            owner if state.mode is Mode.BROADCAST else None,
            c.end,
            c.committed,
            c.pulled,
            c.ready,
            c.inflight,
            c.lag,
            None if oldest is None else max(now - oldest, 0),
        )

    async def refresh(self) -> None:
        """Recompute :attr:`rows` for the groups this sidecar owns (the gauges)."""
        ends: dict[TopicPartition, int] = {}
        rows: list[LagRow] = []
        for group in await self._groups.owned_groups():
            try:
                report = await self.lag(group, ends, read=False)
            except UnknownGroup:
                continue
            except Exception as exc:  # one group's trouble does not hide the others
                log.debug("lag of group %r: %r", group, exc)
                continue
            rows.extend(_rows(report))
        self.rows, self.refreshed_ms = rows, now_ms()

    # -- the Pulsar subscription that follows committed offsets -------------------------------

    async def follow_cursors(self) -> None:
        """On partitions this sidecar owns: move each group's durable subscription to its
        committed offset (clustering) or the group minimum (broadcast)."""
        now = now_ms()
        followed: dict[tuple[str, TopicPartition], int] = {}
        for group in await self._groups.owned_groups():
            for tp, offset, position in self._targets(self._groups.state(group), now):
                at = self._cursor_at.get((group, tp))
                if at != offset:
                    try:
                        await self._move_cursor(group, tp, offset, position)
                    except (errors.KafkaError, AdminError) as exc:
                        log.debug("subscription of group %r on %s: %r", group, tp, exc)
                        continue
                    at = offset
                followed[group, tp] = at
        self._cursor_at = followed

    async def forget(self, group: str, tps: list[TopicPartition]) -> None:
        """A group was forgotten: its subscriptions go (Pulsar keeps no backlog for it)."""
        for tp in tps:
            self._cursor_at.pop((group, tp), None)
            await subscriptions.delete_subscription(
                self._admin, self._groups.partition_topic(tp), subscription_name(group)
            )

    @staticmethod
    def _targets(
        state: GroupState, now: int
    ) -> list[tuple[TopicPartition, int, MessagePosition | None]]:
        def at(position: str | None) -> MessagePosition | None:
            return decode_message_position(position) if position else None

        if state.mode is Mode.CLUSTERING:
            return [(tp, c.offset, at(c.position)) for tp, c in sorted(state.offsets.items())]
        assert state.group is not None
        expire = state.group.config.broadcast_expire_ms
        members = state.group.members
        best: dict[TopicPartition, tuple[int, MessagePosition | None]] = {}
        for (m, tp), c in state.member_offsets.items():
            last = max(members[m].last_seen_ms if m in members else 0, c.seen_ms or 0)
            if now - last > expire:
                continue
            if tp not in best or c.offset < best[tp][0]:
                best[tp] = (c.offset, at(c.position))
        return [(tp, o, p) for tp, (o, p) in sorted(best.items())]

    async def _cursor_position(
        self, topic: str, offset: int, position: MessagePosition | None
    ) -> tuple[int, int, int]:
        """Where the subscription's cursor goes: the entry holding ``offset`` at its batch
        index, or the next entry once the offset is past the last message of one (the
        broker counts an entry with every message acknowledged in its backlog)."""
        positions = self._groups.positions
        if position is None:
            try:
                position = await positions.locate(topic, offset)
            except errors.OffsetOutOfRange:
                first, at = await positions.earliest(topic)
                position = at if offset < first else (await positions.end(topic))[1]
                if position is None:
                    raise
        ledger, entry, batch = position
        if batch > 0 and batch >= (await positions.entry(topic, ledger, entry))[1]:
            return ledger, entry + 1, -1
        return ledger, entry, batch

    async def _move_cursor(
        self, group: str, tp: TopicPartition, offset: int, position: MessagePosition | None
    ) -> None:
        topic, sub = self._groups.partition_topic(tp), subscription_name(group)
        ledger, entry, batch = await self._cursor_position(topic, offset, position)
        try:
            await subscriptions.move_subscription(
                self._admin, topic, sub, ledger, entry, max(batch, 0)
            )
        except AdminError as exc:
            if exc.status != 404:
                raise
            await subscriptions.create_subscription(self._admin, topic, sub)
            await subscriptions.move_subscription(
                self._admin, topic, sub, ledger, entry, max(batch, 0)
            )


def _rows(report: LagReport) -> list[LagRow]:
    return [
        LagRow(
            group=report.group_id,
            topic=r.topic,
            partition=r.partition,
            member=r.member,
            minimum=r.is_minimum,
            end=r.end,
            committed=r.minimum if r.is_minimum else r.committed,
            ready=r.ready,
            inflight=r.inflight,
            lag=r.lag,
            oldest_inflight_s=None if r.oldest_inflight_ms is None else r.oldest_inflight_ms / 1000,
        )
        for r in report.partitions
    ]
