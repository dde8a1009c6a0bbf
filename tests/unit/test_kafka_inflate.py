"""Compressed batches inflate step by step and stop at the batch limit (10), whatever
the codec; a stream that does not decode is CORRUPT_MESSAGE (2)."""

from __future__ import annotations

import gzip
import tracemalloc

import lz4.frame
import pytest
import zstandard

from kop_dedup import errors
from kop_dedup.protocol.records import rec
from kop_dedup.transports.kafka.batches import CODECS, build_batch, decode_batch, inflate_limit
from kop_dedup.transports.kafka.inflate import inflate
from tests.kafka_wire import batch_with_records_bytes

ZEROS = bytes(8 << 20)


def _bomb(codec: str) -> bytes:
    if codec == "gzip":
        return gzip.compress(ZEROS)
    if codec == "lz4":
        return lz4.frame.compress(ZEROS)
    if codec == "zstd":
        return zstandard.ZstdCompressor().compress(ZEROS)
    return build_batch([rec(ZEROS[: 4 << 20])], codec="snappy")[61:]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_records_round_trip_through_every_codec(codec):
    records = [rec(b"v%d" % i * 50, b"k") for i in range(200)]
    got = decode_batch("t", 0, build_batch(records, codec=codec), produce_version=9)
    assert [r.value for r in got.records] == [r.value for r in records]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_a_bomb_stops_at_the_limit_with_message_too_large(codec):
    bomb = _bomb(codec)
    tracemalloc.start()
    try:
        with pytest.raises(errors.MessageTooLarge, match="KOP_DEDUP_MAX_BATCH_BYTES"):
            inflate(CODECS[codec], bomb, limit=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{codec}: {peak} bytes held while inflating"


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_a_batch_inflating_past_the_batch_limit_is_message_too_large(codec):
    data = batch_with_records_bytes(codec, _bomb(codec))
    with pytest.raises(errors.MessageTooLarge):
        decode_batch("t", 0, data, produce_version=9, max_bytes=1 << 20)


def test_the_limit_leaves_room_for_each_records_framing():
    records = [rec(b"x" * 100) for _ in range(1000)]  # 100,000 bytes of values exactly
    data = build_batch(records, codec="gzip")
    assert len(decode_batch("t", 0, data, produce_version=9, max_bytes=100_000).records) == 1000
    assert inflate_limit(100_000, 1000) > 100_000


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_a_stream_that_does_not_decode_is_corrupt_message(codec):
    data = batch_with_records_bytes(codec, b"\x01\x02not-compressed-at-all" * 4)
    with pytest.raises(errors.CorruptMessage):
        decode_batch("t", 0, data, produce_version=9, max_bytes=1 << 20)


def test_concatenated_gzip_members_are_read_as_java_reads_them():
    assert inflate(1, gzip.compress(b"ab") + gzip.compress(b"cd"), limit=10) == b"abcd"


def test_a_cut_gzip_stream_is_corrupt_message():
    with pytest.raises(errors.CorruptMessage):
        inflate(1, gzip.compress(b"abcdef" * 100)[:-12], limit=1 << 20)
