"""Reading a topic's entries between two positions, back as the Kafka batches they carry.

A position here is a :data:`~kop_dedup.pulsar.message_ids.EntryPosition`
``(ledger id, entry id)``: the broker's order of entries within a topic. Positions
travel as ``"<ledger>:<entry>"`` strings (``message_ids.encode_entry_position``).

One Kafka batch is one Pulsar batch entry (see producers.py), so the records of one
entry, in batch-index order, are one :class:`StoredBatch`; a journal entry is one
message holding the whole batch (see wire.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulsar

from kop_dedup import errors
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.pulsar.message_ids import EntryPosition
from kop_dedup.pulsar.tables import Discards, PulsarClient, discard
from kop_dedup.pulsar.wire import (
    PROP_ENTRY_FORMAT,
    PROP_SEQUENCE,
    WHOLE_BATCH,
    DecodedRecord,
    decode_whole,
)

__all__ = ["PROP_BARRIER", "RangeNotReached", "StoredBatch", "read_batches"]

PROP_BARRIER = "kafka.txn.barrier"
"""On a journal's barrier: an empty message whose position ends a range read (its
value: the sidecar that wrote it). No reader ever takes it for a batch: it carries no
producer id or transaction."""

_READ_WAIT_MS = 10_000
_GIVEN_UP = Discards()
"""Range readers whose read was cut short, closed once their thread's read returns."""
_TAIL_WAIT_MS = 100


class RangeNotReached(errors.RequestTimedOut):
    """A range read found nothing more before its end (the entries may be gone, or the
    broker slow): nothing is known of the rest of the range."""


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """The records of one entry, as a Kafka batch, with the entry's position and the
    properties of its first record (what every record of the batch shares)."""

    position: EntryPosition
    batch: KafkaBatch
    properties: Mapping[str, str]


def _next(reader: Any, reached: EntryPosition | None, upto: EntryPosition) -> Any:
    """The next message; None once in the last entry nothing more comes at once (the
    rest of a batch entry's messages are received with its first)."""
    if reached is None or reached < upto:
        return reader.read_next(_READ_WAIT_MS)  # a Timeout raises: the caller retries
    try:
        return reader.read_next(_TAIL_WAIT_MS)
    except pulsar.Timeout:
        return None


def _scan(
    reader: Any,
    after: EntryPosition | None,
    upto: EntryPosition,
    select: Callable[[Mapping[str, str]], bool],
    topic_name: str,
    partition: int,
) -> list[StoredBatch]:
    """The picked batches after ``after`` up to ``upto`` (blocking calls: run on a worker
    thread; one loop hop for the whole range instead of two per message).

    Read by position until ``upto``, never ended by the reader's "no more messages":
    that answer compares with the broker's last message id, which after a broker
    restart or a rollover names an empty ledger (entry -1), and then is "no more" over
    a range full of entries: a journal read would copy part of a transaction, a look
    for earlier copies would copy one again. A read that cannot reach ``upto`` raises
    (a Timeout: the caller retries). The entry at ``upto`` is read to its last message
    (a batch entry's messages arrive together), unless it is one message (a whole-batch
    journal entry, a barrier)."""
    whole: dict[EntryPosition, StoredBatch] = {}
    groups: dict[EntryPosition, list[tuple[DecodedRecord, Mapping[str, str]]]] = {}
    if after is not None and upto <= after:
        return []
    reached: EntryPosition | None = None
    while (msg := _next(reader, reached, upto)) is not None:
        mid = msg.message_id()
        position = reached = (mid.ledger_id(), mid.entry_id())
        if position > upto:
            break
        if after is not None and position <= after:
            continue
        properties = msg.properties()
        one = properties.get(PROP_ENTRY_FORMAT) == WHOLE_BATCH  # one message per entry
        if one and select(properties):
            whole[position] = StoredBatch(position, decode_whole(msg.data()), properties)
        elif not one and select(properties):  # a barrier is never picked
            record = DecodedRecord.from_message(
                msg.data(), msg.partition_key(), properties, msg.event_timestamp()
            )
            groups.setdefault(position, []).append((record, properties))
        if position == upto and (one or PROP_BARRIER in properties):
            break
    out = list(whole.values())
    for position, items in groups.items():
        first, last = items[0], items[-1]
        head = first[0]
        out.append(
            StoredBatch(
                position,
                KafkaBatch(
                    topic_name,
                    partition,
                    head.producer_id,
                    head.epoch,
                    int(first[1][PROP_SEQUENCE]),
                    int(last[1][PROP_SEQUENCE]),
                    tuple(r.record for r, _ in items),
                ),
                first[1],
            )
        )
    out.sort(key=lambda b: b.position)
    return out


async def read_batches(
    client: PulsarClient,
    topic: str,
    *,
    after: EntryPosition | None,
    upto: EntryPosition,
    topic_name: str,
    partition: int,
    select: Callable[[Mapping[str, str]], bool],
) -> list[StoredBatch]:
    """The batches stored in ``topic`` after ``after`` (None: from the first entry) and up
    to ``upto`` (inclusive) whose records ``select`` (by their properties) picks, in
    topic order, as batches of the Kafka topic ``topic_name`` / ``partition``: a batch
    entry's records, or a whole batch in one message (a journal entry).

    ``upto`` must be a real entry (a receipt's position): an end with entry -1 ("before
    ledger N", what a broker lookup answers for a ledger still empty) cannot be read to,
    and is refused (ValueError). A range the reader cannot reach the end of raises
    :class:`RangeNotReached` (retriable): a read never ends on the client's "no more
    messages".

    The range is read with the client's blocking calls on a worker thread (``select``
    runs there: it must only look at the properties)."""
    if upto[1] < 0:
        raise ValueError(f"a range read needs a real entry as its end, not {upto}")
    start = (
        pulsar.MessageId.earliest
        if after is None
        else pulsar.MessageId(ledger_id=after[0], entry_id=after[1])
    )
    reader = await client.create_reader(topic, start, start_message_id_inclusive=False)
    thread: asyncio.Future[list[StoredBatch]] | None = None
    try:
        thread = asyncio.get_running_loop().run_in_executor(
            None, _scan, reader._reader, after, upto, select, topic_name, partition
        )
        return await asyncio.shield(thread)
    except pulsar.Timeout as exc:
        raise RangeNotReached(f"{topic} could not be read to {upto[0]}:{upto[1]}") from exc
    finally:
        if thread is None or thread.done():
            await discard(reader)
        else:  # cut short, the thread reads on: closed once it returns, never under it
            _GIVEN_UP.later(reader, thread)
