"""Transactions through the Kafka listener with confluent-kafka (librdkafka): commit
across topics and partitions with the consumed offsets, abort, fencing by a second
instance, the transaction timeout. Read back with read_committed consumers (Fetch) and
the group's offsets (OffsetFetch)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from tests.integration.kafka_consume import confluent_consumer, create
from tests.integration.kafka_txn import (
    by_partition,
    committed_offsets,
    expected,
    high_watermarks,
    read_committed,
    sent_records,
    transactional_producer,
    txn_id,
    wait_for_transaction_state,
)

pytestmark = pytest.mark.integration


def _group_metadata(bootstrap: str, group: str):
    consumer = confluent_consumer(bootstrap, **{"group.id": group})
    return consumer, consumer.consumer_group_metadata()


def test_confluent_commit_shows_records_of_two_topics_once_and_commits_the_offsets(
    sidecar_kafka,
):
    a, b = create(sidecar_kafka, 3, "txa"), create(sidecar_kafka, 2, "txb")
    source = create(sidecar_kafka, 2, "txsrc")
    group = txn_id("g")
    consumer, metadata = _group_metadata(sidecar_kafka, group)
    producer = transactional_producer(sidecar_kafka, txn_id())
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        sent_a = sent_records(producer, a, 3, 40, "c-")
        sent_b = sent_records(producer, b, 2, 25, "c-")
        offsets = [TopicPartition(source, 0, 17), TopicPartition(source, 1, 5)]
        producer.send_offsets_to_transaction(offsets, metadata, 30)
        # journaled, not in the data topics: nothing is visible before the commit
        assert high_watermarks(sidecar_kafka, a, 3) == {0: 0, 1: 0, 2: 0}
        producer.commit_transaction(30)
    finally:
        consumer.close()
    got_a = read_committed(sidecar_kafka, a, 3, len(sent_a))
    got_b = read_committed(sidecar_kafka, b, 2, len(sent_b))
    assert by_partition(got_a) == expected(sent_a)
    assert by_partition(got_b) == expected(sent_b)
    for p in range(3):  # once each, at offsets 0..n-1
        assert [g.offset for g in got_a if g.partition == p] == list(range(40))
    assert committed_offsets(sidecar_kafka, group, source, 2) == {0: 17, 1: 5}
    assert producer.errors == []


def test_confluent_abort_shows_nothing_and_commits_no_offsets(sidecar_kafka):
    topic = create(sidecar_kafka, 2, "txab")
    source = create(sidecar_kafka, 1, "txsrc")
    group = txn_id("g")
    consumer, metadata = _group_metadata(sidecar_kafka, group)
    producer = transactional_producer(sidecar_kafka, txn_id())
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        sent_records(producer, topic, 2, 30, "a-")
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 30)], metadata, 30)
        producer.abort_transaction(30)
        producer.begin_transaction()
        committed = sent_records(producer, topic, 2, 10, "c-")
        producer.send_offsets_to_transaction([TopicPartition(source, 0, 10)], metadata, 30)
        producer.commit_transaction(30)
    finally:
        consumer.close()
    got = read_committed(sidecar_kafka, topic, 2, len(committed))
    assert by_partition(got) == expected(committed)  # the aborted records never show
    assert committed_offsets(sidecar_kafka, group, source, 1) == {0: 10}


def _fatal_fenced(exc: KafkaException) -> None:
    error = exc.args[0]
    assert error.fatal(), error
    assert error.code() == KafkaError._FENCED, error


def test_confluent_second_instance_fences_the_first_whose_records_never_show(sidecar_kafka):
    topic = create(sidecar_kafka, 2, "txf")
    tid = txn_id()
    first = transactional_producer(sidecar_kafka, tid)
    first.init_transactions(30)
    first.begin_transaction()
    sent_records(first, topic, 2, 10, "zombie-")
    second = transactional_producer(sidecar_kafka, tid)
    second.init_transactions(60)  # fences the first, aborts its transaction (51, retried)
    second.begin_transaction()
    kept = sent_records(second, topic, 2, 10, "new-")
    second.commit_transaction(30)
    with pytest.raises(KafkaException) as caught:
        first.commit_transaction(30)
    _fatal_fenced(caught.value)
    got = read_committed(sidecar_kafka, topic, 2, len(kept))
    assert by_partition(got) == expected(kept)


def test_confluent_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(
    sidecar, sidecar_kafka
):
    topic = create(sidecar_kafka, 1, "txto")
    tid = txn_id()
    # librdkafka caps each message's delivery timeout at the transaction's: 2 s let the
    # sends time out on a loaded machine before the test could watch the timeout abort
    producer = transactional_producer(sidecar_kafka, tid, **{"transaction.timeout.ms": 6000})
    producer.init_transactions(30)
    producer.begin_transaction()
    sent_records(producer, topic, 1, 10, "late-")
    wait_for_transaction_state(sidecar.url, tid, {"CompleteAbort"})
    with pytest.raises(KafkaException) as caught:
        producer.commit_transaction(30)
    _fatal_fenced(caught.value)
    assert high_watermarks(sidecar_kafka, topic, 1) == {0: 0}
