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
never under it, and a closed reader reads nothing more.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pulsar

from kop_dedup.protocol.records import KafkaRecord
from kop_dedup.pulsar.message_ids import MessagePosition
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.tables import PulsarClient, discard
from kop_dedup.pulsar.wire import DecodedRecord

__all__ = ["PartitionReader", "Pulled", "after"]

_READ_WAIT_MS = 5_000


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


def _read_available(reader: Any, limit: int, max_bytes: int | None) -> list[_Raw]:
    """Up to ``limit`` messages already available (blocking calls; a worker thread).
    What the client holds already is taken without asking the broker; it is asked
    (``has_message_available``: a lock, maybe a round trip) only once that is empty."""
    out: list[_Raw] = []
    size = 0
    while len(out) < limit:
        try:
            msg = reader.read_next(0)  # what the client holds: no round trip, no wait
        except pulsar.Timeout:
            if not reader.has_message_available():
                break
            try:
                msg = reader.read_next(_READ_WAIT_MS)
            except pulsar.Timeout:  # said available, not delivered in time: the next read
                break
        mid = msg.message_id()
        decoded = DecodedRecord.from_message(
            msg.data(), msg.partition_key(), msg.properties(), msg.event_timestamp()
        )
        n = decoded.record.size
        out.append(
            _Raw(
                (mid.ledger_id(), mid.entry_id(), mid.batch_index()),
                decoded.record,
                n,
                msg.publish_timestamp(),
            )
        )
        size += n
        if max_bytes is not None and size >= max_bytes:
            break
    return out


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
        self.next_offset, self.next_position = offset, position
        self._client, self._positions = client, positions
        self._reader: Any = None
        self._checked = False
        self._reading = False
        self._closed = False
        self.clamped_from: int | None = None
        """Set when the first record read lay beyond the offset asked for (deleted by
        retention): the offset asked for."""

    async def _open(self) -> Any:
        if self._reader is None:
            self._reader = await self._client.create_reader(
                self.topic,
                pulsar.MessageId(-1, *self.next_position),
                start_message_id_inclusive=True,
            )
        return self._reader

    @property
    def closed(self) -> bool:
        return self._closed

    async def read(self, max_records: int, max_bytes: int | None = None) -> list[Pulled]:
        """Records available now, from the next offset (none: nothing to read yet, or the
        reader was closed)."""
        if self._closed or self._reading:
            return []
        self._reading = True
        try:
            reader = await self._open()
            loop = asyncio.get_running_loop()
            raw = await loop.run_in_executor(
                None, _read_available, reader._reader, max_records, max_bytes
            )
        finally:
            self._reading = False
            if self._closed:
                await self._discard()
        if not raw or self._closed:
            return []
        offset = self.next_offset
        if not self._checked:
            self._checked = True
            if raw[0].position != self.next_position:
                found = await self._positions.offset_of(self.topic, raw[0].position)
                if found > offset:
                    self.clamped_from = offset
                offset = found
        out = []
        for r in raw:
            out.append(Pulled(offset, r.position, r.record, r.size, r.publish_time_ms))
            offset += 1
        self.next_offset, self.next_position = offset, after(raw[-1].position)
        return out

    async def close(self) -> None:
        """Close now, or when the read running meanwhile returns (what it read is not
        returned: the caller answers nothing from a closed reader)."""
        self._closed = True
        if not self._reading:
            await self._discard()

    async def _discard(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await discard(reader)
