"""Fetch of many partitions (more than ``_MANY_PARTITIONS``): each reader's client queue
is read without asking the broker, and the broker is asked whether more is there for
all the emptied partitions at once; a partition it said drained a moment ago is not
asked again, and what comes later is pushed. Real consumers and the wire, real Pulsar."""

from __future__ import annotations

import threading
import time
import uuid

import _pulsar
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kop_dedup.pulsar.reader_pool import PoolLimits
from tests.integration.kafka_consume import (
    batches,
    confluent_consumer,
    confluent_read,
    create,
    fetch_request,
    produce,
)
from tests.integration.kafka_txn import sent_records, transactional_producer
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration

PARTITIONS = 40  # over _MANY_PARTITIONS (16)


def _records(n: int) -> list[tuple[int, bytes, bytes]]:
    return [(i % PARTITIONS, f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]


def _read_all(client: WireClient, topic: str, counts: dict[int, int], **kw):
    """Fetch every partition from 0 until each holds its count, as a consumer does
    (each next fetch at the offset after the last record of the partition); the records
    per partition as (offset, value), and the last answer's watermarks."""
    at = dict.fromkeys(range(PARTITIONS), 0)
    got: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    marks: dict[int, tuple[int, int]] = {}
    deadline = time.monotonic() + 120
    while any(at[p] < counts.get(p, 0) for p in at) and time.monotonic() < deadline:
        answer = client.call(fetch_request(topic, at, **kw), 12)
        for part in answer.responses[0].partitions:
            assert part.error_code == 0, part
            marks[part.partition_index] = (part.high_watermark, part.last_stable_offset)
            for batch in batches(part.records):
                for record in batch:
                    got[part.partition_index].append((record.offset, record.value))
                    at[part.partition_index] = record.offset + 1
    return got, marks


def test_a_fetch_of_many_partitions_reads_every_record_once_in_order(sidecar_kafka):
    topic = create(sidecar_kafka, PARTITIONS)
    delivered = produce(sidecar_kafka, topic, _records(600), **{"batch.num.messages": 7})
    want: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    for d in sorted(delivered, key=lambda d: (d.partition, d.offset)):
        want[d.partition].append((d.offset, d.value))
    counts = {p: len(v) for p, v in want.items()}
    with WireClient(sidecar_kafka) as client:
        got, marks = _read_all(client, topic, counts, isolation_level=1, partition_max_bytes=300)
    assert got == want
    assert all([o for o, _ in want[p]] == list(range(counts[p])) for p in want)
    assert {p: marks[p] for p in want} == {p: (n, n) for p, n in counts.items()}


def test_read_committed_over_many_partitions_sees_the_committed_transactions_only(sidecar_kafka):
    topic = create(sidecar_kafka, PARTITIONS)
    producer = transactional_producer(sidecar_kafka, f"many-{uuid.uuid4().hex[:8]}")
    producer.init_transactions(30)
    committed = []
    for n in range(3):
        producer.begin_transaction()
        records = sent_records(producer, topic, PARTITIONS, 5, f"c{n}-")
        if n == 1:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed.extend(records)
    consumer = confluent_consumer(sidecar_kafka, **{"isolation.level": "read_committed"})
    try:
        got = confluent_read(
            consumer,
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)],
            len(committed) + 1,  # one more than committed: an aborted record would come
            timeout=10,
        )
    finally:
        consumer.close()
    by: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for g in got:
        by.setdefault(g.partition, []).append((g.key, g.value))
    want: dict[int, list[tuple[bytes, bytes]]] = {}
    for p, key, value in committed:
        want.setdefault(p, []).append((key, value))
    assert by == want


def test_caught_up_partitions_are_not_asked_again_while_their_end_is_known(sidecar, monkeypatch):
    """While one partition has records to read, the caught-up ones cost a fetch no broker
    round trip (no GetLastMessageId each, one after another); once the broker said a
    partition has nothing more, a fetch within ``end_ttl_s`` asks it nothing and answers
    its known end; a record written later comes by push to a long poll."""
    address = sidecar.kafka_bootstrap
    topic = create(address, PARTITIONS)
    produce(address, topic, _records(PARTITIONS))  # one record per partition
    asked: list[str] = []
    for name in ("has_message_available", "has_message_available_async"):  # a spy
        original = getattr(_pulsar.Reader, name)

        def counted(self, *args, _original=original):
            if topic in self.topic():  # not the sidecar's own tables
                asked.append(self.topic())
            return _original(self, *args)

        monkeypatch.setattr(_pulsar.Reader, name, counted)
    ends = dict.fromkeys(range(PARTITIONS), 1)
    with WireClient(address) as client:
        got, _ = _read_all(client, topic, ends)
        assert all(len(v) == 1 for v in got.values())
        # partition 0 gets 20 batches; each fetch answers one of them at once
        more = [(0, b"k", b"x%d" % i) for i in range(200)]
        produce(address, topic, more, **{"batch.num.messages": 10, "linger.ms": 50})
        asked.clear()
        at, fetches = dict(ends), 0
        while at[0] < 201:
            answer = client.call(fetch_request(topic, at, partition_max_bytes=1), 12)
            fetches += 1
            for part in answer.responses[0].partitions:
                for batch in batches(part.records):
                    at[part.partition_index] = [r.offset for r in batch][-1] + 1
        assert fetches > 1
        assert [t for t in asked if not t.endswith("-partition-0")] == []
        # a record written while a long poll waits comes by push
        timer = threading.Timer(1.0, produce, (address, topic, [(17, b"k", b"late")]))
        timer.start()
        try:
            started = time.monotonic()
            answer = client.call(fetch_request(topic, at, max_wait_ms=20_000), 12)
            elapsed = time.monotonic() - started
        finally:
            timer.join()
        records = {
            p.partition_index: [(r.offset, r.value) for b in batches(p.records) for r in b]
            for p in answer.responses[0].partitions
            if p.records
        }
        assert records == {17: [(1, b"late")]}
        assert 0.9 < elapsed < 15
        at[17] = 2
        # caught up everywhere: the broker said so; within end_ttl_s it is not asked again
        pool = sidecar.kafka._shared.readers
        monkeypatch.setattr(pool, "limits", PoolLimits(end_ttl_s=60.0))
        answer = client.call(fetch_request(topic, at, max_wait_ms=300), 12)
        assert all(p.records == b"" for p in answer.responses[0].partitions)
        asked.clear()
        answer = client.call(fetch_request(topic, at, max_wait_ms=300), 12)
        parts = answer.responses[0].partitions
        assert [(p.error_code, p.records) for p in parts] == [(0, b"")] * PARTITIONS
        assert [p.high_watermark for p in parts] == [at[p] for p in range(PARTITIONS)]
        assert asked == []
