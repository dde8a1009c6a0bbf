"""Kafka's own Java tools in transactions against the listener: the exactly-once copier
of Kafka's system tests (TransactionalMessageCopier, read_committed consumer in assign
mode, sendOffsetsToTransaction with the consumer's group metadata, random aborts) and
ProducerPerformance with a transactional id. A read_committed consumer checks the
output, the group's offsets what was consumed."""

from __future__ import annotations

import pytest

from tests.kafka_conformance import Target
from tests.kafka_copier import copy_exactly_once_through_aborts
from tests.kafka_perf_copier import run_producer_performance

pytestmark = pytest.mark.integration


@pytest.fixture
def listener(sidecar_kafka: str) -> Target:
    return Target("sidecar", sidecar_kafka, timeout=60)


def test_transactional_message_copier_copies_a_topic_exactly_once_through_aborts(
    listener, tmp_path
):
    copy_exactly_once_through_aborts(listener, tmp_path, timeout=180)


def test_producer_performance_in_transactions_commits_every_record_once(listener, tmp_path):
    topic = listener.create_topic(partitions=1, stem="perf")
    report = run_producer_performance(
        listener.bootstrap,
        topic,
        tmp_path,
        num_records=5000,
        record_size=100,
        transactional_id=listener.unique("perf"),
        transaction_duration_ms=200,
    )
    assert report.run.returncode == 0, report.run.stderr_tail()
    assert report.total is not None
    assert report.total.records == 5000
    read = listener.read(topic, 1)
    assert len(read[0]) == 5000
    assert [r.offset for r in read[0]] == list(range(5000))
    print(f"\nProducerPerformance in transactions through the listener: {report.total}")
