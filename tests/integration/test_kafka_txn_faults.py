"""A sidecar SIGKILLed between a transaction's produce and its commit, under a
transactional librdkafka producer: commit_transaction retries EndTxn on the restarted
sidecar, and the transaction is committed whole (every record once, the offsets with
it) or aborted whole (nothing, no offsets); the producer goes on with the next one."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, TopicPartition

from tests.integration.kafka_consume import confluent_consumer, create
from tests.integration.kafka_txn import (
    by_partition,
    committed_offsets,
    expected,
    read_committed,
    sent_records,
    transactional_producer,
    txn_id,
)
from tests.sidecar import ProcessSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_sigkill_between_produce_and_commit_commits_or_aborts_the_transaction_whole(
    pulsar, tmp_path
):
    sc = ProcessSidecar(pulsar, tmp_path).start()
    try:
        bootstrap = sc.kafka_bootstrap
        topic = create(bootstrap, 2, "txk")
        source = create(bootstrap, 1, "txksrc")
        group = txn_id("g")
        consumer = confluent_consumer(bootstrap, **{"group.id": group})
        metadata = consumer.consumer_group_metadata()
        consumer.close()
        producer = transactional_producer(
            bootstrap,
            txn_id(),
            **{
                "reconnect.backoff.max.ms": 500,
                "transaction.timeout.ms": 120_000,
            },
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        first = sent_records(producer, topic, 2, 200, "first-")  # journaled: answered 0
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 200)], metadata, 30)
        sc.kill()
        killed = time.monotonic()
        sc.start()
        print(f"\nsidecar down {time.monotonic() - killed:.1f}s")
        try:
            producer.commit_transaction(120)
            committed = True
        except KafkaException as exc:  # an abortable error: the transaction is aborted whole
            error = exc.args[0]
            assert error.txn_requires_abort(), error
            producer.abort_transaction(60)
            committed = False
        print(f"the first transaction was {'committed' if committed else 'aborted'}")
        producer.begin_transaction()
        second = sent_records(producer, topic, 2, 50, "second-")
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 250)], metadata, 30)
        producer.commit_transaction(60)
        kept = (first if committed else []) + second
        got = read_committed(bootstrap, topic, 2, len(kept))
        assert by_partition(got) == expected(kept)
        for p in range(2):
            assert [g.offset for g in got if g.partition == p] == list(range(len(kept) // 2))
        assert committed_offsets(bootstrap, group, source, 1) == {0: 250}
        assert not [e for e in producer.errors if e.fatal()]
    finally:
        sc.stop()
