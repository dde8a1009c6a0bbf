"""Consumer-group state, durable in Pulsar: a partitioned, compacted log with one writer
per partition (:class:`~kop_dedup.coordination.partitions.StatePartitions`).

Everything of one group lives in one partition (by the group id), so one owner
serializes every change to a group, and any sidecar reads it (a read catches up with
the log first). Keys are JSON lists, the first element the kind:

=======================================  =============================================
``["o", group, topic, partition]``       the group's committed offset (Kafka: the next
                                         record to read), with its position when known
                                         (:mod:`.offsets`)
``["p", group, topic, partition, ...]``  offsets staged in a transaction not complete
                                         yet, a marker per transaction (``..., tid,
                                         ordinal``) and the one earlier versions kept
                                         (nothing more): a stable fetch answers 88
                                         meanwhile (:mod:`.pending`)
``["g", group]``                         configuration, generation, members, assignment
``["d", group, member, topic, part]``    where deliveries stand (member "" in
                                         clustering mode: a partition has one reader)
``["b", group, member, topic, part]``    a broadcast member's own committed offset
``["r", group, topic, partition]``       the last server-side reset (its epoch, target)
``["c", ""]``                            the partition's own: whether its last owner
                                         closed cleanly (:mod:`.closing`), the floor of
                                         versions (:mod:`.view`); group "" is no group
=======================================  =============================================

Every record carries ``v``, a version bumped by the owner that never restarts
(:mod:`.view`): a reader keeps the newest record of a key whatever order it reads the
owner's writes and the log in.

What this module gives the coordinators: :meth:`GroupStore.owned` runs a change as the
owner of a group's partition (the node the cluster names: another node's change is
refused with NOT_COORDINATOR), :meth:`~GroupStore.write` / :meth:`~GroupStore.remove`
inside it, :meth:`~GroupStore.read` and :meth:`~GroupStore.doc` /
:meth:`~GroupStore.docs` to read; and the offsets API (:mod:`.offsets`,
:mod:`.pending`) as methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.groups.closing import CLEAN, CleanClose
from kop_dedup.coordination.groups.offsets import (
    UNKNOWN_OFFSET,
    CommittedOffset,
    Offsets,
    StagedOffset,
)
from kop_dedup.coordination.groups.pending import PendingIsLive, PendingOffsets
from kop_dedup.coordination.groups.view import FLOOR_FIELD, Doc, View, key
from kop_dedup.coordination.names import validate_group_id
from kop_dedup.coordination.partitions import StatePartitions
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.tables import PulsarClient

__all__ = [
    "UNKNOWN_OFFSET",
    "CommittedOffset",
    "Doc",
    "GroupStore",
    "PendingIsLive",
    "StagedOffset",
    "key",
]

log = logging.getLogger(__name__)


class GroupStore:
    def __init__(
        self,
        client: PulsarClient,
        admin: PulsarAdmin,
        topic: str,
        partitions: int,
        *,
        pending_is_live: PendingIsLive | None = None,
        owner_of: Callable[[int], str] | None = None,
        handoff_wait_s: float = 5.0,
        max_groups: int | None = None,
    ) -> None:
        self.topic, self._admin = topic, admin
        self._max_groups = max_groups
        self._partitions_wanted = partitions
        self._view = View(partitions)
        self._clean = CleanClose(self)
        self._sending: list[set[asyncio.Future[None]]] = [set() for _ in range(partitions)]
        self._broken: dict[int, BaseException] = {}
        """Partitions where a write failed: the view may hold what is not stored, so it
        is read again (as the owner) before the next use."""
        self._epoch = [0] * partitions
        """Bumped when a partition is read again (failures of older writes are
        then known)."""
        self.offsets = Offsets(self)
        self.pending = PendingOffsets(self, pending_is_live)
        self.parts = StatePartitions(
            client,
            topic,
            partitions,
            apply=self._view.apply,
            on_acquired=self._acquired,
            on_lost=self._clean.lost,
            on_release=self._clean.mark,
            on_taken=self._taken,
            writers=lambda: admin.partition_writers(topic),
            name="consumer groups",
            owner_of=owner_of,
            handoff_wait_s=handoff_wait_s,
        )

    async def start(self) -> None:
        count = await self._admin.ensure_partitioned_topic(self.topic, self._partitions_wanted)
        if count != self._partitions_wanted:
            raise RuntimeError(
                f"{self.topic} has {count} partitions, the settings say "
                f"{self._partitions_wanted}; they must agree (a group's partition is "
                "derived from the count)"
            )

    async def close(self, timeout_s: float = 20.0) -> None:
        """Mark each owned partition closed cleanly (every pull was answered: the next
        owner need not send deliveries again) within ``timeout_s``, then close."""
        await self._clean.mark_all(timeout_s)
        await self.parts.close()

    def unclean(self, p: int) -> None:
        """A pull recorded on ``p`` was not answered and could not be put back: this
        sidecar must not mark ``p`` closed cleanly (its next owner recovers it)."""
        self._clean.unclean.add(p)

    def on_orphan(self, hook: Callable[[int], Awaitable[None]]) -> None:
        """Run ``hook(partition)`` as the new owner of a partition whose previous owner
        went away (see :mod:`.closing`)."""
        self._clean.hooks.append(hook)

    # -- ownership ------------------------------------------------------------------------

    def _taken(self, partition: int, orphan: bool) -> None:
        """This node just loaded the partition (before any change can run on it): what
        its recovery must do (:mod:`.closing`)."""
        self._clean.taken(partition, orphan=orphan)

    async def _acquired(self, partition: int, orphan: bool) -> None:  # noqa: ARG002 - taken
        """After every load of a partition by this node (a task of its own): recover it
        (:mod:`.closing`), unless a change got the lock first (it recovers before
        changing anything)."""
        async with self.parts.lock(partition):
            if partition in self._broken and self.parts.owned(partition):
                await self._reread(partition)  # its view may hold writes never stored
            if self.parts.owned(partition):
                await self._clean.recover(partition)
        await self.durable(partition)

    async def _writers_of(self, p: int) -> list[str]:
        """The writers the broker lists on ``p``; none when it cannot tell (recovering
        costs duplicates, not recovering could lose)."""
        try:
            return (await self._admin.partition_writers(self.topic)).get(p, [])
        except Exception as exc:
            log.warning("consumer groups: who writes partition %d? %r; recovering it", p, exc)
            return []

    async def _take(self, p: int, *, caught_up: bool = False, take: bool = True) -> None:
        """As partition ``p``'s owner (lock held): a partition with a failed write of ours
        is read again first, a new owner's recovery runs before returning.
        ``caught_up``: read since the request began (see :meth:`owned`). NOT_COORDINATOR
        when another node fenced this one meanwhile; ``take=False`` (a sweep): also when
        a write of ours failed (the next change settles it)."""
        if not take and p in self._broken:
            raise errors.NotCoordinator(f"consumer groups: partition {p} is not ours")
        if p in self._broken:
            await self._reread(p)
        if not await self.parts.still_owned(p, caught_up=caught_up):
            await self.parts.own(p)  # NOT_COORDINATOR or LOAD_IN_PROGRESS, with the reason
            raise errors.NotCoordinator(f"consumer groups: another node took partition {p}")
        await self._clean.recover(p)

    async def _reread(self, p: int) -> None:
        """A write of ours to ``p`` failed, so the view may hold what is not stored: read
        the partition again from its start, as its owner again (lock held). The previous
        owner went away only if the broker lists no writer on it (not even ours)."""
        live = await self._writers_of(p)
        self._epoch[p] += 1
        failure = self._broken.pop(p)
        try:
            await self.parts.retake(p, functools.partial(self._view.clear, p))
        except BaseException:
            self._broken.setdefault(p, failure)
            raise
        log.warning("consumer groups: a write to partition %d failed; read it again", p)
        self._clean.taken(p, orphan=not live)

    def _sent(self, p: int, epoch: int, future: asyncio.Future[None]) -> None:
        self._sending[p].discard(future)
        if future.cancelled() or (exc := future.exception()) is None:
            return
        if epoch == self._epoch[p]:
            self._broken.setdefault(p, exc)

    async def durable(self, p: int) -> None:
        """Return once every write made to ``p`` so far is stored; raise when one failed
        (NOT_COORDINATOR when another sidecar fenced this one), even one that failed
        before this call: a change may have built on it (the view had it)."""
        pending = list(self._sending[p])
        if pending:
            results = await asyncio.shield(asyncio.gather(*pending, return_exceptions=True))
            for r in results:  # its own failed even when a re-read cleared the mark since
                if isinstance(r, BaseException):
                    raise r
        if p in self._broken:
            raise self._broken[p]

    # -- reading --------------------------------------------------------------------------

    def partition_of(self, group: str) -> int:
        return self.parts.partition_of(group)

    def doc(self, group: str, kind: str, *rest: object) -> Doc | None:
        return self._view.get(self.partition_of(group), key(kind, group, *rest))

    def view_doc(self, partition: int, k: str) -> Doc | None:
        """A key as this sidecar has read it (``k`` from :func:`key`)."""
        return self._view.get(partition, k)

    def docs(self, group: str) -> list[tuple[list[Any], Doc]]:
        """(key as a list, doc) of every key of the group, as this sidecar has read."""
        return self._view.group(self.partition_of(group), group)

    def groups_in(self, partition: int) -> list[str]:
        return self._view.groups(partition)

    def keys_held(self) -> int:
        """Keys held in memory over every partition (for bounds and tests)."""
        return sum(self._view.size(p) for p in range(self.parts.count))

    async def read(self, group: str) -> None:
        """Catch up with every change to the group made before this call (this
        sidecar's own stored, too)."""
        await self.read_partition(self.partition_of(group))

    async def read_partition(self, p: int) -> None:
        """:meth:`read` for every group of partition ``p`` at once. A partition with a
        failed write of ours is read again first (the view may hold what was not
        stored): as its owner while it is still ours, else from its start as a reader.
        A read never takes a partition: one that did fenced the sidecar that had taken
        it, and members of one group on two sidecars ping-ponged it. Nor does it answer
        NOT_COORDINATOR for another sidecar's takeover (a read needs no ownership): a
        write of ours found fenced while reading, or a takeover that lost the race to
        re-own, turns into a read as a reader."""
        for attempt in (1, 2):
            if p in self._broken:
                async with self.parts.lock(p):
                    if p in self._broken:
                        await self._reread_broken(p)
            await self.parts.read(p)
            try:
                await self.durable(p)
            except errors.NotCoordinator:  # a write in flight was fenced: read again
                if attempt == 2:
                    raise
            else:
                return

    async def _reread_broken(self, p: int) -> None:
        if await self.parts.still_owned(p):
            # unless another node took it as we did
            with contextlib.suppress(errors.NotCoordinator, errors.CoordinatorLoadInProgress):
                await self._take(p)
                return
        await self._reread_elsewhere(p)

    async def _reread_elsewhere(self, p: int) -> None:
        """A write of ours to ``p`` failed and another sidecar owns it now (it read the
        log as it took it, our write included if stored): drop what this sidecar holds
        of ``p`` and read it again from its start, as a reader (lock held)."""
        self._epoch[p] += 1  # failures of older writes are known
        self._broken.pop(p, None)
        await self.parts.restart(p, functools.partial(self._view.clear, p))

    # -- changing -------------------------------------------------------------------------

    async def owned(
        self,
        group: str,
        change: Callable[[int], Awaitable[Any]],
        *,
        caught_up: bool = False,
        take: bool = True,
        admit: bool = True,
    ) -> Any:
        """Run ``change(partition)`` as the owner of the group's partition, under its lock.
        NOT_COORDINATOR on a node the cluster does not name its owner, or when another
        node fenced this one (nothing of the change is stored);
        COORDINATOR_LOAD_IN_PROGRESS while this node loads it.

        The catch-up that makes the view fresh runs before the lock is taken, so the
        callers waiting for the lock (the members of a group share its partition) share
        one broker round trip instead of paying one each under the lock. The view is
        then complete for a decision: this node's own writes are applied to it as they
        are made (their echoes from the log carry no newer version), and a takeover by
        another node since the catch-up fenced this writer, so the change's write fails.

        ``caught_up``: an earlier change of the same request caught up already (a pull
        records what it planned): a takeover since then fails this change's write, as
        above, so it needs no second round trip. A change that answers something must
        then write it (a pull's record does).

        ``take=False``: background work (session and retention sweeps), which runs
        ``change`` only if this node owns the partition with nothing in doubt, else
        raises NOT_COORDINATOR (the owner sweeps it). ``admit=False``: a change that
        must go through whatever the group count (a decided transaction's offsets): no
        ``MAX_GROUPS`` check (:meth:`_room_for`)."""
        p = self.partition_of(group)
        if take:
            await self.parts.ready(p)
        owner = self.parts.owned(p) and p not in self._broken
        if owner and not caught_up:
            await self.parts.read(p)
        async with self.parts.lock(p):
            await self._take(p, caught_up=owner, take=take)
            if take and admit:
                self._room_for(p, group)
            result = await change(p)
            self._keep_floor(p)
        # the lock is not held while the change's writes travel: the next change builds
        # on them (the view has them) and answers once they are stored too
        await self.durable(p)
        return result

    def _room_for(self, p: int, group: str) -> None:
        """For a group the partition does not hold, before the change writes anything:
        INVALID_GROUP_ID (24) for an id :func:`validate_group_id` refuses, and
        THROTTLING_QUOTA_EXCEEDED (89) when the partition holds its share of
        ``max_groups`` already."""
        if self._view.holds(p, group):
            return
        validate_group_id(group)
        if self._max_groups is None:
            return
        share = -(-self._max_groups // len(self._sending))
        if self._view.group_count(p) >= share:
            raise errors.ThrottlingQuotaExceeded(
                f"the consumer-groups log holds its most groups ({share} in this group's "
                "partition, KOP_DEDUP_MAX_GROUPS); a new group can start when others are "
                "deleted or expire"
            )

    async def write(self, p: int, k: str, doc: Doc) -> Doc:
        """Store a key (as the owner, inside :meth:`owned`); the version is set here.

        The view has it at once and the write is on its way (in order) when this
        returns; :meth:`owned` returns once it is stored. A write that fails marks the
        partition broken: its view is read again from the log before the next use."""
        doc = {**doc, "v": self._view.next_version(p, k)}
        self._send(p, self.parts.write(p, k, json.dumps(doc, separators=(",", ":")).encode()))
        self._view.put(p, k, doc)
        return doc

    async def write_all(self, p: int, writes: Sequence[tuple[str, Doc]]) -> list[Doc]:
        """Store several keys in one change (as the owner, inside :meth:`owned`), each
        at most once: every write is on its way when this returns, and the state writer
        batches what is sent together, so :meth:`owned` waits about one round trip to
        the broker for all of them instead of one per key. What was written, in order."""
        keys = [k for k, _ in writes]
        if len(set(keys)) != len(keys):
            raise ValueError(f"a key written twice at once: {keys}")
        return [await self.write(p, k, doc) for k, doc in writes]

    async def remove(self, p: int, k: str) -> None:
        """Remove a key (as the owner, inside :meth:`owned`)."""
        if self._view.get(p, k) is None:
            return
        self._send(p, self.parts.tombstone(p, k))
        self._view.removed(p, k)

    def _keep_floor(self, p: int) -> None:
        """After a change that removed keys: the partition's doc keeps the highest
        version removed, so that compaction (which drops removed keys) does not let a
        version restart."""
        marker = self._view.get(p, CLEAN) or {}
        floor = self._view.floor(p)
        if floor > int(marker.get(FLOOR_FIELD, 0)):
            doc = {**marker, FLOOR_FIELD: floor, "v": self._view.next_version(p, CLEAN)}
            self._send(p, self.parts.write(p, CLEAN, json.dumps(doc).encode()))
            self._view.put(p, CLEAN, doc)

    def _send(self, p: int, sending: Coroutine[Any, Any, None]) -> None:
        # a task's first step runs in creation order and hands the message to the
        # producer before it awaits: the writes reach the broker in the order made
        future = asyncio.ensure_future(sending)
        self._sending[p].add(future)
        future.add_done_callback(functools.partial(self._sent, p, self._epoch[p]))

    async def sweep(self) -> None:
        """On the partitions this sidecar owns: remove pending-offset markers whose
        transaction ended without removing them (:meth:`.pending.PendingOffsets.sweep`)."""
        for p in range(self.parts.count):
            if self.parts.owned(p):
                try:
                    await self.pending.sweep(p)
                except (errors.KafkaError, OSError) as exc:  # broker away: next round
                    log.debug("consumer groups: sweeping partition %d: %r", p, exc)

    # -- offsets (plain commits, transactions) ----------------------------------------------

    async def commit(self, group: str, offsets: Iterable[StagedOffset]) -> None:
        """:meth:`.offsets.Offsets.commit`: a plain commit of the group's offsets."""
        await self.offsets.commit(group, offsets)

    async def fetch(self, group: str, *, require_stable: bool = False) -> list[CommittedOffset]:
        """:meth:`.offsets.Offsets.fetch`."""
        return await self.offsets.fetch(group, require_stable=require_stable)

    async def mark_pending(
        self,
        group: str,
        keys: Iterable[tuple[str, int]],
        transactional_id: str,
        ordinal: int,
        *,
        member_id: str | None = None,
        generation: int | None = None,
        instance_id: str | None = None,
    ) -> None:
        """:meth:`.pending.PendingOffsets.mark`: offsets staged in a transaction, for
        ``member_id`` at ``generation`` (and ``instance_id``) when given (KIP-447:
        checked in the same change)."""
        await self.pending.mark(
            group,
            keys,
            transactional_id,
            ordinal,
            member_id=member_id,
            generation=generation,
            instance_id=instance_id,
        )

    async def commit_transaction(
        self, group: str, transactional_id: str, ordinal: int, offsets: Iterable[StagedOffset]
    ) -> list[StagedOffset]:
        """:meth:`.pending.PendingOffsets.commit_transaction`: a committed transaction's
        offsets, applied at most once (a replay is a no-op)."""
        return await self.pending.commit_transaction(group, transactional_id, ordinal, offsets)

    async def abort_transaction(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        """:meth:`.pending.PendingOffsets.abort_transaction`: an aborted transaction's
        markers removed (another transaction's stay)."""
        await self.pending.abort_transaction(group, keys, transactional_id, ordinal)
