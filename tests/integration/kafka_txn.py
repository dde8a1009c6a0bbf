"""Helpers of the Kafka transaction tests: transactional confluent-kafka producers, the
records they send, and what read_committed consumers and the group's offsets show."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from tests.integration.kafka_consume import Got, confluent_consumer

__all__ = [
    "TxnProducer",
    "by_partition",
    "committed_offsets",
    "expected",
    "high_watermarks",
    "read_committed",
    "sent_records",
    "transactional_producer",
    "txn_id",
    "wait_for_transaction_state",
]


def txn_id(stem: str = "tx") -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


class TxnProducer(Producer):
    """A confluent-kafka producer that keeps the errors its ``error_cb`` was given."""

    errors: list[KafkaError]


def transactional_producer(bootstrap: str, transactional_id: str, **conf: Any) -> TxnProducer:
    """A confluent-kafka transactional producer whose errors are kept in ``.errors``."""
    seen: list[KafkaError] = []
    producer = TxnProducer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            "error_cb": seen.append,
            **conf,
        }
    )
    producer.errors = seen
    return producer


def sent_records(
    producer: Any, topic: str, partitions: int, per_partition: int, tag: str
) -> list[tuple[int, bytes, bytes]]:
    """Send ``per_partition`` records to each partition (confluent-kafka), flush, and
    return (partition, key, value) in order; every delivery must succeed."""
    out = [
        (p, f"k{p}-{i}".encode(), f"{tag}{topic}-{p}-{i}".encode())
        for i in range(per_partition)
        for p in range(partitions)
    ]
    failed: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    for p, key, value in out:
        producer.produce(topic, value=value, key=key, partition=p, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert failed == []
    return out


def expected(records: list[tuple[int, bytes, bytes]]) -> dict[int, list[tuple[bytes, bytes]]]:
    by: dict[int, list[tuple[bytes, bytes]]] = {}
    for p, key, value in records:
        by.setdefault(p, []).append((key, value))
    return by


def read_committed(
    bootstrap: str, topic: str, partitions: int, expect: int, timeout: float = 60.0
) -> list[Got]:
    """Every record a read_committed consumer (confluent-kafka, assign mode) sees from the
    beginning: at least ``expect`` of them, and on to each partition's end after the
    last (so that any extra record shows)."""
    consumer = confluent_consumer(
        bootstrap, **{"isolation.level": "read_committed", "enable.partition.eof": True}
    )
    got: list[Got] = []
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(got) < expect or len(at_end) < partitions:
            assert time.monotonic() < deadline, f"read {len(got)} of {expect} from {topic}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            got.append(Got(msg.partition(), msg.offset(), msg.key(), msg.value()))
        return got
    finally:
        consumer.close()


def by_partition(got: list[Got]) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    by: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for g in got:
        by.setdefault(g.partition, []).append((g.key, g.value))
    return by


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = confluent_consumer(bootstrap)
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch, require_stable: waits out a commit
    being applied); -1001 for none."""
    consumer = confluent_consumer(bootstrap, **{"group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def wait_for_transaction_state(
    http_url: str, transactional_id: str, states: set[str], timeout: float = 30.0
) -> dict[str, Any]:
    """Poll ``GET /v1/transactions/{id}`` until its state is one of ``states``."""
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    with httpx.Client(base_url=http_url, timeout=30) as client:
        while time.monotonic() < deadline:
            answer = client.get(f"/v1/transactions/{transactional_id}")
            if answer.status_code == 200:
                seen = answer.json()
                if seen["state"] in states:
                    return seen
            time.sleep(0.1)
    raise AssertionError(f"{transactional_id} not in {states} after {timeout}s: {seen}")
