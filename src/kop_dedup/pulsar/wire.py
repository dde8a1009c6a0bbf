"""How a Kafka record is laid out as a Pulsar message, and back.

One Kafka record is one Pulsar message; one Kafka batch is one Pulsar batch
entry (see publisher.py). The mapping is lossless:

======================  ====================================================
Kafka                   Pulsar message
======================  ====================================================
value                   payload (``b""`` plus ``kafka.value.null=true`` for null)
key                     partition key: the UTF-8 text, or base64 of the bytes
                        with ``kafka.key.encoding=base64``; an empty key has
                        ``kafka.key.encoding=empty``, a null key
                        ``kafka.key.encoding=null`` (explicit: the Spark
                        connector's client repeats the previous record's key
                        for a keyless record inside a batch entry)
headers                 ``kafka.headers``: JSON ``[[key, base64|null], ...]``
timestamp               ``kafka.timestamp`` (ms) and the event time when > 0
producer id / epoch     ``kafka.producer.id`` / ``kafka.producer.epoch``
sequence                ``kafka.sequence`` (this record's, 0..2^31-1)
partition               ``kafka.partition``
======================  ====================================================

A journal entry (a transactional batch waiting for its decision, read back only by
the sidecar) is laid out otherwise: one message whose payload is the whole Kafka
batch in msgpack, marked ``kafka.entry.format=batch-msgpack-1`` (:func:`encode_whole`,
:func:`decode_whole`). Its Pulsar sequence id is the batch's, as for a batch entry, so
broker deduplication treats it the same.

This module is pure (no Pulsar import) so that the Spark audit can use the
same constants and decoder without importing the service.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from kop_dedup.protocol.records import Header, KafkaBatch, KafkaRecord
from kop_dedup.protocol.stable import CopyHead, CopyMark

__all__ = [
    "PROP_ENTRY_FORMAT",
    "PROP_EPOCH",
    "PROP_HEADERS",
    "PROP_KEY_ENCODING",
    "PROP_PARTITION",
    "PROP_PRODUCER_ID",
    "PROP_SEQUENCE",
    "PROP_TIMESTAMP",
    "PROP_TXN_BATCH",
    "PROP_TXN_ID",
    "PROP_TXN_ORDINAL",
    "PROP_TXN_RECORDS",
    "PROP_VALUE_NULL",
    "WHOLE_BATCH",
    "DecodedRecord",
    "copy_mark",
    "decode_headers",
    "decode_key",
    "decode_record",
    "decode_whole",
    "encode_key",
    "encode_properties",
    "encode_whole",
    "entry_size_bound",
    "record_properties",
]

PROP_PRODUCER_ID = "kafka.producer.id"
PROP_ENTRY_FORMAT = "kafka.entry.format"
WHOLE_BATCH = "batch-msgpack-1"
"""``kafka.entry.format`` of a message whose payload is a whole Kafka batch."""
PROP_EPOCH = "kafka.producer.epoch"
PROP_SEQUENCE = "kafka.sequence"
PROP_PARTITION = "kafka.partition"
PROP_TIMESTAMP = "kafka.timestamp"
PROP_HEADERS = "kafka.headers"
PROP_KEY_ENCODING = "kafka.key.encoding"
PROP_VALUE_NULL = "kafka.value.null"
# What a copy of a committed transaction adds (the copier writes them: its module
# says what each means; these are the names a reader of a data partition needs)
PROP_TXN_ORDINAL = "kafka.txn.ordinal"
"""On every copied record: the transaction's ordinal (with the producer id: which one)."""
PROP_TXN_ID = "kafka.txn.id"
PROP_TXN_BATCH = "kafka.txn.batch"
PROP_TXN_RECORDS = "kafka.txn.records"
"""These three on the first record of a copied batch only: the transactional id, the
batch's index among the transaction's in the partition, the transaction's records
in the partition."""


def encode_whole(batch: KafkaBatch) -> bytes:
    """A whole Kafka batch as one payload (a journal entry).

    >>> from kop_dedup.protocol.records import rec
    >>> b = KafkaBatch("t", 0, 7, 0, 5, 5, (rec(b"v", b"k"),))
    >>> decode_whole(encode_whole(b)) == b
    True
    """
    return _WHOLE_ENCODER.encode(batch)


def decode_whole(payload: bytes) -> KafkaBatch:
    return _WHOLE_DECODER.decode(payload)


_WHOLE_ENCODER = msgspec.msgpack.Encoder()
_WHOLE_DECODER = msgspec.msgpack.Decoder(KafkaBatch)


def encode_key(key: bytes | None) -> tuple[str | None, str | None]:
    """(partition key, kafka.key.encoding) for a Kafka key."""
    if key is None:
        return None, "null"
    if key == b"":
        return None, "empty"
    try:
        return key.decode("utf-8"), None
    except UnicodeDecodeError:
        return base64.b64encode(key).decode("ascii"), "base64"


def decode_key(partition_key: str | None, encoding: str | None) -> bytes | None:
    """Inverse of :func:`encode_key`."""
    if encoding == "empty":
        return b""
    if encoding == "null" or not partition_key:
        return None
    if encoding == "base64":
        return base64.b64decode(partition_key)
    return partition_key.encode("utf-8")


def _encode_headers(headers: tuple[Header, ...]) -> str:
    return json.dumps(
        [
            [h.key, None if h.value is None else base64.b64encode(h.value).decode("ascii")]
            for h in headers
        ],
        separators=(",", ":"),
    )


def decode_headers(raw: str | None) -> tuple[Header, ...]:
    """Inverse of the ``kafka.headers`` encoding; () when absent."""
    if not raw:
        return ()
    try:
        items = json.loads(raw)
        return tuple(
            Header(str(k), None if v is None else base64.b64decode(v, validate=True))
            for k, v in items
        )
    except (ValueError, TypeError, binascii.Error) as exc:
        raise ValueError(f"malformed {PROP_HEADERS} property: {exc}") from exc


def encode_properties(
    record: KafkaRecord,
    *,
    producer_id: int,
    epoch: int,
    sequence: int | None,
    partition: int,
    key_encoding: str | None,
) -> dict[str, str]:
    """The Pulsar properties for one record (see the module table)."""
    props = {
        PROP_PRODUCER_ID: str(producer_id),
        PROP_EPOCH: str(epoch),
        PROP_PARTITION: str(partition),
    }
    if sequence is not None:
        props[PROP_SEQUENCE] = str(sequence)
    if record.timestamp is not None:
        props[PROP_TIMESTAMP] = str(record.timestamp)
    if record.headers:
        props[PROP_HEADERS] = _encode_headers(record.headers)
    if key_encoding is not None:
        props[PROP_KEY_ENCODING] = key_encoding
    if record.value is None:
        props[PROP_VALUE_NULL] = "true"
    return props


def record_properties(shared: dict[str, str], record: KafkaRecord) -> dict[str, str]:
    """What :func:`encode_properties` answers for ``record``, from the properties its
    batch shares (``shared``: those of a record with no timestamp, no headers and a
    value, copied here) and the record's own: one dict copy per record on the hot
    path instead of building every property again."""
    props = shared.copy()
    if record.timestamp is not None:
        props[PROP_TIMESTAMP] = str(record.timestamp)
    if record.headers:
        props[PROP_HEADERS] = _encode_headers(record.headers)
    if record.value is None:
        props[PROP_VALUE_NULL] = "true"
    return props


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """A Kafka record read back from Pulsar, with its idempotence metadata."""

    partition: int
    producer_id: int
    epoch: int
    sequence: int | None
    record: KafkaRecord

    @classmethod
    def from_message(
        cls,
        payload: bytes,
        partition_key: str | None,
        properties: dict[str, str],
        event_timestamp: int | None = None,
    ) -> DecodedRecord:
        seq = properties.get(PROP_SEQUENCE)
        return cls(
            partition=int(properties.get(PROP_PARTITION, "-1")),
            producer_id=int(properties.get(PROP_PRODUCER_ID, "-1")),
            epoch=int(properties.get(PROP_EPOCH, "-1")),
            sequence=int(seq) if seq is not None else None,
            record=decode_record(payload, partition_key, properties, event_timestamp),
        )


def copy_mark(properties: Mapping[str, str], producer_id: int) -> CopyMark | None:
    """The copy a stored record belongs to (None: not a copy, or marks it cannot read,
    which a reader then takes for a plain record)."""
    ordinal = properties.get(PROP_TXN_ORDINAL)
    if ordinal is None:
        return None
    batch, records = properties.get(PROP_TXN_BATCH), properties.get(PROP_TXN_RECORDS)
    try:
        head = (
            None
            if batch is None or records is None
            else CopyHead(properties.get(PROP_TXN_ID), int(batch), int(records))
        )
        return CopyMark(producer_id, int(ordinal), head)
    except ValueError:
        return None


def decode_record(
    payload: bytes,
    partition_key: str | None,
    properties: Mapping[str, str],
    event_timestamp: int | None = None,
) -> KafkaRecord:
    """The Kafka record a Pulsar message carries (the module's table, read back): the
    timestamp is ``kafka.timestamp``, else the event time (pass it only when that
    property is absent: a reader on the hot path saves the call)."""
    ts_raw = properties.get(PROP_TIMESTAMP)
    encoding = properties.get(PROP_KEY_ENCODING)
    headers = properties.get(PROP_HEADERS)
    return KafkaRecord(
        partition_key.encode("utf-8")
        if encoding is None and partition_key
        else decode_key(partition_key, encoding),
        None if properties.get(PROP_VALUE_NULL) == "true" else payload,
        decode_headers(headers) if headers else (),
        int(ts_raw) if ts_raw is not None else (event_timestamp or None),
    )


# Bytes a record's Pulsar metadata can take besides its payload, key, headers and the
# properties every record of the batch shares: the sequence (32), timestamp (43), key
# encoding (32) and null-value (28) properties at their longest, and the framing of the
# message's metadata (size prefix, payload size, sequence id, event time: 15).
_RECORD_OVERHEAD = 150
_ENTRY_OVERHEAD = 512  # the entry's own metadata: producer name, ids, times, checksums
_COMMON_KEYS = (PROP_PRODUCER_ID, PROP_EPOCH, PROP_PARTITION)


def entry_size_bound(batch: KafkaBatch) -> int:
    """An upper bound on the bytes of the Pulsar batch entry that carries ``batch``.

    The broker refuses entries over its ``maxMessageSize`` and the client then fails
    the whole entry; the sidecar refuses such a batch before sending it instead, so an
    oversized batch can never fail while later batches of the same producer are
    stored behind it. Keys count 4/3 (base64 when not UTF-8), header keys 12x (JSON
    escapes), header values 4/3 (base64).
    """
    common = sum(len(k) + 20 + 8 for k in _COMMON_KEYS)  # values: at most 20 digits
    total = _ENTRY_OVERHEAD
    for record in batch.records:
        total += len(record.value or b"") + common + _RECORD_OVERHEAD
        if record.key is not None:
            total += (len(record.key) * 4) // 3 + 4
        if record.headers:
            total += len(PROP_HEADERS) + 16
            for header in record.headers:
                total += len(header.key) * 12 + (len(header.value or b"") * 4) // 3 + 16
    return total
