"""The Kafka clients of ``kop-dedup bench --kafka`` and ``--kafka --groups``: the
producers' configuration, topics made through a Kafka AdminClient, a topic filled
(:func:`fill`), read to its end by Pulsar readers (:func:`read_direct`), one Pulsar
consumer of all its partitions (:func:`consume_direct`) or a Kafka read_committed
consumer that assigns its partitions (:func:`read_kafka`), and the throwaway real Kafka
of ``--against-kafka`` (:func:`real_kafka`).

Each side's read is timed from its start (reader or consumer created) to its last
record and to its first (:class:`Read`), with the reading process's CPU seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench.support import say, step

__all__ = [
    "PRODUCER_CONFIG",
    "RECORDS_PER_BATCH",
    "Deliveries",
    "Read",
    "consume_direct",
    "create",
    "fill",
    "kafka_producer",
    "produce_all",
    "read_direct",
    "read_kafka",
    "real_kafka",
    "warm",
]

RECORDS_PER_BATCH = 100
PRODUCER_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "batch.num.messages": RECORDS_PER_BATCH,
    "batch.size": 1 << 20,  # never the limit: 100 records of 100 bytes are ~10 kB
    "linger.ms": 20,  # a batch waits for its 100th record, which comes within microseconds
    "queue.buffering.max.messages": 10 * RECORDS_PER_BATCH,  # 5 in flight, 5 waiting
}
"""What every Kafka producer of the run is given besides its bootstrap (and its
transactional id)."""


def kafka_producer(bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Producer  # noqa: PLC0415 - the bench's own dependency

    return Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG, **extra})


def produce_all(producer: Any, topic: str, value: bytes, n: int, partition: int = 0) -> None:
    """``n`` records into ``partition``, waiting (serving callbacks) while the queue is
    full."""
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, value, partition=partition)
                break
            except BufferError:
                producer.poll(0.001)
    producer.poll(0)


def warm(producers: list[Any], topic: str, partitions: int = 1) -> None:
    """Connect, learn the metadata and the producer ids before the clock starts (producer
    ``i`` on partition ``i % partitions``, where it will write)."""
    for i, p in enumerate(producers):
        p.produce(topic, b"warm-up", partition=i % partitions)
    for p in producers:
        if p.flush(60):
            raise RuntimeError(f"a warm-up record to {topic} was not delivered within 60 s")


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """A topic of ``partitions`` partitions through a Kafka AdminClient (the listener's or
    the real Kafka's)."""
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415
    from confluent_kafka.cimpl import NewTopic  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


class Deliveries:
    """Delivery reports: how many came, a latency per batch (every 100th record's), the
    first failure."""

    def __init__(self) -> None:
        self.count = 0
        self.latencies: list[float] = []
        self.failure: Any = None

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failure = self.failure or err
            return
        if self.count % RECORDS_PER_BATCH == 0:
            self.latencies.append(msg.latency() or 0.0)
        self.count += 1


def fill(bootstrap: str, topic: str, partitions: int, records: int, size: int, batch: int) -> None:
    from confluent_kafka import Producer  # noqa: PLC0415 - a measurement's own dependency

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 100,
            "batch.num.messages": batch,
            "batch.size": 10 << 20,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i).encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("the fill did not flush within 300 s")


@dataclass(frozen=True, slots=True)
class Read:
    """One side's read of a topic: seconds from its start (reader, consumer or
    subscription created) to its last record and to its first, and the reading
    process's CPU seconds."""

    seconds: float
    cpu: float
    first_s: float | None


def read_direct(service_url: str, ptopics: list[str], records: int) -> Read:
    """Pulsar readers of the partition topics, one after another."""
    import pulsar  # noqa: PLC0415 - a measurement's own dependency

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        started, cpu = time.monotonic(), time.process_time()
        got, first = 0, None
        for ptopic in ptopics:
            reader = client.create_reader(ptopic, pulsar.MessageId.earliest)
            while reader.has_message_available():
                msg = reader.read_next(10_000)
                msg.data()
                got += 1
                first = first or time.monotonic() - started
            reader.close()
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    finally:
        client.close()
    if got != records:
        raise RuntimeError(f"direct: read {got} records, expected {records}")
    return Read(elapsed, cpu, first)


def consume_direct(service_url: str, topic: str, records: int) -> Read:
    """One Pulsar consumer of every partition of ``topic`` (the partitioned topic's full
    name) at once, from the earliest message: a subscription of its own, dropped after."""
    import pulsar  # noqa: PLC0415 - a measurement's own dependency

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        started, cpu = time.monotonic(), time.process_time()
        consumer = client.subscribe(
            topic,
            f"bench-{uuid.uuid4().hex[:8]}",
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        got, first = 0, None
        deadline = started + 600
        while got < records and time.monotonic() < deadline:
            try:
                msg = consumer.receive(1_000)
            except pulsar.Timeout:
                continue
            msg.data()
            got += 1
            first = first or time.monotonic() - started
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
        consumer.unsubscribe()
    finally:
        client.close()
    if got != records:
        raise RuntimeError(f"direct: consumed {got} records, expected {records}")
    return Read(elapsed, cpu, first)


def read_kafka(bootstrap: str, topic: str, partitions: int, records: int) -> Read:
    """A read_committed consumer that assigns every partition from the beginning."""
    from confluent_kafka import (  # noqa: PLC0415 - a measurement's own dependency
        OFFSET_BEGINNING,
        Consumer,
        TopicPartition,
    )

    started, cpu = time.monotonic(), time.process_time()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got, first = 0, None
        deadline = started + 600
        while got < records and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if msg.error() is None:
                    got += 1
                    first = first or time.monotonic() - started
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    finally:
        consumer.close()
    if got != records:
        raise RuntimeError(f"kafka: read {got} records, expected {records}")
    return Read(elapsed, cpu, first)


@contextlib.contextmanager
def real_kafka(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    """A throwaway Apache Kafka (one KRaft node, free ports) for the run, stopped and
    wiped after (its log kept in ``out``); nothing without ``--against-kafka``."""
    if not args.against_kafka:
        yield {}
        return
    from kop_dedup_tools import kafka_jars  # noqa: PLC0415
    from kop_dedup_tools.kafka_broker import LocalKafka  # noqa: PLC0415

    broker = LocalKafka.throwaway(out.resolve() / "kafka-logs")
    say(
        f"bench: starting Apache Kafka {kafka_jars.KAFKA_VERSION} for the run "
        f"({broker.bootstrap}, log {broker.log_file})"
    )
    try:
        with step(f"starting Apache Kafka (log {broker.log_file})"):
            seconds = broker.start()
        say(f"bench: Kafka ready in {seconds:.0f}s")
        yield {
            "bootstrap": broker.bootstrap,
            "version": kafka_jars.KAFKA_VERSION,
            "heap": broker.heap,
            "log": str(broker.log_file),
        }
    finally:
        broker.wipe()
