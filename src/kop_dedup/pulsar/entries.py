"""Reading a topic's entries between two positions, back as the Kafka batches they carry.

A *position* is ``(ledger id, entry id)``: the broker's order of entries within a
topic (ledger ids only grow within a topic, entry ids within a ledger). Entry -1 is
"before the first entry of that ledger", which is what the admin API's
``lastMessageId`` answers for a ledger still empty. Positions travel as
``"<ledger>:<entry>"`` strings (:func:`encode_position`).

One Kafka batch is one Pulsar batch entry (see producers.py), so the records of one
entry, in batch-index order, are one :class:`StoredBatch`.

>>> decode_position(encode_position((12, 3)))
(12, 3)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pulsar

from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.pulsar.tables import PulsarClient, discard
from kop_dedup.pulsar.wire import PROP_SEQUENCE, DecodedRecord

__all__ = ["Position", "StoredBatch", "decode_position", "encode_position", "read_batches"]

Position = tuple[int, int]

_PROBE_WAIT_S = 10.0


def encode_position(position: Position) -> str:
    return f"{position[0]}:{position[1]}"


def decode_position(text: str) -> Position:
    ledger, _, entry = text.partition(":")
    return int(ledger), int(entry)


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """The records of one entry, as a Kafka batch, with the entry's position and the
    properties of its first record (what every record of the batch shares)."""

    position: Position
    batch: KafkaBatch
    properties: Mapping[str, str]


async def read_batches(
    client: PulsarClient,
    topic: str,
    *,
    after: Position | None,
    upto: Position,
    topic_name: str,
    partition: int,
    select: Callable[[Mapping[str, str]], bool],
) -> list[StoredBatch]:
    """The batches stored in ``topic`` after ``after`` (None: from the first entry) and up
    to ``upto`` (inclusive) whose records ``select`` (by their properties) picks, in
    topic order, as batches of the Kafka topic ``topic_name`` / ``partition``."""
    start = (
        pulsar.MessageId.earliest
        if after is None
        else pulsar.MessageId(ledger_id=after[0], entry_id=after[1])
    )
    reader = await client.create_reader(topic, start, start_message_id_inclusive=False)
    groups: dict[Position, list[tuple[DecodedRecord, Mapping[str, str]]]] = {}
    try:
        while await asyncio.wait_for(reader.has_message_available(), _PROBE_WAIT_S):
            msg = await reader.read_next()
            mid = msg.message_id()
            position = (mid.ledger_id(), mid.entry_id())
            if position > upto:
                break
            if after is not None and position <= after:
                continue
            properties = msg.properties()
            if not select(properties):
                continue
            record = DecodedRecord.from_message(
                msg.data(), msg.partition_key(), properties, msg.event_timestamp()
            )
            groups.setdefault(position, []).append((record, properties))
    finally:
        await discard(reader)
    out = []
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
    return out
