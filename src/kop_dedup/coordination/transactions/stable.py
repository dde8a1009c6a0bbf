"""The last stable offset (LSO) of a data partition where nobody reads it in order, and
the transaction log's word on a copy a reader cannot count.

A reader of a partition knows its LSO from the data it read
(:class:`~kop_dedup.protocol.stable.StableTracker`). Three things need it without such a
reader, each answered here on every sidecar (the transaction log is readable by all):

- :meth:`StableOffsets.exact`: ListOffsets(READ_COMMITTED, latest), a group pull that
  starts at "latest", a reset to the latest. A tracker of the partition's *tail* (kept
  between calls) reads to the end and answers its LSO: the first record of the earliest
  copy not whole yet, else the end. A new tail starts at :meth:`StableOffsets.bound`,
  where no copy still in progress can have begun before; a complete copy it meets
  without its beginning is settled by the log. So the answer is never inside a
  transaction, complete or not (a reader starting there reads no transaction in part).
- :meth:`StableOffsets.bound`: a group's lag. The end first, then the log caught up:
  each transaction being copied into the partition (PrepareCommit) bounds the LSO at the
  first entry after its decision's ``data_start`` (a copy's first entry is written after
  its decision is durable, so at or after that one). No data is read; the answer is at
  or below the LSO, and may lie inside a transaction the log saw complete (no reader
  starts there).
- :meth:`StableOffsets.resolve`: a reader's copy whose count cannot close (it met it
  without its beginning, or a count that never closes): asked of the log, settled once
  the log says the transaction is complete (:func:`~kop_dedup.protocol.stable.copy_settled`).

>>> lso = await stable.exact("orders", 0)
>>> floor = await stable.bound("orders", 0)    # lso >= floor[0]
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.protocol.stable import ASK_AFTER_S, OpenCopy, StableTracker, copy_settled
from kop_dedup.protocol.transactions import Partition, Transaction, TxnState
from kop_dedup.pulsar.fetching import EntryReader
from kop_dedup.pulsar.message_ids import MessagePosition, decode_entry_position
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["StableOffsets"]

log = logging.getLogger(__name__)

_TAILS = 256
"""Tails kept (one per partition asked about lately), the least recently used closed first."""
_TAIL_IDLE_S = 120.0
_MAX_BEHIND = 50_000
"""Records a kept tail may lag behind the end; further behind, a new one starts near it."""
_FRESH_S = 5.0
"""A tail read to the end this recently is read on without asking how far behind it is."""
_DRAIN_BYTES = 1 << 20
_DRAIN_MAX = 64 << 20
"""What one answer reads at most of a tail; its LSO stands for what was read."""
_ROUNDS = 4


class StableOffsets:
    """See the module docstring."""

    def __init__(
        self,
        client: PulsarClient,
        positions: Positions,
        naming: Naming,
        state: TransactionStateManager,
    ) -> None:
        self._client, self._positions, self._naming = client, positions, naming
        self._state = state
        self._tails: collections.OrderedDict[str, EntryReader] = collections.OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.asked = 0
        """Copies asked of the log (stats)."""
        self.settled_by_log = 0

    # -- the log's word on one copy -----------------------------------------------------------

    async def settled(self, copy: OpenCopy) -> bool:
        """Whether the log, caught up now, says the copy's transaction is complete."""
        self.asked += 1
        pid, ordinal = copy.key
        if copy.transactional_id is not None:
            txn = await self._state.read(copy.transactional_id)
        else:  # no first record of a batch seen: found by its producer id
            await self._state.read_all()
            txn = next((t for t in self._state if t.producer_id == pid), None)
        return copy_settled(txn, pid, ordinal)

    async def resolve(self, tracker: StableTracker, *, after_s: float = ASK_AFTER_S) -> bool:
        """Ask the log about the copies holding ``tracker``'s LSO that the data cannot
        settle (:meth:`StableTracker.to_ask`), earliest first, and settle those it says
        are complete (until one is still being copied: it holds the LSO whatever the
        later ones are); whether any was settled."""
        any_settled = False
        for copy in tracker.to_ask(time.monotonic(), after_s):
            copy.asked = True
            if not await self.settled(copy):
                break
            tracker.settle(copy.key)
            self.settled_by_log += 1
            any_settled = True
            if copy.from_start:  # its count should have closed: data and log disagree
                log.warning(
                    "transaction %d of producer %d (%r): %s of its %s records in a "
                    "partition were read, and the log says it is complete; taken as "
                    "complete",
                    copy.key[1],
                    copy.key[0],
                    copy.transactional_id,
                    copy.seen,
                    copy.records,
                )
        return any_settled

    # -- from the log alone ---------------------------------------------------------------------

    async def bounds(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """:meth:`bound` of several partitions, with one catch-up of the log."""
        found = await self._bounds(tps)
        return {tp: at[0] for tp, at in found.items()}

    async def bound(self, topic: str, partition: int) -> tuple[int, MessagePosition | None]:
        """(offset, position) at or below the partition's LSO, from the log alone (see the
        module docstring)."""
        return (await self._bounds([(topic, partition)]))[topic, partition]

    async def _bounds(
        self, tps: list[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, MessagePosition | None]]:
        ptopics = {tp: self._naming.partition_topic(*tp) for tp in tps}
        ends = await asyncio.gather(*(self._positions.end(ptopics[tp]) for tp in tps))
        best = dict(zip(tps, ends, strict=True))
        await self._state.read_all()  # after the ends: a decision later copies after them
        wanted = set(tps)
        for txn in list(self._state):
            if txn.state is not TxnState.PREPARE_COMMIT:
                continue
            for part in txn.partitions:
                if part.key not in wanted or part.dropped:  # nothing more is copied there
                    continue
                start = None if part.data_start is None else decode_entry_position(part.data_start)
                at = await self._positions.after(ptopics[part.key], start)
                if at[0] < best[part.key][0]:
                    best[part.key] = at
        return best

    async def copying(self) -> dict[tuple[str, int], list[Transaction]]:
        """The commits being copied (PrepareCommit), by data partition, from the log
        caught up now."""
        await self._state.read_all()
        out: dict[tuple[str, int], list[Transaction]] = {}
        for txn in list(self._state):
            if txn.state is TxnState.PREPARE_COMMIT:
                for part in txn.partitions:
                    if not part.dropped:
                        out.setdefault(part.key, []).append(txn)
        return out

    async def copy_start(self, part: Partition) -> int:
        """The offset at or below which a commit's copy into ``part`` begins: the first
        entry after its decision's ``data_start`` (the bound it sets on the LSO)."""
        ptopic = self._naming.partition_topic(*part.key)
        start = None if part.data_start is None else decode_entry_position(part.data_start)
        return (await self._positions.after(ptopic, start))[0]

    # -- exact, from the partition's tail -------------------------------------------------------

    async def exact(self, topic: str, partition: int) -> int:
        """The partition's LSO now: never inside a transaction (see the module docstring)."""
        ptopic = self._naming.partition_topic(topic, partition)
        lock = self._locks.setdefault(ptopic, asyncio.Lock())
        async with lock:
            tail = await self._tail(topic, partition, ptopic)
            for _ in range(_ROUNDS):
                await self._drain(tail)
                if not await self.resolve(tail.stable):
                    break
            return tail.stable.lso

    async def exact_at(self, topic: str, partition: int) -> tuple[int, MessagePosition | None]:
        """:meth:`exact` with the LSO's position (where a reader starts to read from it)."""
        lso = await self.exact(topic, partition)
        return lso, await self._positions.locate(
            self._naming.partition_topic(topic, partition), lso
        )

    async def _tail(self, topic: str, partition: int, ptopic: str) -> EntryReader:
        self._reap()
        tail = self._tails.get(ptopic)
        if tail is not None and (tail.closed or tail.skipped_from is not None):
            await self._drop(ptopic)
            tail = None
        if tail is not None and time.monotonic() - tail.last_used > _FRESH_S:
            end, _ = await self._positions.end(ptopic)  # not asked lately: how far behind?
            if end - tail.read_offset > _MAX_BEHIND:
                await self._drop(ptopic)
                tail = None
        if tail is None:
            offset, position = await self.bound(topic, partition)
            tail = EntryReader(self._client, self._positions, ptopic, offset, position)
            self._tails[ptopic] = tail
            while len(self._tails) > _TAILS:
                await self._drop(next(iter(self._tails)))
        self._tails.move_to_end(ptopic)
        return tail

    @staticmethod
    async def _drain(tail: EntryReader) -> None:
        """Read the tail to the end (what it reads is fed to its tracker and dropped)."""
        read = 0
        while read < _DRAIN_MAX and not tail.closed and tail.skipped_from is None:
            got = await tail.read(_DRAIN_BYTES)
            if tail.drained or not got:  # the end, or nothing delivered yet: what was read
                return
            read += sum(e.size for e in got)

    def _reap(self) -> None:
        idle = time.monotonic() - _TAIL_IDLE_S
        for ptopic in [p for p, t in self._tails.items() if t.last_used < idle]:
            lock = self._locks.get(ptopic)
            if lock is not None and lock.locked():
                continue
            self._locks.pop(ptopic, None)
            task = asyncio.ensure_future(self._tails.pop(ptopic).close())
            task.add_done_callback(_retrieve)

    async def forget(self, topic: str) -> None:
        """Close the tails of a Kafka topic's partitions (``topic``: the partitioned
        topic's full name) before it is deleted: none reconnects to it."""
        prefix = f"{topic}-partition-"
        for ptopic in [p for p in self._tails if p.startswith(prefix)]:
            await self._drop(ptopic)

    async def _drop(self, ptopic: str) -> None:
        tail = self._tails.pop(ptopic, None)
        if tail is not None:
            await tail.close()

    async def close(self) -> None:
        for ptopic in list(self._tails):
            with contextlib.suppress(Exception):
                await self._drop(ptopic)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()
