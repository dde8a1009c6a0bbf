"""Kafka's own Java tools in transactions against the listener: the exactly-once copier
of Kafka's system tests (TransactionalMessageCopier, read_committed consumer in assign
mode, sendOffsetsToTransaction with the consumer's group metadata, random aborts) and
ProducerPerformance with a transactional id. A read_committed consumer checks the
output, the group's offsets what was consumed."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from tests.kafka_conformance import Target, by_partition, keys_values, records
from tests.kafka_tools import (
    copier_report,
    run_producer_performance,
    start_transactional_message_copier,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def listener(sidecar_kafka: str) -> Target:
    return Target("sidecar", sidecar_kafka, timeout=60)


def test_transactional_message_copier_copies_a_topic_exactly_once_through_aborts(
    listener, tmp_path
):
    source = listener.create_topic(partitions=2, stem="in")
    target = listener.create_topic(partitions=2, stem="out")
    seeded = records(2, 300)
    assert not [r for r in listener.produce(source, seeded, enable_idempotence=True) if r.error]
    group = listener.unique("copier")
    copiers = [
        start_transactional_message_copier(
            listener.bootstrap,
            source,
            p,
            target,
            listener.unique(f"copier-{p}"),
            group,
            tmp_path,
            transaction_size=50,
            use_group_metadata=True,
            random_aborts=True,  # about a third of the transactions abort and are redone
        )
        for p in range(2)
    ]
    try:
        runs = [copier.wait(timeout=180) for copier in copiers]
    finally:
        for copier in copiers:
            copier.kill()
    for report in (copier_report(run.events, run) for run in runs):
        assert report.run.returncode == 0, report.run.stderr_tail()
        assert report.shutdown_complete
        assert report.total_processed == 300
    assert keys_values(listener.read(target, 2)) == by_partition(seeded)
    consumer = listener.consumer(group_id=group)
    try:
        committed = consumer.committed([TopicPartition(source, p) for p in range(2)], timeout=30)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: 300, 1: 300}


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
