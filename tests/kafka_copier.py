"""The exactly-once copier scenario of Kafka's system tests, run the same way against
any Kafka target (the reference broker, the sidecar's listener): two
TransactionalMessageCopiers in assign mode with random aborts and the consumer's group
metadata copy a seeded topic; the output must equal the input and the group's
committed offsets what was consumed."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import TopicPartition

from tests.kafka_conformance import Target, by_partition, keys_values, records
from tests.kafka_perf_copier import copier_report, start_transactional_message_copier

PER_PARTITION = 300


def copy_exactly_once_through_aborts(target: Target, tmp_path: Path, *, timeout: float) -> None:
    source = target.create_topic(partitions=2, stem="in")
    out = target.create_topic(partitions=2, stem="out")
    seeded = records(2, PER_PARTITION)
    assert not [r for r in target.produce(source, seeded, enable_idempotence=True) if r.error]
    group = target.unique("copier")
    copiers = [
        start_transactional_message_copier(
            target.bootstrap,
            source,
            p,
            out,
            target.unique(f"copier-{p}"),
            group,
            tmp_path,
            transaction_size=50,
            use_group_metadata=True,
            random_aborts=True,  # about a third of the transactions abort and are redone
        )
        for p in range(2)
    ]
    try:
        runs = [copier.wait(timeout=timeout) for copier in copiers]
    finally:
        for copier in copiers:
            copier.kill()
    for report in (copier_report(run.events, run) for run in runs):
        assert report.run.returncode == 0, report.run.stderr_tail()
        assert report.shutdown_complete
        assert report.total_processed == PER_PARTITION
    assert keys_values(target.read(out, 2)) == by_partition(seeded)
    # the offsets went with the transactions: the group has consumed every input record
    consumer = target.consumer(group_id=group)
    try:
        committed = consumer.committed([TopicPartition(source, p) for p in range(2)], timeout=30)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: PER_PARTITION, 1: PER_PARTITION}
