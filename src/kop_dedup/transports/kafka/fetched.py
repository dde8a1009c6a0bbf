"""A stored entry as the RecordBatch v2 a Fetch answers with (aiokafka's Cython builder).

One entry is one batch, at its offsets: the base offset is the entry's first record's
(the builder writes offset deltas from 0; the base offset is outside the CRC and is
set after), producer id, epoch and base sequence are the ones the records were
written with (-1 for records written without), timestamps are the records' own
(create time), or the entry's publish time for a record that has none. Batches are
not compressed (the codec a producer used is not kept) and not transactional: only
committed records reach a data topic, so a read_committed consumer needs no markers.

>>> data = encode_entry(entry)
>>> DefaultRecordBatch(data).base_offset == entry.base_offset
True
"""

from __future__ import annotations

import struct

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kop_dedup.pulsar.fetching import StoredEntry

__all__ = ["encode_entry"]

_MAGIC = 2
_NO_CODEC = 0
_NOT_TRANSACTIONAL = 0
_UNBOUNDED = (1 << 31) - 1
_BASE_OFFSET = struct.Struct(">q")


def encode_entry(entry: StoredEntry) -> bytes:
    """The entry as one RecordBatch v2 (its records at ``base_offset`` on)."""
    builder = DefaultRecordBatchBuilder(
        _MAGIC,
        _NO_CODEC,
        _NOT_TRANSACTIONAL,
        entry.producer_id,
        entry.producer_epoch,
        entry.base_sequence,
        _UNBOUNDED,
    )
    published = entry.publish_time_ms
    append = builder.append
    for delta, record in enumerate(entry.records):
        timestamp = record.timestamp
        append(
            delta,
            published if timestamp is None else timestamp,
            record.key,
            record.value,
            [(h.key, h.value) for h in record.headers] if record.headers else [],
        )
    data = builder.build()
    _BASE_OFFSET.pack_into(data, 0, entry.base_offset)
    return bytes(data)
