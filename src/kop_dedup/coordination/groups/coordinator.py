"""The group coordinator (Kafka's ``GroupCoordinator``): membership, commits, and the
pulls (:mod:`.pulls`) and resets (:mod:`.resets`) it drives, with all state in the
group store, so any sidecar serves any member of any group.

A change to a group runs on the owner of its store partition (taken on demand); reads
catch up with the store first. The pure rules (assignment, where a member starts,
what a commit takes) are in :mod:`kop_dedup.protocol.groups`; this module reads the
store's docs into those types, decides, and writes them back.

What was answered but not committed comes again when the member rejoins, leaves,
misses its session or its partition moves, and when the sidecar that recorded it went
away (crash, or a stop that could not mark its partitions closed in time): the new
owner of the store partition sends deliveries back to the committed offsets
(:meth:`GroupCoordinator._recover`, run by the store's clean-close protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.api import (
    Joined,
    PartitionOffset,
    PullResult,
    ResetRequest,
    ResetStatus,
    ResolvedReset,
)
from kop_dedup.coordination.groups.classic import ClassicGroups
from kop_dedup.coordination.groups.consumer import ConsumerGroups
from kop_dedup.coordination.groups.pulls import Pulls
from kop_dedup.coordination.groups.readers import ReaderPool
from kop_dedup.coordination.groups.resets import GroupResets
from kop_dedup.coordination.groups.settings import GroupSettings, full
from kop_dedup.coordination.groups.stable import EndsOnly, StableSource
from kop_dedup.coordination.groups.state import GroupState
from kop_dedup.coordination.groups.store import GroupStore, key
from kop_dedup.protocol.groups import (
    AutoReset,
    Committed,
    Delivery,
    Group,
    GroupConfig,
    Mode,
    Resets,
    StaleMember,
    TopicPartition,
    commit_offsets,
    delivery_after_commit,
)
from kop_dedup.protocol.groups.fencing import check_txn_member
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming, validate_topic
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["GroupCoordinator", "GroupSettings", "StaleMember"]

log = logging.getLogger(__name__)


class GroupCoordinator:
    def __init__(
        self,
        store: GroupStore,
        client: PulsarClient,
        admin: PulsarAdmin,
        naming: Naming,
        *,
        partitions_of: Callable[[str], Awaitable[int]],
        settings: GroupSettings,
    ) -> None:
        self.store, self._naming = store, naming
        self.positions = Positions(admin)
        self.partitions_of = partitions_of
        self.settings = settings
        self.readers = ReaderPool(client, self.positions, idle_s=settings.reader_idle_s)
        self.stable: StableSource = EndsOnly(self.positions, naming)
        """Where a partition's last stable offset comes from (the runtime sets the
        transactions'): pulls stop there, "latest" is there, lag counts to it."""
        self._pulls = Pulls(self)
        self._resets = GroupResets(self)
        self.classic = ClassicGroups(store, settings)
        """Kafka classic groups (JoinGroup and the rest): :mod:`.classic`."""
        self.consumer = ConsumerGroups(store, settings, partitions_of, admin)
        """Consumer groups of the consumer protocol (KIP-848): :mod:`.consumer`."""
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        store.on_orphan(self._recover)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, *jobs: tuple[float, Callable[[], Awaitable[None]], str]) -> None:
        """The session sweeper and reader reaper, and ``jobs`` ((interval, job, name):
        the lag, cursor and retention loops) on their own tasks."""
        loops = [(self.settings.sweep_interval_s, self.sweep, "group-sweeper"), *jobs]
        self._tasks = [
            asyncio.create_task(self._every(interval, job), name=name)
            for interval, job, name in loops
        ]

    def begin_shutdown(self) -> None:
        """Stop waiting in long polls: they answer what they have now."""
        self._pulls.stopping = True
        self.classic.closing = True

    async def close(self) -> None:
        self._closing = True
        self.begin_shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.readers.close()

    async def _every(self, interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
        while not self._closing:
            await asyncio.sleep(interval_s)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("group job %s failed: %r", getattr(job, "__name__", job), exc)

    @property
    def pulls_in_flight(self) -> int:
        """Pulls this sidecar is serving now (long polls included)."""
        return self._pulls.in_flight

    def member_locks(self) -> int:
        """Members with a pull waiting or running here (bounded state)."""
        return len(self._pulls.locks)

    def open_readers(self) -> int:
        return len(self.readers)

    # -- reading the store --------------------------------------------------------------------

    def partition_topic(self, tp: TopicPartition) -> str:
        return self._naming.partition_topic(tp[0], tp[1])

    def group(self, group_id: str) -> Group | None:
        doc = self.store.doc(group_id, "g")
        return None if doc is None else Group.from_doc(doc)

    def delivery(self, group_id: str, owner: str, tp: TopicPartition) -> Delivery:
        return Delivery.from_doc(self.store.doc(group_id, "d", owner, tp[0], tp[1]))

    def committed(
        self, group_id: str, mode: Mode, member: str, tp: TopicPartition
    ) -> Committed | None:
        """Where ``member`` stands with no delivery: the group's committed offset in
        clustering, its own in broadcast."""
        if mode is Mode.CLUSTERING:
            return Committed.from_doc(self.store.doc(group_id, "o", tp[0], tp[1]))
        return Committed.from_doc(self.store.doc(group_id, "b", member, tp[0], tp[1]))

    def committed_key(self, group_id: str, mode: Mode, member: str, tp: TopicPartition) -> str:
        if mode is Mode.CLUSTERING:
            return key("o", group_id, tp[0], tp[1])
        return key("b", group_id, member, tp[0], tp[1])

    def resets_of(self, group_id: str, tp: TopicPartition) -> Resets:
        return Resets.from_doc(self.store.doc(group_id, "r", tp[0], tp[1]))

    def state(self, group_id: str) -> GroupState:
        """Everything stored of the group, typed, as this sidecar has read it (call
        :meth:`read` first for every change made before)."""
        return GroupState.from_docs(group_id, self.store.docs(group_id))

    async def read(self, group_id: str) -> None:
        await self.store.read(group_id)

    async def owned_groups(self) -> list[str]:
        """The groups of the store partitions this sidecar owns, each partition read
        first (once, not once per group)."""
        out: list[str] = []
        for p in range(self.store.parts.count):
            if not self.store.parts.owned(p):
                continue
            try:
                await self.store.read_partition(p)
            except Exception as exc:  # one partition's trouble does not hide the others
                log.debug("consumer groups: reading partition %d: %r", p, exc)
                continue
            if self.store.parts.owned(p):  # another sidecar's since a write of ours failed
                out += self.store.groups_in(p)
        return out

    # -- configuration ------------------------------------------------------------------------

    def _new_group(self) -> Group:
        s = self.settings
        return Group.new(
            GroupConfig(
                Mode.CLUSTERING,
                AutoReset.LATEST,
                s.default_session_timeout_ms,
                s.default_broadcast_expire_ms,
            )
        )

    async def configure(
        self,
        group_id: str,
        *,
        mode: Mode | None,
        auto_offset_reset: AutoReset | None,
        session_timeout_ms: int | None,
        broadcast_expire_ms: int | None,
    ) -> Group:
        """Create or update a group (PUT). The mode of a group with members is fixed."""

        async def change(p: int) -> Group:
            group = (self.group(group_id) or self._new_group()).configure(
                group_id,
                mode=mode,
                auto_offset_reset=auto_offset_reset,
                session_timeout_ms=session_timeout_ms,
                broadcast_expire_ms=broadcast_expire_ms,
                now_ms=now_ms(),
            )
            return await self._write_group(p, group_id, group)

        result: Group = await self.store.owned(group_id, change)
        return result

    async def describe(self, group_id: str) -> Group | None:
        await self.store.read(group_id)
        return self.group(group_id)

    async def _write_group(self, p: int, group_id: str, group: Group) -> Group:
        written = await self.store.write(p, key("g", group_id), group.to_doc())
        return replace(group, version=int(written["v"]))

    # -- membership ---------------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str | None, topics: Sequence[str]) -> Joined:
        """Join (or rejoin) a group: a client-chosen member id keeps its identity. What
        the member had been given but not committed comes again."""
        for topic in topics:
            validate_topic(topic)
        member = member_id or f"m-{hashlib.sha1(str(time.time_ns()).encode()).hexdigest()[:12]}"  # noqa: S324
        counts = {t: await self.partitions_of(t) for t in dict.fromkeys(topics)}

        async def change(p: int) -> Group:
            self._not_kafka(group_id)
            before = self.group(group_id) or self._new_group()
            if member not in before.members:
                full(group_id, len(before.members), self.settings.max_members)
            group, back = before.join(member, topics, counts, now_ms=now_ms())
            written = await self._write_group(p, group_id, group)
            await self._send_back(p, group_id, before, back)
            return written

        group = await self.store.owned(group_id, change)
        self.readers.drop(group_id, member)
        log.info("group %r: member %r joined (generation %d)", group_id, member, group.generation)
        return Joined(member, group.generation, group.assigned(member))

    async def _send_back(
        self, p: int, group_id: str, group: Group, back: Sequence[tuple[str, TopicPartition]]
    ) -> None:
        """Deliveries of these (member, partition) go back to their committed offsets
        (the reset epoch applied is kept: a reset applies once)."""
        for member, tp in back:
            owner = group.owner(member)
            delivery = self.delivery(group_id, owner, tp)
            if delivery.offset is not None:
                await self.store.write(
                    p, key("d", group_id, owner, tp[0], tp[1]), delivery.rewound().to_doc()
                )
            self.readers.drop(group_id, member, tp)

    async def heartbeat(self, group_id: str, member: str) -> Joined:
        async def change(p: int) -> Group:
            return await self.seen(p, group_id, member)

        group: Group = await self.store.owned(group_id, change)
        return Joined(member, group.generation, group.assigned(member))

    async def seen(self, p: int, group_id: str, member: str) -> Group:
        """The group, the member checked in it (StaleMember 25) and its session
        refreshed (written only when the stored time is a quarter of a session old).
        Inside a change of ``p``."""
        group = self.group(group_id)
        if group is None or member not in group.members:
            self._not_kafka(group_id)
            raise StaleMember.unknown(group_id, member)
        refreshed = group.seen(member, now_ms())
        return group if refreshed is None else await self._write_group(p, group_id, refreshed)

    async def check_member(self, group_id: str, member: str | None, generation: int | None) -> None:
        """Fencing of a transactional offset commit made for a member (Kafka's KIP-447,
        :func:`~kop_dedup.protocol.groups.fencing.check_txn_member`): StaleMember wrapping
        25 or 22. Reads the group first; changes nothing. The staging itself checks again
        in the change that writes its marker (:meth:`.store.GroupStore.mark_pending`)."""
        if member is None and generation is None:
            return
        await self.store.read(group_id)
        kafka, group = self.classic.group(group_id), self.group(group_id)
        try:
            check_txn_member(
                group_id, kafka, group, member, generation, consumer=self.consumer.group(group_id)
            )
        except errors.KafkaError as exc:
            raise StaleMember(exc) from None

    def _not_kafka(self, group_id: str) -> None:
        """StaleMember with 23 when the group is a Kafka group (client-side assignment)."""
        if self.classic.is_kafka(group_id) or self.consumer.live(group_id):
            raise StaleMember(
                errors.InconsistentGroupProtocol(
                    f"group {group_id!r} is a Kafka consumer group (client-side assignment): "
                    "the HTTP group API cannot use it; use another group id"
                )
            )

    async def leave(self, group_id: str, member: str) -> None:
        written = False

        async def change(p: int) -> None:
            nonlocal written
            before = self.group(group_id)
            if written and (before is None or member not in before.members):
                return  # a try whose write failed in doubt was stored: it left
            if before is None:
                self._not_kafka(group_id)
                raise StaleMember.unknown(group_id, member)
            group, back = before.leave(group_id, member, now_ms=now_ms())
            written = True
            await self._write_group(p, group_id, group)
            await self._send_back(p, group_id, before, back)

        await self.store.owned(group_id, change)
        self.readers.drop(group_id, member)

    async def sweep(self) -> None:
        """Members that missed their session leave (on partitions this sidecar owns);
        idle readers close."""
        now = now_ms()
        for p in range(self.store.parts.count):
            if not self.store.parts.owned(p):
                continue
            try:
                for group_id in self.store.groups_in(p):
                    group = self.group(group_id)
                    if group is not None and group.expire(now) is not None:
                        await self._expire(group_id)
                await self.classic.sweep(p)
                await self.consumer.sweep(p)
            except errors.NotCoordinator:  # moved meanwhile: its new owner sweeps it
                continue
        self.readers.reap()

    async def _expire(self, group_id: str) -> None:
        async def change(p: int) -> list[str]:
            before = self.group(group_id)
            expired = None if before is None else before.expire(now_ms())
            if before is None or expired is None:
                return []
            group, back, gone = expired
            await self._write_group(p, group_id, group)
            await self._send_back(p, group_id, before, back)
            return gone

        gone: list[str] = await self.store.owned(group_id, change, take=False)
        for member in gone:
            self.readers.drop(group_id, member)
        if gone:
            log.info("group %r: members %s missed their session; rebalanced", group_id, gone)

    async def _recover(self, p: int) -> None:
        """This sidecar took store partition ``p`` from an owner that went away, which
        may have recorded pulls it never answered: every delivery not committed goes back
        to the committed offset (the records come again; a reset applied stays applied:
        its pull committed its target)."""
        rewound = 0
        for group_id in self.store.groups_in(p):
            state = self.state(group_id)
            for (owner, tp), delivery in state.deliveries.items():
                if delivery.offset is None:
                    continue
                committed = state.committed(owner, tp)
                if committed is not None and committed.offset >= delivery.offset:
                    continue
                await self.store.write(
                    p, key("d", group_id, owner, tp[0], tp[1]), delivery.rewound().to_doc()
                )
                rewound += 1
            self.readers.drop(group_id)
        if rewound:
            log.warning(
                "consumer groups: took partition %d from an owner that went away: %d "
                "deliveries not committed go back to their committed offsets (sent again)",
                p,
                rewound,
            )

    # -- pulls and resets ---------------------------------------------------------------------

    async def pull(
        self,
        group_id: str,
        member: str,
        *,
        max_records: int,
        max_bytes: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[bool]] | None = None,
        may_read: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> PullResult:
        """:meth:`.pulls.Pulls.pull`: records from the member's positions."""
        return await self._pulls.pull(
            group_id,
            member,
            max_records=max_records,
            max_bytes=max_bytes,
            wait_ms=wait_ms,
            gone=gone,
            may_read=may_read,
        )

    async def reset(self, group_id: str, request: ResetRequest) -> list[ResolvedReset]:
        """:meth:`.resets.GroupResets.reset`: a server-side reset, stored."""
        return await self._resets.reset(group_id, request)

    async def reset_status(self, group_id: str) -> list[ResetStatus]:
        """:meth:`.resets.GroupResets.status`."""
        return await self._resets.status(group_id)

    # -- commit -------------------------------------------------------------------------------

    async def commit(
        self,
        group_id: str,
        member: str,
        offsets: Sequence[tuple[str, int, int]] | None,
        generation: int | None,
    ) -> list[PartitionOffset]:
        """Commit what was answered to the member (``offsets`` None: not a pull recorded
        and not answered yet), or the given (topic, partition, next offset) of partitions
        assigned to it."""

        async def change(p: int) -> list[PartitionOffset]:
            group = await self.seen(p, group_id, member)
            if generation is not None and generation != group.generation:
                raise StaleMember.generation(group_id, generation, group.generation)
            owner = group.owner(member)
            assigned = group.assigned(member)
            deliveries = {tp: self.delivery(group_id, owner, tp) for tp in assigned}
            resets = {tp: self.resets_of(group_id, tp).for_member(member) for tp in assigned}
            wanted = commit_offsets(group_id, group, member, offsets, deliveries, resets)
            now = now_ms()
            done, writes = [], []
            for tp, asked in wanted:
                delivery = deliveries[tp]
                pull: str | None = None
                if asked is None:
                    answered = self._pulls.answered(group_id, owner, tp, delivery)
                    if answered is None:
                        continue  # nothing answered on it: nothing to commit
                    offset, position, pull = answered
                else:
                    offset = asked
                    position = delivery.position if delivery.offset == offset else None
                stored = self.committed(group_id, group.mode, member, tp)
                if not (
                    asked is None
                    and group.mode is Mode.CLUSTERING
                    and stored is not None
                    and (stored.offset, stored.position) == (offset, position)
                ):  # else nothing was answered on it since it was committed: stored already
                    # (a broadcast member's commit is written anyway: it counts as seen)
                    committed = Committed(offset, position, "", now, now, pull)
                    writes.append(
                        (self.committed_key(group_id, group.mode, member, tp), committed.to_doc())
                    )
                after = delivery_after_commit(delivery, offset)
                if after is not None:
                    writes.append((key("d", group_id, owner, tp[0], tp[1]), after.to_doc()))
                done.append(PartitionOffset(tp[0], tp[1], offset))
            await self.store.write_all(p, writes)
            return done

        result: list[PartitionOffset] = await self.store.owned(group_id, change)
        return result
