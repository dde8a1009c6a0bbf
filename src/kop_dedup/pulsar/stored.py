"""The entries a partition reader takes from Pulsar, before and after their offsets
are counted (:mod:`.fetching` counts them): how a reader's messages group into
entries within a byte budget, on a worker thread.

>>> raw, held, drained = read_available(reader, None, max_bytes=1 << 20)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import _pulsar
import pulsar

from kop_dedup.protocol.records import SEQ_MODULUS, KafkaRecord
from kop_dedup.protocol.stable import CopyMark
from kop_dedup.pulsar.message_ids import MessagePosition, handed_out_already
from kop_dedup.pulsar.wire import (
    PROP_EPOCH,
    PROP_HEADERS,
    PROP_KEY_ENCODING,
    PROP_PRODUCER_ID,
    PROP_SEQUENCE,
    PROP_TIMESTAMP,
    PROP_VALUE_NULL,
    copy_mark,
    decode_record,
)

__all__ = [
    "ENTRY_OVERHEAD",
    "RECORD_OVERHEAD",
    "RawEntry",
    "StoredEntry",
    "arriving",
    "next_message",
    "position_of",
    "read_available",
]

log = logging.getLogger(__name__)

_READ_WAIT_MS = 5_000
ENTRY_OVERHEAD = 61
"""Bytes of a RecordBatch v2 header: what a batch costs besides its records."""
RECORD_OVERHEAD = 20
"""About what a record costs in a RecordBatch besides its key, value and headers."""


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """The records of one entry (or of its rest, after a read that ended inside it)."""

    base_offset: int
    position: MessagePosition
    """Where its first record is: (ledger, entry, batch index)."""
    producer_id: int
    producer_epoch: int
    base_sequence: int
    """The first record's sequence; -1 for records written without one."""
    records: tuple[KafkaRecord, ...]
    publish_time_ms: int
    size: int
    """About the bytes of the entry as a RecordBatch (payloads plus overheads)."""

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)

    def starting_at(self, index: int) -> StoredEntry:
        """The same entry from its ``index``-th record on."""
        if index <= 0:
            return self
        ledger, entry, batch = self.position
        return StoredEntry(
            self.base_offset + index,
            (ledger, entry, max(batch, 0) + index),
            self.producer_id,
            self.producer_epoch,
            -1 if self.base_sequence < 0 else (self.base_sequence + index) % SEQ_MODULUS,
            self.records[index:],
            self.publish_time_ms,
            self.size,
        )


@dataclass(slots=True)
class RawEntry:
    """An entry as read, before its offsets are known."""

    ledger: int
    entry: int
    batch_index: int
    """Its first message's (-1: a message sent without batching)."""
    producer_id: int
    epoch: int
    sequence: int
    publish_time_ms: int
    records: list[KafkaRecord]
    size: int
    mark: CopyMark | None
    """The copy its records belong to (from its first message read)."""

    @property
    def position(self) -> MessagePosition:
        return self.ledger, self.entry, self.batch_index

    @property
    def last(self) -> MessagePosition:
        """Its last message's position (a batch's messages come in batch-index order)."""
        first = self.batch_index
        return self.ledger, self.entry, first if first < 0 else first + len(self.records) - 1


def position_of(msg: Any) -> MessagePosition:
    mid = msg.message_id()
    return mid.ledger_id(), mid.entry_id(), mid.batch_index()


def next_message(reader: Any, ask: bool = True) -> tuple[Any, bool]:
    """The next message the client has (None: none now), and whether the topic had
    nothing more. What the client holds already is taken with no round trip and no
    wait; the broker is asked only once that is empty (``ask``; else None, False: not
    known whether the broker has more)."""
    try:
        return reader.read_next(0), False
    except pulsar.Timeout:
        return _after_empty(reader, ask)


def _after_empty(reader: Any, ask: bool) -> tuple[Any, bool]:
    """:func:`next_message` once the client's queue is found empty."""
    if not ask:
        return None, False
    try:
        available = reader.has_message_available()  # asks the broker when need be
    except pulsar.Timeout:
        log.warning(
            "the broker did not answer GetLastMessageId for %s within the operation "
            "timeout; with Pulsar's transactions on (transactionCoordinatorEnabled), "
            "a transaction buffer whose recovery hung holds it until the topic is "
            "unloaded (pulsar-admin topics unload)",
            reader.topic(),
        )
        raise
    if not available:
        return None, True
    try:
        return reader.read_next(_READ_WAIT_MS), False
    except pulsar.Timeout:  # said available, not delivered in time: the next read
        return None, False


def _entry(msg: Any, props: dict[str, str], at: MessagePosition) -> RawEntry:
    """The entry whose first message read is ``msg`` (at ``at``), with no record yet."""
    seq = props.get(PROP_SEQUENCE)
    pid = int(props.get(PROP_PRODUCER_ID, "-1"))
    return RawEntry(
        at[0],
        at[1],
        at[2],
        pid,
        int(props.get(PROP_EPOCH, "-1")),
        -1 if seq is None else int(seq),
        msg.publish_timestamp(),
        [],
        ENTRY_OVERHEAD,
        copy_mark(props, pid),
    )


def _unusual(msg: Any, props: dict[str, str], key: str) -> tuple[KafkaRecord, int]:
    """A message's record and about the bytes it costs in a RecordBatch, for a record
    that is not a plain one (no timestamp property, a key not in UTF-8 or empty or
    null, headers, a null value): :func:`~kop_dedup.pulsar.wire.decode_record`."""
    payload = msg.data()
    record = decode_record(
        payload,
        key,
        props,
        None if PROP_TIMESTAMP in props else msg.event_timestamp(),
    )
    n = len(payload) + RECORD_OVERHEAD
    if record.key:
        n += len(record.key)
    if record.headers:
        n += sum(len(h.key) + len(h.value or b"") for h in record.headers)
    return record, n


def read_available(  # noqa: C901 - one loop on the hot path: few calls per message
    reader: Any,
    held: Any,
    max_bytes: int,
    last: MessagePosition | None = None,
    ask: bool = True,
) -> tuple[list[RawEntry], Any, bool]:
    """Entries available now, starting with the message ``held`` back, until ``max_bytes``
    (estimated) are read and an entry is complete: (entries, the first message of the
    next entry when it was read, whether the topic had nothing more). Blocking calls: a
    worker thread. Per message, only what a record needs is asked of the client; the
    producer's id, epoch and sequence and the publish time only of an entry's first
    message, and the ledger and entry only of a message that is not the one after the
    last one taken in its batch (the client hands out a batch's messages one after
    another, and only the entry it starts at, or starts again at after a reconnection,
    can begin past index 0: its first message is then one already handed out, or the
    reader's first).

    A message that is not after the one taken before it (the first: not after ``last``,
    the last the caller counted) is one the client hands out again after a reconnection
    (:func:`~kop_dedup.pulsar.message_ids.handed_out_already`): dropped, never counted
    twice. ``ask=False``: only what the client holds, the broker never asked (nothing
    blocks: the event loop's thread may call it), and "nothing more" never said."""
    out: list[RawEntry] = []
    size = 0
    current: RawEntry | None = None
    append: Any = None
    ledger = entry = 0
    taken = follows = -2  # the batch index of the message taken last; of the one after it
    read_next, record_overhead, record = reader.read_next, RECORD_OVERHEAD, KafkaRecord
    msg = held
    while True:
        if msg is None:
            try:
                msg = read_next(0)
            except pulsar.Timeout:
                msg, drained = _after_empty(reader, ask)
                if msg is None:
                    return out, None, drained
        mid = msg.message_id()
        batch = mid.batch_index()
        if batch != follows:  # not the next message of the batch being read: where is it?
            at = mid.ledger_id(), mid.entry_id(), batch
            if current is not None:
                last = ledger, entry, taken
            if handed_out_already(at, last):
                msg, follows = None, -2
                continue
            props = msg.properties()
            if current is None or at[1] != entry or at[0] != ledger:
                if size >= max_bytes:
                    return out, msg, False
                current = _entry(msg, props, at)
                append = current.records.append
                ledger, entry = at[0], at[1]
                out.append(current)
                size += ENTRY_OVERHEAD
        else:
            props = msg.properties()
        assert current is not None
        taken, follows = batch, (batch + 1 if batch >= 0 else -2)
        key = msg.partition_key()
        ts = props.get(PROP_TIMESTAMP)
        if (
            ts is None
            or not key
            or PROP_KEY_ENCODING in props
            or PROP_HEADERS in props
            or PROP_VALUE_NULL in props
        ):
            one, n = _unusual(msg, props, key)
        else:  # a plain record: a UTF-8 key, a value, a timestamp, no headers
            payload = msg.data()
            k = key.encode()
            one = record(k, payload, (), int(ts))
            n = len(payload) + len(k) + record_overhead
        append(one)
        current.size += n
        size += n
        msg = None


def arriving(reader: Any) -> asyncio.Future[Any]:
    """The next message of a client's reader, asked asynchronously: a future that
    completes when it comes (never cancel it: the message would be lost with it; a
    failure, a reader closed while it waited, is marked seen)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    future.add_done_callback(_retrieve)

    def arrived(result: Any, msg: Any) -> None:  # the client's thread: never raise
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(_settle, future, result, msg)

    reader.read_next_async(arrived)
    return future


def _settle(future: asyncio.Future[Any], result: Any, msg: Any) -> None:
    if future.done():
        return
    if result == _pulsar.Result.Ok:
        future.set_result(msg)
    else:
        future.set_exception(pulsar.asyncio.PulsarException(result))


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
