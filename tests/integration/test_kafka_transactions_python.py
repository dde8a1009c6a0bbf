"""Transactions through the Kafka listener with kafka-python and aiokafka: commit across
topics and partitions with the consumed offsets, abort, fencing by a second instance.
Each client reads back with its own read_committed consumer."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.kafka_consume import Got, aiokafka_read, create, kafka_python_read
from tests.integration.kafka_txn import committed_offsets, expected, txn_id

pytestmark = pytest.mark.integration

Sent = list[tuple[int, bytes, bytes]]


def _records(topic: str, partitions: int, per_partition: int, tag: str) -> Sent:
    return [
        (p, f"k{p}-{i}".encode(), f"{tag}{topic}-{p}-{i}".encode())
        for i in range(per_partition)
        for p in range(partitions)
    ]


def _seen(got: list[Got]) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    by: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for g in sorted(got, key=lambda g: (g.partition, g.offset)):
        by.setdefault(g.partition, []).append((g.key, g.value))
    return by


# -- kafka-python ---------------------------------------------------------------------


def _kp_producer(bootstrap: str, tid: str):
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=tid, enable_idempotence=True, linger_ms=5
    )


def _kp_send(producer, topic: str, records: Sent) -> None:
    futures = [producer.send(topic, value=v, key=k, partition=p) for p, k, v in records]
    producer.flush(60)
    for f in futures:
        f.get(timeout=60)


def _kp_read(bootstrap: str, topic: str, partitions: int, expect: int) -> list[Got]:
    return kafka_python_read(
        bootstrap, topic, list(range(partitions)), expect, isolation_level="read_committed"
    )


def test_kafka_python_commit_and_abort_show_the_committed_records_and_offsets_once(
    sidecar_kafka,
):
    from kafka import OffsetAndMetadata, TopicPartition

    a, b = create(sidecar_kafka, 3, "kpa"), create(sidecar_kafka, 2, "kpb")
    source = create(sidecar_kafka, 2, "kpsrc")
    group = txn_id("g")
    producer = _kp_producer(sidecar_kafka, txn_id())
    try:
        producer.init_transactions()
        producer.begin_transaction()
        _kp_send(producer, a, _records(a, 3, 15, "aborted-"))
        producer.send_offsets_to_transaction(
            {TopicPartition(source, 0): OffsetAndMetadata(99, "", -1)}, group
        )
        producer.abort_transaction()
        producer.begin_transaction()
        sent_a, sent_b = _records(a, 3, 20, "c-"), _records(b, 2, 10, "c-")
        _kp_send(producer, a, sent_a)
        _kp_send(producer, b, sent_b)
        producer.send_offsets_to_transaction(
            {
                TopicPartition(source, 0): OffsetAndMetadata(7, "", -1),
                TopicPartition(source, 1): OffsetAndMetadata(3, "", -1),
            },
            group,
        )
        producer.commit_transaction()
    finally:
        producer.close(timeout=10)
    assert _seen(_kp_read(sidecar_kafka, a, 3, len(sent_a))) == expected(sent_a)
    assert _seen(_kp_read(sidecar_kafka, b, 2, len(sent_b))) == expected(sent_b)
    assert committed_offsets(sidecar_kafka, group, source, 2) == {0: 7, 1: 3}


def test_kafka_python_second_instance_fences_the_first(sidecar_kafka):
    from kafka.errors import ProducerFencedError

    topic = create(sidecar_kafka, 2, "kpf")
    tid = txn_id()
    first = _kp_producer(sidecar_kafka, tid)
    second = _kp_producer(sidecar_kafka, tid)
    try:
        first.init_transactions()
        first.begin_transaction()
        _kp_send(first, topic, _records(topic, 2, 5, "zombie-"))
        second.init_transactions()
        second.begin_transaction()
        kept = _records(topic, 2, 5, "new-")
        _kp_send(second, topic, kept)
        second.commit_transaction()
        with pytest.raises(ProducerFencedError):
            first.commit_transaction()
    finally:
        first.close(timeout=10)
        second.close(timeout=10)
    assert _seen(_kp_read(sidecar_kafka, topic, 2, len(kept))) == expected(kept)


# -- aiokafka ---------------------------------------------------------------------------


def _aio_read(bootstrap: str, topic: str, partitions: int, expect: int) -> list[Got]:
    return aiokafka_read(
        bootstrap, topic, list(range(partitions)), expect, isolation_level="read_committed"
    )


async def _aio_send(producer, topic: str, records: Sent) -> None:
    futures = [await producer.send(topic, value=v, key=k, partition=p) for p, k, v in records]
    await asyncio.gather(*futures)


def test_aiokafka_commit_and_abort_show_the_committed_records_and_offsets_once(sidecar_kafka):
    from aiokafka import AIOKafkaProducer, TopicPartition

    a, b = create(sidecar_kafka, 3, "aka"), create(sidecar_kafka, 2, "akb")
    source = create(sidecar_kafka, 2, "aksrc")
    group = txn_id("g")
    sent_a, sent_b = _records(a, 3, 20, "c-"), _records(b, 2, 10, "c-")

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=sidecar_kafka, transactional_id=txn_id(), enable_idempotence=True
        )
        await producer.start()
        try:
            await producer.begin_transaction()
            await _aio_send(producer, a, _records(a, 3, 15, "aborted-"))
            await producer.send_offsets_to_transaction({TopicPartition(source, 0): 99}, group)
            await producer.abort_transaction()
            async with producer.transaction():
                await _aio_send(producer, a, sent_a)
                await _aio_send(producer, b, sent_b)
                await producer.send_offsets_to_transaction(
                    {TopicPartition(source, 0): 7, TopicPartition(source, 1): 3}, group
                )
        finally:
            await producer.stop()

    asyncio.run(run())
    assert _seen(_aio_read(sidecar_kafka, a, 3, len(sent_a))) == expected(sent_a)
    assert _seen(_aio_read(sidecar_kafka, b, 2, len(sent_b))) == expected(sent_b)
    assert committed_offsets(sidecar_kafka, group, source, 2) == {0: 7, 1: 3}


def test_aiokafka_second_instance_fences_the_first(sidecar_kafka):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import ProducerFenced

    topic = create(sidecar_kafka, 2, "akf")
    tid = txn_id()
    kept = _records(topic, 2, 5, "new-")

    async def run() -> None:
        first = AIOKafkaProducer(
            bootstrap_servers=sidecar_kafka, transactional_id=tid, enable_idempotence=True
        )
        second = AIOKafkaProducer(
            bootstrap_servers=sidecar_kafka, transactional_id=tid, enable_idempotence=True
        )
        await first.start()
        try:
            await first.begin_transaction()
            await _aio_send(first, topic, _records(topic, 2, 5, "zombie-"))
            await second.start()  # fences the first and aborts its transaction
            async with second.transaction():
                await _aio_send(second, topic, kept)
            with pytest.raises(ProducerFenced):
                await first.commit_transaction()
        finally:
            await first.stop()
            await second.stop()

    asyncio.run(run())
    assert _seen(_aio_read(sidecar_kafka, topic, 2, len(kept))) == expected(kept)
