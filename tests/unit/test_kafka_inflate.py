"""Compressed batches inflate step by step and stop at the batch limit (10), whatever
the codec; a stream that does not decode is CORRUPT_MESSAGE (2)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import lz4.frame
import pytest
import zstandard

from kop_dedup import errors
from kop_dedup.protocol.records import rec
from kop_dedup.transports.kafka.batches import CODECS, build_batch, decode_batch, inflate_limit
from kop_dedup.transports.kafka.inflate import InflateBudget, inflate
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


_PEAK = """
import sys, tracemalloc
from kop_dedup import errors
from kop_dedup.transports.kafka.batches import CODECS
from kop_dedup.transports.kafka.inflate import InflateBudget, inflate
from tests.unit.test_kafka_inflate import _bomb

bomb = _bomb(sys.argv[1])
tracemalloc.start()
try:
    inflate(CODECS[sys.argv[1]], bomb, limit=1 << 20)
except errors.MessageTooLarge:
    print(tracemalloc.get_traced_memory()[1])
"""
"""The peak Python memory of one inflate, measured in an interpreter of its own:
tracemalloc stopped in the test session (full of native threads: the Pulsar client's,
librdkafka's, Spark's) crashed it once with a segmentation fault (CPython 3.11 frees
its tables while another thread may still be in its hooks)."""


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_a_bomb_stops_at_the_limit_with_message_too_large(codec):
    with pytest.raises(errors.MessageTooLarge, match="KOP_DEDUP_MAX_BATCH_BYTES"):
        inflate(CODECS[codec], _bomb(codec), limit=1 << 20)
    measured = subprocess.run(
        [sys.executable, "-c", _PEAK, codec],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    peak = int(measured.stdout.strip() or -1)
    assert 0 < peak < 4 << 20, f"{codec}: {peak} bytes held while inflating {measured.stderr}"


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


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_the_batches_of_one_request_stop_inflating_at_its_budget(codec):
    # many small batches of a 1 MB zero value, each within the batch limit: a 16 MiB
    # frame of them would ask for ~100 GiB; the request's budget stops them together
    budget = InflateBudget(3 << 20)
    batch = build_batch([rec(bytes(1_000_000))], codec=codec)
    assert len(batch) < 64 << 10
    answers: list[int | str] = []
    for _ in range(20):
        try:
            decode_batch("t", 0, batch, produce_version=9, max_bytes=1 << 20, budget=budget)
            answers.append(0)
        except errors.MessageTooLarge as exc:
            answers.append(exc.message)
    assert answers[:3] == [0, 0, 0]
    assert all("KOP_DEDUP_KAFKA_MAX_REQUEST_INFLATED_BYTES" in str(a) for a in answers[3:])
    # what the refused ones inflated was given back: only the three held are counted
    assert 3_000_000 <= budget.taken <= 3 << 20


class _Peak(InflateBudget):
    peak = 0

    def take(self, n: int) -> None:
        super().take(n)
        self.peak = max(self.peak, self.taken)


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_the_budget_is_charged_step_by_step_not_after_a_batch_inflates_whole(codec):
    budget = _Peak(256 << 10)  # far below the batch limit
    with pytest.raises(errors.MessageTooLarge, match="INFLATED_BYTES"):
        inflate(CODECS[codec], _bomb(codec), limit=16 << 20, budget=budget)
    assert 0 < budget.peak <= 256 << 10
    assert budget.taken == 0  # given back: the batch is refused, nothing of it held
