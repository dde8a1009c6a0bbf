from __future__ import annotations

import pytest
from hypothesis import given

from kop_dedup import errors
from kop_dedup.protocol.records import Header, KafkaRecord
from kop_dedup.pulsar.naming import Naming, validate_topic
from kop_dedup.pulsar.wire import (
    DecodedRecord,
    decode_key,
    encode_key,
    encode_properties,
    record_properties,
)
from tests import strategies as s

NAMES = Naming("public", "kafka", "kop")


def test_partition_topic_and_producer_name():
    assert NAMES.partition_topic("orders", 2) == "persistent://public/kafka/orders-partition-2"
    assert NAMES.producer_name(17, 3) == "kop-17-3"
    assert NAMES.parse_producer_name("kop-17-3") == (17, 3)
    assert NAMES.parse_producer_name("other-17-3") is None
    assert NAMES.parse_producer_name("kop-x-3") is None


@pytest.mark.parametrize("bad", ["", ".", "..", "a b", "x/y", "a" * 250, "t-partition-1", "ü"])
def test_illegal_topics_are_invalid_topic(bad):
    with pytest.raises(errors.InvalidTopic):
        validate_topic(bad)


@pytest.mark.parametrize("good", ["orders", "a.b_c-d", "A" * 249])
def test_legal_topics_pass(good):
    validate_topic(good)


def test_error_table_is_derived_from_the_classes():
    assert errors.BY_CODE[46] is errors.DuplicateSequenceNumber
    assert errors.BY_CODE[45].name == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert errors.error_for_code(12345) is errors.KafkaError
    assert errors.RequestTimedOut.retriable
    assert not errors.DuplicateSequenceNumber.retriable
    codes = [c.errno for c in errors.BY_CODE.values()]
    assert len(codes) == len(set(codes))


@given(s.opt_bytes)
def test_key_encoding_round_trips(key):
    text, enc = encode_key(key)
    assert decode_key(text, enc) == key


@given(s.records, s.sequences)
def test_record_round_trips_through_message_layout(record, seq):
    key, enc = encode_key(record.key)
    props = encode_properties(
        record, producer_id=9, epoch=2, sequence=seq, partition=1, key_encoding=enc
    )
    assert all(isinstance(v, str) for v in props.values())
    decoded = DecodedRecord.from_message(record.value or b"", key, props)
    assert decoded.record == record
    assert (decoded.producer_id, decoded.epoch, decoded.sequence, decoded.partition) == (
        9,
        2,
        seq,
        1,
    )


def test_headers_keep_order_duplicates_and_nulls():
    rec = KafkaRecord(b"k", b"v", (Header("a", b"1"), Header("a", None), Header("b", b"")))
    props = encode_properties(
        rec, producer_id=1, epoch=0, sequence=0, partition=0, key_encoding=None
    )
    assert DecodedRecord.from_message(b"v", "k", props).record.headers == rec.headers


@given(s.records)
def test_a_records_properties_from_its_batchs_shared_ones_are_the_full_encoding(record):
    """The produce hot path copies the batch's shared properties and adds the record's
    own (:func:`record_properties`) instead of encoding every record from scratch: the
    same properties either way."""
    ids = {"producer_id": 7, "epoch": 2, "sequence": None, "partition": 3, "key_encoding": None}
    shared = encode_properties(KafkaRecord(key=None, value=b""), **ids)  # type: ignore[arg-type]
    assert record_properties(shared, record) == encode_properties(record, **ids)  # type: ignore[arg-type]
