"""A sidecar SIGKILLed under an idempotent librdkafka producer (5 in flight): every
record the producer was told is delivered is stored once, in order per partition, at
the offset it was told."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers import read_all
from tests.sidecar import ProcessSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]

RECORDS = 6000
KILL_AFTER = 1500  # records acknowledged before the kill
OUTSTANDING = 300  # records produced and not yet answered, at most


def test_sigkill_of_the_sidecar_loses_and_duplicates_nothing_acknowledged(
    pulsar, pulsar_reader_client, tmp_path
):
    sc = ProcessSidecar(pulsar, tmp_path).start()
    topic = f"kk-{uuid.uuid4().hex[:8]}"
    try:
        admin = AdminClient({"bootstrap.servers": sc.kafka_bootstrap})
        for future in admin.create_topics([NewTopic(topic, 2, 1)]).values():
            future.result(timeout=30)
        errors: list[str] = []
        producer = Producer(
            {
                "bootstrap.servers": sc.kafka_bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "max.in.flight.requests.per.connection": 5,
                "linger.ms": 2,
                "batch.num.messages": 20,
                "message.timeout.ms": 120_000,
                "reconnect.backoff.max.ms": 500,
                "error_cb": lambda e: errors.append(e.str()),
            }
        )
        acked: list[tuple[int, int | None, bytes]] = []
        failed: list[tuple[bytes, str]] = []

        def report(err, msg):
            if err is None:
                acked.append((msg.partition(), msg.offset(), msg.value()))
            else:
                failed.append((msg.value(), err.str()))

        killed = restarted = 0.0
        for i in range(RECORDS):
            while len(producer) >= OUTSTANDING:  # paced: the kill lands mid-stream
                producer.poll(0.01)
            producer.produce(
                topic, f"r{i:05d}".encode(), key=str(i % 11).encode(), on_delivery=report
            )
            producer.poll(0)
            if not killed and len(acked) >= KILL_AFTER:
                sc.kill()
                killed = time.monotonic()
                sc.start()
                restarted = time.monotonic()
        assert producer.flush(150) == 0
        assert killed, "the kill never happened: too few records acknowledged"
        print(f"\nsidecar down {restarted - killed:.1f}s; {len(acked)} acked, {len(failed)} failed")
        assert failed == []
        for p in range(2):
            stored = [
                m.data()
                for m in read_all(
                    pulsar_reader_client, f"persistent://public/kafka/{topic}-partition-{p}"
                )
            ]
            assert len(stored) == len(set(stored)), "a record is stored twice"
            mine = [v for part, _, v in acked if part == p]
            assert set(mine) <= set(stored), "an acknowledged record is missing"
            assert stored == sorted(stored), "records are out of produce order"
            without = unknown_offsets([(o, v) for part, o, v in acked if part == p])
            for part, offset, value in acked:
                if part == p and value not in without:
                    assert offset is not None, f"record {value!r} reported without an offset"
                    assert stored[offset] == value, f"record {value!r} reported at offset {offset}"
            print(f"partition {p}: {len(without)} records of batches answered 46 (no offset)")
    finally:
        sc.stop()


def unknown_offsets(reports: list[tuple[int | None, bytes]]) -> set[bytes]:
    """The records of batches answered 46 DUPLICATE_SEQUENCE_NUMBER (a retry of a batch
    the broker had stored before the kill): the answer carries no base offset (-1, as a
    Kafka broker answers a duplicate older than its last 5 batches; documented), and
    librdkafka numbers the batch's records from it: -1 (None here), 0, 1, ... in order."""
    out: set[bytes] = set()
    following: int | None = None
    for offset, value in reports:
        if offset is None:
            out.add(value)
            following = 0
        elif offset == following:
            out.add(value)
            following += 1
        else:
            following = None
    return out
