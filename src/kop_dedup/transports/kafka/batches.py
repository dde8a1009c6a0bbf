"""RecordBatch v2 bytes -> :class:`~kop_dedup.protocol.records.KafkaBatch`, and back.

aiokafka's Cython ``DefaultRecordBatch`` checks the CRC, decompresses (gzip, snappy,
lz4, zstd through cramjam) and walks the records; this module applies the checks
Kafka's broker makes before anything is stored (``ProduceRequest.validateRecords``,
``LogValidator``), in its order, with its codes:

- not exactly one batch, magic other than 2, a control batch, a record count that
  does not match the batch's offset range, an unknown codec: INVALID_RECORD (87);
- a CRC that does not match, records that do not parse or decompress:
  CORRUPT_MESSAGE (2);
- ZSTD in a Produce below v7: UNSUPPORTED_COMPRESSION_TYPE (76);
- more records than ``max_records``: MESSAGE_TOO_LARGE (10), before decompressing;
- records that inflate past the batch limit: MESSAGE_TOO_LARGE (10), found while
  inflating (:mod:`.inflate` stops there: a bomb never inflates whole).

A batch without a producer id (-1) becomes a non-idempotent KafkaBatch (sequences
-1); otherwise ``last_sequence`` is ``base_sequence + lastOffsetDelta`` modulo 2^31,
as Kafka computes it.

>>> batch = decode_batch("orders", 0, build_batch([rec(b"v")], producer_id=7,
...                      producer_epoch=0, base_sequence=0), produce_version=9)
>>> batch.producer_id, batch.last_sequence, batch.records[0].value
(7, 0, b'v')
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kop_dedup import errors
from kop_dedup.protocol.records import (
    NO_PRODUCER_ID,
    SEQ_MODULUS,
    Header,
    KafkaBatch,
    KafkaRecord,
    rec,
)
from kop_dedup.transports.kafka.inflate import InflateBudget, inflate

__all__ = [
    "CODECS",
    "build_batch",
    "decode_batch",
    "inflate_limit",
    "is_compressed",
    "is_transactional",
    "rec",
]

_PREFIX = struct.Struct(">qiib")  # base offset, length, partition leader epoch, magic
_LOG_OVERHEAD = 12  # base offset + length
_HEADER_BYTES = 61  # a RecordBatch v2 header, up to and including the record count
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_COUNT = struct.Struct(">i")
_COUNT_AT = 57
_CODEC_MASK = 0x07
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_ZSTD = CODECS["zstd"]
_RECORD_FRAMING = 64  # length, attributes, deltas, key and value lengths, header count
_MAX_INFLATED = 100 << 20


def _one_batch(data: bytes) -> bytes:
    if len(data) < _PREFIX.size:
        raise errors.InvalidRecord(
            "Produce requests with version >= 3 must have at least one record batch"
        )
    _base, length, _epoch, magic = _PREFIX.unpack_from(data)
    if magic != 2:
        raise errors.InvalidRecord(
            f"Produce requests with version >= 3 are only allowed to contain record batches "
            f"with magic version 2; got magic {magic}"
        )
    end = _LOG_OVERHEAD + length
    if length < _HEADER_BYTES - _LOG_OVERHEAD or end > len(data):
        raise errors.InvalidRecord(
            f"the record batch says {length} bytes follow its length; {len(data) - 12} do"
        )
    rest = len(data) - end
    if rest >= _PREFIX.size:  # Kafka ignores a tail too short to be a batch
        (tail_length,) = _COUNT.unpack_from(data, end + 8)
        if 0 <= tail_length <= rest - _LOG_OVERHEAD:
            raise errors.InvalidRecord(
                "Produce requests with version >= 3 are only allowed to contain exactly one "
                "record batch per partition"
            )
    return data[:end]


_PRODUCER_ID_AT = 43  # after ... attributes, last offset delta, two timestamps
_PRODUCER_ID = struct.Struct(">q")


def producer_id_of(data: bytes) -> int | None:
    """The producer id in the records' (first) batch header; None when too short."""
    if len(data) < _PRODUCER_ID_AT + _PRODUCER_ID.size:
        return None
    return int(_PRODUCER_ID.unpack_from(data, _PRODUCER_ID_AT)[0])


def is_transactional(data: bytes) -> bool:
    """Whether the records' (first) batch is transactional; False when too short."""
    if len(data) < _ATTRIBUTES_AT + 2:
        return False
    return bool(_ATTRIBUTES.unpack_from(data, _ATTRIBUTES_AT)[0] & _TRANSACTIONAL)


def is_compressed(data: bytes) -> bool:
    """Whether the records' (first) batch names a codec; False when too short."""
    if len(data) < _ATTRIBUTES_AT + 2:
        return False
    return bool(_ATTRIBUTES.unpack_from(data, _ATTRIBUTES_AT)[0] & _CODEC_MASK)


def decode_batch(
    topic: str,
    partition: int,
    data: bytes,
    *,
    produce_version: int,
    max_records: int | None = None,
    max_bytes: int | None = None,
    budget: InflateBudget | None = None,
) -> KafkaBatch:
    """The one RecordBatch v2 of a Produce partition as a KafkaBatch, or the Kafka error
    a broker answers for it. ``max_bytes`` bounds what its compressed records may
    inflate to (:func:`inflate_limit`); None: 100 MiB; ``budget``, what the request's
    batches inflate to together."""
    raw = _one_batch(data)
    (attributes,) = _ATTRIBUTES.unpack_from(raw, _ATTRIBUTES_AT)
    batch = DefaultRecordBatch(raw)
    if not batch.validate_crc():
        raise errors.CorruptMessage(
            f"the record batch's CRC {batch.crc} does not match its bytes (corrupted on the way)"
        )
    if attributes & _CONTROL:
        raise errors.InvalidRecord("clients are not allowed to write control records")
    codec = attributes & _CODEC_MASK
    if codec > _ZSTD:
        raise errors.InvalidRecord(f"unknown compression codec id {codec}")
    if codec == _ZSTD and produce_version < 7:
        raise errors.UnsupportedCompressionType(
            f"Produce requests with version {produce_version} are not allowed to use "
            "ZStandard compression"
        )
    (count,) = _COUNT.unpack_from(raw, _COUNT_AT)
    if count != batch.last_offset_delta + 1:
        raise errors.InvalidRecord(
            f"the batch holds {count} records but its offsets span {batch.last_offset_delta + 1}"
        )
    if max_records is not None and count > max_records:
        raise errors.MessageTooLarge(f"batch has {count} records; the limit is {max_records}")
    if codec:
        batch = DefaultRecordBatch(_inflated(raw, attributes, codec, count, max_bytes, budget))
    try:
        records = tuple(
            KafkaRecord(
                key=r.key,
                value=r.value,
                headers=tuple(Header(k, v) for k, v in r.headers),
                timestamp=r.timestamp if r.timestamp >= 0 else None,
            )
            for r in batch
        )
    except Exception as exc:  # CorruptRecordException, codec errors, UnicodeDecodeError
        raise errors.CorruptMessage(f"the batch's records do not decode: {exc}") from exc
    pid = batch.producer_id
    if pid == NO_PRODUCER_ID:
        return KafkaBatch(topic, partition, NO_PRODUCER_ID, -1, -1, -1, records)
    base = batch.base_sequence
    last = (base + batch.last_offset_delta) % SEQ_MODULUS if base >= 0 else base
    return KafkaBatch(topic, partition, pid, batch.producer_epoch, base, last, records)


def inflate_limit(max_bytes: int, count: int) -> int:
    """What a batch of ``count`` records within ``max_bytes`` of keys, values and headers
    may inflate to: those bytes plus each record's framing (at most about 40 bytes)."""
    return max_bytes + count * _RECORD_FRAMING


def _inflated(
    raw: bytes,
    attributes: int,
    codec: int,
    count: int,
    max_bytes: int | None,
    budget: InflateBudget | None,
) -> bytes:
    """The batch with its records inflated (bounded) and its codec cleared, so that
    aiokafka walks them without inflating anything itself. Its CRC no longer matches:
    it was checked before."""
    limit = _MAX_INFLATED if max_bytes is None else inflate_limit(max_bytes, count)
    records = inflate(codec, raw[_HEADER_BYTES:], limit, budget)
    length = _HEADER_BYTES - _LOG_OVERHEAD + len(records)
    return b"".join(
        (
            raw[:8],
            _COUNT.pack(length),
            raw[_LOG_OVERHEAD:_ATTRIBUTES_AT],
            _ATTRIBUTES.pack(attributes & ~_CODEC_MASK),
            raw[_ATTRIBUTES_AT + 2 : _HEADER_BYTES],
            records,
        )
    )


def build_batch(
    records: Sequence[KafkaRecord],
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    codec: str = "none",
    transactional: bool = False,
    base_offset: int = 0,
) -> bytes:
    """A RecordBatch v2 holding ``records`` (tests, and Fetch answers)."""
    builder = DefaultRecordBatchBuilder(
        2,
        CODECS[codec],
        int(transactional),
        producer_id,
        producer_epoch,
        base_sequence,
        1 << 30,
    )
    for i, r in enumerate(records):
        builder.append(
            base_offset + i,
            r.timestamp,
            r.key,
            r.value,
            [(h.key, h.value) for h in r.headers],
        )
    return bytes(builder.build())
