"""Readers kept open between fetches, and the offsets a consumer asks for (earliest,
end, by time), for a Kafka-style fetch on Pulsar.

A consumer fetches at the offset where its last fetch ended, so the reader that served
it is kept, keyed by (partition topic, next offset), and the next fetch at that offset
takes it back: no lookup, no new reader (KoP's ``KafkaTopicConsumerManager`` did the
same). A fetch at an offset with no reader kept opens one where the offset is: at a
position learnt before (a reader closed there), or found by a binary search over the
entries (:meth:`~kop_dedup.pulsar.positions.Positions.locate`). Kept readers are
bounded (the least recently used go first) and closed when idle.

The end of a partition (Kafka's high watermark) is what a reader that found nothing
more has counted, or else asked of the broker, reused for ``end_ttl_s``; the earliest
offset still stored (the log start) for ``start_ttl_s``. Each is kept with its position,
so a reader opened at either (a fresh consumer's first fetch, right after its
ListOffsets) is placed without asking the broker again. A fetch of many partitions asks
the broker for at most ``watermark_asks_per_s`` watermarks a second (each is two admin
round trips); past that it answers the ones it knows (the end: at least what was read),
as they were at most a few seconds ago. The last stable offset is each
reader's own (:attr:`~kop_dedup.pulsar.fetching.EntryReader.stable`): a reader kept here
keeps what it knows of the copies it met.

>>> pool = ReaderPool(client, admin)
>>> reader = await pool.take(ptopic, 42)        # OFFSET_OUT_OF_RANGE outside the log
>>> entries = await reader.read(1 << 20)
>>> high, start = await pool.watermarks(ptopic, reader)
>>> pool.give(reader)                           # kept under its next offset
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from dataclasses import dataclass

from kop_dedup import errors
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.fetching import EntryReader, StoredEntry
from kop_dedup.pulsar.message_ids import MessagePosition
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["PoolLimits", "ReaderPool", "TimedOffset"]

log = logging.getLogger(__name__)

_SWEEP_EVERY_S = 1.0
_KNOWN_KEPT = 10_000
_TIME_SCAN_BYTES = 1 << 20
_TIME_SCAN_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class PoolLimits:
    max_readers: int = 1000
    """Readers kept open while no fetch uses them; the least recently used close first."""
    idle_s: float = 60.0
    """A kept reader no fetch took for this long is closed."""
    end_ttl_s: float = 1.0
    start_ttl_s: float = 10.0
    watermark_asks_per_s: float = 20.0
    """Watermarks older than their TTL asked again of the broker per second, at most, for
    the fetch answers (a fetch of 512 partitions would otherwise ask 512 ends a second,
    two admin calls each); past it a fetch answers the ones known (an end: at least what
    its reader counted). A log start never known is always asked."""


@dataclass(frozen=True, slots=True)
class _Mark:
    """A watermark: the offset, when it was learnt, and (``placed``) the position there
    as the broker answered it (None: the topic never held a message); a watermark a
    reader counted is not placed."""

    offset: int
    at: float
    position: MessagePosition | None = None
    placed: bool = False


@dataclass(frozen=True, slots=True)
class TimedOffset:
    """An offset and the timestamp of the record there (ListOffsets' answer)."""

    offset: int
    timestamp: int


def _timestamp(entry: StoredEntry, index: int) -> int:
    ts = entry.records[index].timestamp
    return entry.publish_time_ms if ts is None else ts


class ReaderPool:
    def __init__(
        self,
        client: PulsarClient,
        admin: PulsarAdmin,
        limits: PoolLimits | None = None,
        *,
        positions: Positions | None = None,
    ) -> None:
        self._client = client
        self.positions = positions or Positions(admin)
        """Shared with the group coordinator (the runtime's): what the readers learn of
        entries serves its lookups of committed offsets."""
        self.limits = limits or PoolLimits()
        self._kept: collections.OrderedDict[tuple[str, int], EntryReader] = (
            collections.OrderedDict()
        )
        self._known: collections.OrderedDict[tuple[str, int], MessagePosition] = (
            collections.OrderedDict()
        )
        """Positions of offsets learnt from readers (an offset's position never changes)."""
        self._ends: dict[str, _Mark] = {}
        self._starts: dict[str, _Mark] = {}
        self._asks = self.limits.watermark_asks_per_s
        """The watermark asks the budget allows now (a token bucket, refilled per second)."""
        self._asks_at = time.monotonic()
        self._refreshing: dict[tuple[str, str], asyncio.Future[int]] = {}
        """Watermarks being asked again in the background."""
        self._closing: set[asyncio.Task[None]] = set()
        self._live: weakref.WeakSet[EntryReader] = weakref.WeakSet()
        """Every reader opened and not closed yet, kept or in a fetch."""
        self._swept = time.monotonic()
        self._closed = False
        self.opened = 0
        self.reused = 0
        self.located = 0

    @property
    def kept(self) -> int:
        return len(self._kept)

    # -- readers --------------------------------------------------------------------------

    async def take(self, topic: str, offset: int) -> EntryReader:
        """A reader whose next record is ``offset``: a kept one, or a new one placed there.
        OFFSET_OUT_OF_RANGE when the offset is before the earliest still stored or after
        the end."""
        self._sweep()
        floor = await self.positions.floor(topic)
        if offset < floor:  # DeleteRecords moved the log start past it
            raise errors.OffsetOutOfRange(
                f"{topic}: offset {offset} is below the log start offset {floor}"
            )
        reader = self._kept.pop((topic, offset), None)
        if reader is not None and not reader.closed:
            self.reused += 1
            return reader
        position = self._known.get((topic, offset))
        if position is None:
            position = await self._locate(topic, offset)
        return self._new(topic, offset, position)

    def _new(self, topic: str, offset: int, position: MessagePosition | None) -> EntryReader:
        reader = EntryReader(self._client, self.positions, topic, offset, position)
        self._live.add(reader)
        self.opened += 1
        return reader

    async def _locate(self, topic: str, offset: int) -> MessagePosition | None:
        """Where ``offset`` is; None when the topic never held a record (offset 0: read
        from the earliest message that will come). The earliest offset and the end the
        broker answered within their TTL place a reader at either without asking again
        (a position retention deleted meanwhile is seen by the reader's first message:
        OFFSET_OUT_OF_RANGE)."""
        now = time.monotonic()
        for mark, ttl in (
            (self._starts.get(topic), self.limits.start_ttl_s),
            (self._ends.get(topic), self.limits.end_ttl_s),
        ):
            if mark is not None and mark.placed and mark.offset == offset and now - mark.at < ttl:
                return mark.position
        first, first_at = await self.positions.earliest(topic)
        end, end_at = await self.positions.end(topic)
        now = time.monotonic()
        self._starts[topic] = _Mark(first, now, first_at, placed=True)
        counted = self._ends.get(topic)
        if counted is not None and counted.offset > end:  # a reader counted further
            self._ends[topic] = _Mark(counted.offset, now)
        else:
            self._ends[topic] = _Mark(end, now, end_at, placed=True)
        if not first <= offset <= end:
            raise errors.OffsetOutOfRange(
                f"{topic}: offset {offset} is outside {first}..{end} (the earliest offset "
                "still stored .. the next to be written)"
            )
        if end_at is None:
            return None
        if offset == end:
            return end_at
        if offset == first and first_at is not None:
            return first_at
        self.located += 1
        return await self.positions.locate(topic, offset)

    def give(self, reader: EntryReader) -> None:
        """Keep a reader for the next fetch at its next offset (or close it: closed,
        skipped records, a newer one kept there, over the bound)."""
        if self._closed or reader.closed or reader.skipped_from is not None:
            self._close(reader)
            return
        key = (reader.topic, reader.next_offset)
        position = reader.next_position
        if position is not None:
            self._learn(key, position)
        previous = self._kept.pop(key, None)
        if previous is not None and previous is not reader:
            self._close(previous)
        self._kept[key] = reader
        while len(self._kept) > self.limits.max_readers:
            self._close(self._kept.popitem(last=False)[1])

    def discard(self, reader: EntryReader) -> None:
        """Close a reader taken and not to be kept."""
        self._close(reader)

    async def forget(self, topic: str) -> None:
        """Close every reader of a Kafka topic's partitions (``topic``: the partitioned
        topic's full name), kept or in a fetch, and drop what is known of them: before
        the topic is deleted, so that no reader of it reconnects and makes the broker
        create a partition again under the name."""
        prefix = f"{topic}-partition-"
        mine = [r for r in list(self._live) if r.topic.startswith(prefix)]
        for key in [k for k in self._kept if k[0].startswith(prefix)]:
            del self._kept[key]
        for key in [k for k in self._known if k[0].startswith(prefix)]:
            del self._known[key]
        for cache in (self._ends, self._starts):
            for name in [t for t in cache if t.startswith(prefix)]:
                del cache[name]
        await asyncio.gather(*(r.close() for r in mine), return_exceptions=True)

    def _learn(self, key: tuple[str, int], position: MessagePosition) -> None:
        self._known[key] = position
        self._known.move_to_end(key)
        if len(self._known) > _KNOWN_KEPT:
            self._known.popitem(last=False)

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self._swept < _SWEEP_EVERY_S:
            return
        self._swept = now
        idle = [k for k, r in self._kept.items() if now - r.last_used > self.limits.idle_s]
        for key in idle:
            self._close(self._kept.pop(key))

    def _close(self, reader: EntryReader) -> None:
        task = asyncio.ensure_future(reader.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every kept reader (and any given back later)."""
        self._closed = True
        for task in list(self._refreshing.values()):
            task.cancel()
        while self._kept:
            self._close(self._kept.popitem()[1])
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    # -- watermarks -----------------------------------------------------------------------

    def _may_ask(self) -> bool:
        """Whether the watermark budget allows one more ask now (and take it)."""
        now = time.monotonic()
        rate = self.limits.watermark_asks_per_s
        self._asks = min(rate, self._asks + (now - self._asks_at) * rate)
        self._asks_at = now
        if self._asks < 1:
            return False
        self._asks -= 1
        return True

    async def end(self, topic: str, *, fresh: bool = False) -> int:
        """The end offset (the next to be written), asked of the broker unless known for
        less than ``end_ttl_s`` (``fresh``: always asked)."""
        known = self._ends.get(topic)
        if not fresh and known is not None and not self._stale(known, self.limits.end_ttl_s):
            return known.offset
        end, end_at = await self.positions.end(topic)
        self._ends[topic] = _Mark(end, time.monotonic(), end_at, placed=True)
        return end

    async def start(self, topic: str, *, fresh: bool = False) -> int:
        """The earliest offset still stored (the end when nothing is)."""
        known = self._starts.get(topic)
        if not fresh and known is not None and not self._stale(known, self.limits.start_ttl_s):
            return known.offset
        first, first_at = await self.positions.earliest(topic)
        self._starts[topic] = _Mark(first, time.monotonic(), first_at, placed=True)
        return first

    @staticmethod
    def _stale(mark: _Mark, ttl_s: float) -> bool:
        return time.monotonic() - mark.at >= ttl_s

    async def watermarks(
        self, topic: str, reader: EntryReader, *, many: bool = False
    ) -> tuple[int, int]:
        """(high watermark, log start offset) as of a read with ``reader``: what it counted
        when it found nothing more, else the end as known within its TTL (at least what
        it read). For a fetch of ``many`` partitions, one older than its TTL is asked
        again in the background while the watermark budget allows, and the one known
        answered meanwhile (the end: what the reader counted when none is known); a log
        start never known is asked now."""
        ends, limits = self._ends, self.limits
        if reader.drained:
            high = reader.read_offset
            ends[topic] = _Mark(high, time.monotonic())
        elif not many:
            high = max(await self.end(topic), reader.read_offset)
            return high, min(await self.start(topic), high)
        else:
            known = ends.get(topic)
            if known is None or self._stale(known, limits.end_ttl_s):
                self._refresh(topic, "end")
            high = max(0 if known is None else known.offset, reader.read_offset)
        start = self._starts.get(topic)
        if start is None:
            return high, min(await self.start(topic, fresh=True), high)
        if self._stale(start, limits.start_ttl_s):
            self._refresh(topic, "start")
        return high, min(start.offset, high)

    def _refresh(self, topic: str, which: str) -> None:
        """Ask a watermark again in the background, once at a time, within the budget."""
        key = (topic, which)
        if key in self._refreshing or self._closed or not self._may_ask():
            return
        asked = self.end(topic, fresh=True) if which == "end" else self.start(topic, fresh=True)
        task = self._refreshing[key] = asyncio.ensure_future(asked)

        def done(t: asyncio.Future[int]) -> None:
            self._refreshing.pop(key, None)
            if not t.cancelled() and t.exception() is not None:
                log.debug("watermark %s of %s not read: %r", which, topic, t.exception())

        task.add_done_callback(done)

    # -- offsets by time ------------------------------------------------------------------

    async def at_time(self, topic: str, timestamp_ms: int) -> TimedOffset | None:
        """The first record whose timestamp is at or after ``timestamp_ms``, None when no
        record is that late. Entries are found by publish time (the broker's), then read
        forward to the first record whose own timestamp is that late: a record is
        published after it is made, so it is never before that entry (clocks in sync)."""
        offset, position, clamped = await self.positions.at_time(topic, timestamp_ms)
        if clamped == "end" or position is None:
            return None
        reader = self._new(topic, offset, position)
        try:
            for _ in range(_TIME_SCAN_ENTRIES):
                entries = await reader.read(_TIME_SCAN_BYTES)
                if not entries:
                    break
                for n, entry in enumerate(entries):
                    for i in range(len(entry.records)):
                        if _timestamp(entry, i) >= timestamp_ms:
                            found = TimedOffset(entry.base_offset + i, _timestamp(entry, i))
                            reader.unread([entry.starting_at(i), *entries[n + 1 :]])
                            return found
                if reader.drained or reader.skipped_from is not None:
                    break
            return None
        finally:
            self.give(reader)

    async def max_timestamp(self, topic: str) -> TimedOffset | None:
        """The record with the greatest timestamp of the last entry (ListOffsets -3: the
        records of a partition are stored in publish order); None when it is empty."""
        end, after_last = await self.positions.end(topic)
        if after_last is None or after_last[2] <= 0:
            return None
        ledger, entry, count = after_last
        reader = self._new(topic, end - count, (ledger, entry, 0))
        try:
            entries = await reader.read(1)
        finally:
            self.give(reader)
        best: TimedOffset | None = None
        for stored in entries[:1]:
            for i in range(len(stored.records)):
                ts = _timestamp(stored, i)
                if best is None or ts > best.timestamp:
                    best = TimedOffset(stored.base_offset + i, ts)
        return best
