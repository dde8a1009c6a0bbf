"""The record types as msgspec Structs: as a frozen dataclass from Python, and
decoded straight from the produce body's camelCase JSON."""

from __future__ import annotations

import msgspec
import pytest

from kop_dedup.protocol.records import Header, KafkaBatch, KafkaRecord, rec

# -- the record types as Python objects -------------------------------------------------


def test_record_types_construct_positionally_compare_by_value_and_hash():
    h = Header("h", None)
    r = KafkaRecord(b"k", b"v", (h,), 5)
    b = KafkaBatch("t", 1, 17, 2, 0, 0, (r,))
    assert (r.key, r.value, r.headers, r.timestamp) == (b"k", b"v", (h,), 5)
    assert (b.topic, b.partition, b.producer_id, b.producer_epoch) == ("t", 1, 17, 2)
    assert (b.base_sequence, b.last_sequence, b.records) == (0, 0, (r,))
    twin = KafkaBatch("t", 1, 17, 2, 0, 0, (KafkaRecord(b"k", b"v", (Header("h", None),), 5),))
    assert b == twin
    assert hash(b) == hash(twin)
    assert len({b, twin, rec(b"v")}) == 2
    assert KafkaRecord(None, None) == rec(None)  # a tombstone without a key
    assert (r.size, b.size, b.idempotent) == (3, 3, True)


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (Header("h", None), "value"),
        (rec(b"v"), "value"),
        (KafkaBatch("t", 0, -1, -1, -1, -1, ()), "topic"),
    ],
)
def test_record_types_are_immutable(obj, field):
    with pytest.raises(AttributeError):
        setattr(obj, field, None)


def test_a_record_needs_its_value_even_from_python():
    with pytest.raises(TypeError, match="value"):
        KafkaRecord(b"k")
    assert KafkaRecord(b"k", None).value is None


def test_a_batch_decodes_from_camel_case_json_with_base64_payloads():
    raw = (
        b'{"topic":"t","partition":0,"producerId":17,"producerEpoch":1,"baseSequence":0,'
        b'"lastSequence":1,"records":[{"value":"dg=="},'
        b'{"key":null,"value":null,"headers":[{"key":"h","value":"AAE="}],"timestamp":5}]}'
    )
    batch = msgspec.json.decode(raw, type=KafkaBatch)
    assert batch == KafkaBatch(
        "t", 0, 17, 1, 0, 1, (rec(b"v"), KafkaRecord(None, None, (Header("h", b"\0\1"),), 5))
    )
    for bad in (raw.replace(b'"dg=="}', b'"dg==","x":1}'), raw.replace(b'{"value":"dg=="}', b"{}")):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(bad, type=KafkaBatch)
