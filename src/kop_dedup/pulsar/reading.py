"""Reading a partition from an offset, each record with its Kafka offset.

A :class:`PartitionReader` starts at a known (offset, position) pair and counts: the
broker's entry index has no gaps, so every message read after one of known offset has
the next offset. The first message read is checked: if it is not at the position
asked for (the reader started in a later entry, or retention deleted the start), its
offset is looked up (:class:`~kop_dedup.pulsar.positions.Positions`) and the reader
says whether records were skipped (``clamped``).

Messages are read with the client's blocking calls on a worker thread, in chunks of
what is already available (the asyncio API costs a future and two loop hops per
message). :meth:`PartitionReader.close` may be called while a read runs on that thread
(a rebalance, a member that left): the Pulsar reader is closed when the read returns,
never under it, and a closed reader reads nothing more. A read that ends any way but
done (cancelled, or a Pulsar call failing after the thread took messages) gives its
Pulsar reader up: what the thread took was never counted, and the next read starts a
new reader at the next offset's position, so a member's reader kept for its next pull
never goes on past records nobody was handed.

A pull never hands out part of a transaction that is not complete in the partition:
every record read is fed to the reader's :class:`~kop_dedup.protocol.stable.StableTracker`
and only records below its last stable offset are returned; while a copy holds it, the
reader reads on (up to ``_AHEAD_BYTES`` kept back) to see it whole, and keeps what
lies beyond for a later read. Past that bound it spills, as the Kafka fetch reader does
(:mod:`.fetching`): it reads on without keeping, each record fed to the tracker once,
and reads the part not kept again from where it stopped keeping once what it kept is
handed out.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Any

import pulsar

from kop_dedup.protocol.records import KafkaRecord
from kop_dedup.protocol.stable import CopyMark, StableTracker
from kop_dedup.pulsar.message_ids import MessagePosition, handed_out_already
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.stored import next_message, position_of
from kop_dedup.pulsar.tables import Discards, PulsarClient, discard
from kop_dedup.pulsar.wire import DecodedRecord, copy_mark

__all__ = ["PartitionReader", "Pulled", "after"]

_AHEAD_BYTES = 8 << 20
"""What a reader keeps back at most while a copy holds the last stable offset (past it
the reader spills: see the module docstring)."""
_AHEAD_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class Pulled:
    """One record read, with its offset and position."""

    offset: int
    position: MessagePosition
    record: KafkaRecord
    size: int
    publish_time_ms: int


@dataclass(slots=True)
class _Raw:
    position: MessagePosition
    record: KafkaRecord
    size: int
    publish_time_ms: int
    mark: CopyMark | None = None


def _read_available(
    reader: Any, limit: int, max_bytes: int | None, last: MessagePosition | None = None
) -> tuple[list[_Raw], bool]:
    """Up to ``limit`` messages already available (blocking calls; a worker thread), and
    whether the topic had nothing more. What the client holds already is taken without
    asking the broker; it is asked (``has_message_available``: a lock, maybe a round
    trip) only once that is empty. A message not after ``last`` (the last one taken) is
    one the client hands out again after a reconnection: dropped, never counted twice."""
    out: list[_Raw] = []
    size = 0
    drained = False
    while len(out) < limit:
        msg, drained = next_message(reader)
        if msg is None:
            break
        at = position_of(msg)
        if handed_out_already(at, last):
            continue
        last = at
        props = msg.properties()
        decoded = DecodedRecord.from_message(
            msg.data(), msg.partition_key(), props, msg.event_timestamp()
        )
        n = decoded.record.size
        out.append(
            _Raw(
                at,
                decoded.record,
                n,
                msg.publish_timestamp(),
                copy_mark(props, decoded.producer_id),
            )
        )
        size += n
        if max_bytes is not None and size >= max_bytes:
            break
    return out, drained


def after(position: MessagePosition) -> MessagePosition:
    """Where a reader starts to read what follows the message at ``position``: the next
    message of its batch, or (a message sent without batching, batch index -1; a reader
    started at any batch index of such an entry reads it again) the next entry."""
    ledger, entry, batch = position
    return (ledger, entry + 1, 0) if batch < 0 else (ledger, entry, batch + 1)


class PartitionReader:
    """A reader of one partition topic from ``offset`` at ``position``."""

    def __init__(
        self,
        client: PulsarClient,
        positions: Positions,
        topic: str,
        offset: int,
        position: MessagePosition,
    ) -> None:
        self.topic = topic
        self._read_offset, self._read_position = offset, position
        """Where reading Pulsar stands (after the records kept back)."""
        self._client, self._positions = client, positions
        self._reader: Any = None
        self._taken: MessagePosition | None = None
        """The position of the last message taken from Pulsar."""
        self._checked = False
        self._reading = False
        self._closed = False
        self._given_up = Discards()
        self._ahead: collections.deque[Pulled] = collections.deque()
        """Records read and not returned yet: beyond the last stable offset, or beyond
        what the last read asked for."""
        self._kept = 0
        """The bytes of the records kept back."""
        self.stable = StableTracker(offset)
        self._spill: tuple[int, MessagePosition] | None = None
        """(offset, position) of the first record read and not kept (the read-ahead was
        full): read again from there once what was kept is handed out."""
        self._fed_to = 0
        """Records below this offset were fed to the tracker (not fed again)."""
        self.clamped_from: int | None = None
        """Set when the first record read lay beyond the offset asked for (deleted by
        retention): the offset asked for."""

    @property
    def next_offset(self) -> int:
        """The offset of the next record :meth:`read` returns."""
        if self._ahead:
            return self._ahead[0].offset
        return self._read_offset if self._spill is None else self._spill[0]

    @property
    def next_position(self) -> MessagePosition:
        if self._ahead:
            return self._ahead[0].position
        return self._read_position if self._spill is None else self._spill[1]

    async def _open(self) -> Any:
        if self._reader is None:
            self._reader = await self._client.create_reader(
                self.topic,
                pulsar.MessageId(-1, *self._read_position),
                start_message_id_inclusive=True,
            )
        return self._reader

    @property
    def closed(self) -> bool:
        return self._closed

    async def read(self, max_records: int, max_bytes: int | None = None) -> list[Pulled]:
        """Records below the last stable offset available now, from the next offset
        (none: nothing to read yet, or the reader was closed)."""
        if self._closed or self._reading:
            return []
        await self._read_ahead(max_records, max_bytes)
        lso, size = self.stable.lso, 0
        out: list[Pulled] = []
        while self._ahead and len(out) < max_records and self._ahead[0].offset < lso:
            pulled = self._ahead.popleft()
            self._kept -= pulled.size
            out.append(pulled)
            size += pulled.size
            if max_bytes is not None and size >= max_bytes:
                break
        return out

    def _stable_ahead(self) -> int:
        lso, n = self.stable.lso, 0
        for pulled in self._ahead:
            if pulled.offset >= lso:
                break
            n += 1
        return n

    async def _read_ahead(self, max_records: int, max_bytes: int | None) -> None:
        """Read until ``max_records`` are stable or, while a copy holds the last stable
        offset, until it is whole or nothing more is there now."""
        while not self._closed:
            await self._rewind_spent()
            stable, holding = self._stable_ahead(), self.stable.holding
            if stable >= max_records and not holding:
                return
            if self._spill is not None and (stable or not holding):
                return  # what was kept is stable now: hand it out, then read again
            if holding and self._kept >= _AHEAD_BYTES and self._spill is None:
                self._spill = (self._read_offset, self._read_position)
            limit = _AHEAD_CHUNK if holding else max_records - stable
            got, drained = await self._pull(limit, _AHEAD_BYTES if holding else max_bytes)
            if self._spill is None:
                self._ahead.extend(got)
                self._kept += sum(p.size for p in got)
            if not got or drained:
                return

    async def _rewind_spent(self) -> None:
        """After a spill, once what was kept is handed out: read again from where the
        reader stopped keeping."""
        if self._spill is None or self._ahead or self._reading:
            return
        (self._read_offset, self._read_position), self._spill = self._spill, None
        self._taken = None
        await self._discard()

    async def _pull(self, limit: int, max_bytes: int | None) -> tuple[list[Pulled], bool]:
        """Records Pulsar has now after what was read, and whether it had nothing more."""
        self._reading = True
        thread: asyncio.Future[tuple[list[_Raw], bool]] | None = None
        try:
            reader = await self._open()
            token = self.stable.reading()
            thread = asyncio.get_running_loop().run_in_executor(
                None, _read_available, reader._reader, limit, max_bytes, self._taken
            )
            raw, drained = await asyncio.shield(thread)  # cancelled: the thread reads on
        except BaseException:
            self._abandon(thread)  # what the thread took is not counted: read it again
            raise
        finally:
            self._reading = False
            if self._closed:
                await self._discard()
        if self._closed:
            return [], False
        offset = await self._first_offset(raw)
        out = []
        now = time.monotonic()
        for r in raw:
            out.append(Pulled(offset, r.position, r.record, r.size, r.publish_time_ms))
            if offset >= self._fed_to:
                self.stable.feed(offset, 1, r.mark, r.position[:2], now)
                self._fed_to = offset + 1
            offset += 1
        if raw:
            self._taken = raw[-1].position
            self._read_offset, self._read_position = offset, after(raw[-1].position)
        if drained:
            self.stable.drained(token)
        return out, drained

    async def _first_offset(self, raw: list[_Raw]) -> int:
        """The offset of the first message read: counted, except for the reader's first
        (looked up when not at the position asked for)."""
        offset = self._read_offset
        if raw and not self._checked:
            if raw[0].position != self._read_position:
                try:
                    found = await self._positions.offset_of(self.topic, raw[0].position)
                except BaseException:
                    self._abandon(None)  # nothing of the read is counted: read it again
                    raise
                if found > offset:
                    self.clamped_from = offset
                    self.stable = StableTracker(found)
                offset = found
            self._checked = True
        return offset

    async def close(self) -> None:
        """Close now, or when the read running meanwhile returns (what it read is not
        returned: the caller answers nothing from a closed reader)."""
        self._closed = True
        if not self._reading:
            await self._discard()
        await self._given_up.wait()

    async def _discard(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await discard(reader)

    def _abandon(self, thread: asyncio.Future[Any] | None) -> None:
        """Give the Pulsar reader up (no await: the read may be cancelled) after a read
        that took messages from it and ended without counting them (cancelled, or a
        Pulsar call failing after the client's queue was taken); the next read opens
        another at the next position. Closed in the background once ``thread`` (the read
        still running on it, if any) is done with it."""
        reader, self._reader = self._reader, None
        if reader is not None:
            self._given_up.later(reader, thread)
