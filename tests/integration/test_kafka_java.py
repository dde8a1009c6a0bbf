"""Kafka's own Java tools against the listener: VerifiableProducer (idempotent,
acks=all, 5 in flight) and ProducerPerformance; what they report is checked by a
Pulsar reader."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers import read_all
from tests.kafka_perf_copier import run_producer_performance
from tests.kafka_tools import run_verifiable_producer

pytestmark = pytest.mark.integration


def _topic(bootstrap: str, partitions: int) -> str:
    topic = f"kj-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)
    return topic


def _stored(client, topic: str, partition: int) -> list[str]:
    ptopic = f"persistent://public/kafka/{topic}-partition-{partition}"
    return [m.data().decode() for m in read_all(client, ptopic)]


def test_verifiable_producer_acked_records_are_stored_once_at_their_offsets(
    sidecar_kafka, pulsar_reader_client, tmp_path
):
    topic = _topic(sidecar_kafka, 2)
    produced = run_verifiable_producer(sidecar_kafka, topic, tmp_path, max_messages=2000)
    assert produced.run.returncode == 0, produced.run.stderr_tail()
    assert produced.failed == ()
    assert produced.sent == produced.acked_count == len(produced.acked) == 2000
    for p in range(2):
        stored = _stored(pulsar_reader_client, topic, p)
        acked = sorted((r.offset, r.value) for r in produced.acked if r.partition == p)
        assert [(i, v) for i, v in enumerate(stored)] == acked


def test_producer_performance_writes_every_record(sidecar_kafka, pulsar_reader_client, tmp_path):
    topic = _topic(sidecar_kafka, 1)
    report = run_producer_performance(
        sidecar_kafka, topic, tmp_path, num_records=20_000, props={"enable.idempotence": "true"}
    )
    assert report.run.returncode == 0, report.run.stderr_tail()
    assert len(_stored(pulsar_reader_client, topic, 0)) == 20_000
    print(f"\nProducerPerformance through the listener: {report.total}")
