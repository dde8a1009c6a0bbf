"""RecordBatch v2 glue: round trips through aiokafka's codecs, and Kafka's codes for bad
batches."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.protocol.records import SEQ_MODULUS, KafkaRecord, rec
from kop_dedup.transports.kafka.batches import CODECS, build_batch, decode_batch, is_transactional
from tests.strategies import near_wrap, records

codecs = st.sampled_from(sorted(CODECS))


def _timestamped(r: KafkaRecord) -> KafkaRecord:
    # a RecordBatch always carries a timestamp; the builder stamps "now" for None
    return (
        r if r.timestamp is not None else KafkaRecord(r.key, r.value, r.headers, 1_700_000_000_000)
    )


@given(
    st.lists(records, min_size=1, max_size=30),
    codecs,
    st.integers(0, 1 << 40),
    st.integers(0, 32767),
)
def test_an_idempotent_batch_survives_the_round_trip(rs, codec, pid, epoch):
    rs = [_timestamped(r) for r in rs]
    raw = build_batch(rs, producer_id=pid, producer_epoch=epoch, base_sequence=7, codec=codec)
    batch = decode_batch("t", 3, raw, produce_version=9)
    assert (batch.topic, batch.partition, batch.producer_id, batch.producer_epoch) == (
        "t",
        3,
        pid,
        epoch,
    )
    assert (batch.base_sequence, batch.last_sequence) == (7, 7 + len(rs) - 1)
    assert list(batch.records) == rs


@given(near_wrap, st.integers(1, 100))
def test_last_sequence_wraps_like_kafka(base, n):
    raw = build_batch([rec(b"x")] * n, producer_id=1, producer_epoch=0, base_sequence=base)
    batch = decode_batch("t", 0, raw, produce_version=9)
    assert batch.last_sequence == (base + n - 1) % SEQ_MODULUS


def test_a_batch_without_a_producer_id_has_no_sequences():
    batch = decode_batch("t", 0, build_batch([rec(b"a"), rec(b"b")]), produce_version=3)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_sequence) == (
        -1,
        -1,
        -1,
        -1,
    )
    assert not batch.idempotent


@given(st.integers(min_value=0))
def test_any_flipped_byte_after_the_crc_is_corrupt_message(seed):
    raw = bytearray(build_batch([rec(b"hello", b"k")] * 3))
    at = 21 + seed % (len(raw) - 21)  # attributes onwards: what the CRC covers
    raw[at] ^= 0x5A
    with pytest.raises(errors.CorruptMessage):
        decode_batch("t", 0, bytes(raw), produce_version=9)


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_magic_other_than_2_is_invalid_record(magic):
    raw = bytearray(build_batch([rec(b"x")]))
    raw[16] = magic
    with pytest.raises(errors.InvalidRecord, match="magic"):
        decode_batch("t", 0, bytes(raw), produce_version=9)


def test_two_batches_are_invalid_record_but_a_short_tail_is_ignored_as_kafka_does():
    one = build_batch([rec(b"x")])
    with pytest.raises(errors.InvalidRecord, match="exactly one"):
        decode_batch("t", 0, one + one, produce_version=9)
    assert decode_batch("t", 0, one + b"\0" * 5, produce_version=9).records[0].value == b"x"


@pytest.mark.parametrize("data", [b"", b"\0" * 10, build_batch([rec(b"x")])[:40]])
def test_no_complete_batch_is_invalid_record(data):
    with pytest.raises(errors.InvalidRecord):
        decode_batch("t", 0, data, produce_version=9)


def _with_attributes(raw: bytes, attributes: int) -> bytes:
    """The batch with other attributes and a CRC that matches again."""
    from aiokafka.record.util import calc_crc32c

    out = bytearray(raw)
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, calc_crc32c(bytes(out[21:])))
    return bytes(out)


def test_a_control_batch_from_a_client_is_invalid_record():
    raw = _with_attributes(build_batch([rec(b"x")]), 0x20)
    with pytest.raises(errors.InvalidRecord, match="control"):
        decode_batch("t", 0, raw, produce_version=9)


def test_an_unknown_codec_is_invalid_record():
    raw = _with_attributes(build_batch([rec(b"x")]), 0x07)
    with pytest.raises(errors.InvalidRecord, match="codec"):
        decode_batch("t", 0, raw, produce_version=9)


def test_zstd_needs_produce_v7():
    raw = build_batch([rec(b"z" * 50)], codec="zstd")
    with pytest.raises(errors.UnsupportedCompressionType):
        decode_batch("t", 0, raw, produce_version=6)
    assert decode_batch("t", 0, raw, produce_version=7).records[0].value == b"z" * 50


def test_too_many_records_is_message_too_large_before_decoding():
    raw = build_batch([rec(b"x")] * 11)
    with pytest.raises(errors.MessageTooLarge):
        decode_batch("t", 0, raw, produce_version=9, max_records=10)


def test_a_count_that_disagrees_with_the_offsets_is_invalid_record():
    raw = bytearray(build_batch([rec(b"x")] * 3))
    struct.pack_into(">i", raw, 23, 5)  # lastOffsetDelta
    from aiokafka.record.util import calc_crc32c

    struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    with pytest.raises(errors.InvalidRecord, match="span"):
        decode_batch("t", 0, bytes(raw), produce_version=9)


def test_the_transactional_bit_is_read_without_decoding():
    assert is_transactional(
        build_batch(
            [rec(b"x")], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True
        )
    )
    assert not is_transactional(build_batch([rec(b"x")]))
    assert not is_transactional(b"short")
