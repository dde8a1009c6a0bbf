"""Conformance: the same scenario against a real Apache Kafka broker and against the
sidecar's Kafka listener, observations compared.

A scenario is a function of a :class:`Target` (a bootstrap address with admin, produce
and read helpers, confluent-kafka underneath) that returns an observation: plain,
comparable data (error codes seen, records visible per partition, offsets when the
scenario means them to match). It makes its own topics with :meth:`Target.create_topic`
and never puts a topic name, a timestamp or anything else per-run into the
observation. A test then reads::

    def test_commit_then_abort_shows_only_the_commit(conformance):
        kafka, sidecar = conformance
        assert observe(kafka) == observe(sidecar)

or, with the ``observe_both`` fixture, ``seen = observe_both(observe)`` and
``assert seen.kafka == seen.sidecar``. Both fixtures (``tests/conftest.py``) take the
session's reference broker (``kafka_reference``) and the fixture ``sidecar_kafka``
(the listener's bootstrap address, ``"host:port"``, or an object with a ``bootstrap``
attribute); without that fixture they skip.

Not every difference is a bug: with double journaling a read_uncommitted consumer of
the sidecar sees only committed records, and offsets around transactions differ (Kafka
spends one on each commit or abort marker). A scenario observes what the contract
says must agree.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

__all__ = [
    "Delivery",
    "Observed",
    "Record",
    "Target",
    "by_partition",
    "commit_then_abort",
    "keys_values",
    "observe_both",
    "records",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery report: ``error`` is 0 or the code the client saw (Kafka's codes as
    Kafka numbers them; librdkafka's local errors are negative)."""

    partition: int
    offset: int
    error: int
    error_name: str


Partitions = dict[int, tuple[Record, ...]]


def _dotted(conf: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("_", "."): v for k, v in conf.items()}


def keys_values(partitions: Partitions) -> dict[int, tuple[tuple[bytes | None, bytes | None], ...]]:
    """The records per partition without their offsets."""
    return {p: tuple((r.key, r.value) for r in recs) for p, recs in partitions.items()}


@dataclass(frozen=True)
class Target:
    """One server that speaks Kafka: ``name`` is ``kafka`` or ``sidecar``."""

    name: str
    bootstrap: str
    timeout: float = 60.0
    """Seconds for each wait (a topic's creation, a flush, a read to the end...)."""

    # -- names and clients -------------------------------------------------------------

    def unique(self, stem: str = "t") -> str:
        return f"{stem}-{uuid.uuid4().hex[:10]}"

    def config(self, **conf: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **conf}

    def admin(self) -> AdminClient:
        return AdminClient(self.config())

    def producer(self, **conf: Any) -> Producer:
        """A confluent-kafka producer. librdkafka's keys are dotted; spell them with
        underscores here (``enable_idempotence=True`` is ``enable.idempotence``)."""
        return Producer(self.config(**_dotted(conf)))

    def consumer(self, **conf: Any) -> Consumer:
        """A confluent-kafka consumer in a group of its own, committing nothing unless
        told (underscored keys as for :meth:`producer`)."""
        settings = {"group.id": self.unique("g"), "enable.auto.commit": False} | _dotted(conf)
        return Consumer(self.config(**settings))

    # -- admin -------------------------------------------------------------------------

    def create_topic(self, partitions: int = 1, stem: str = "t") -> str:
        """A new topic of ``partitions`` partitions, visible in metadata when this returns."""
        name = self.unique(stem)
        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=self.timeout,
        )
        futures[name].result(timeout=self.timeout)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            meta = admin.list_topics(name, timeout=self.timeout).topics.get(name)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions:
                return name
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: topic {name} not in metadata after {self.timeout}s")

    def end_offsets(self, topic: str, partitions: int, *, committed: bool = True) -> dict[int, int]:
        """Each partition's end: the last stable offset (``committed``, a read_committed
        consumer's end) or the high watermark."""
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        admin = self.admin()  # held until the answers are in: a collected client drops them
        futures = admin.list_offsets(
            {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
            isolation_level=level,
            request_timeout=self.timeout,
        )
        return {tp.partition: f.result(timeout=self.timeout).offset for tp, f in futures.items()}

    def settled(self, topic: str, partitions: int) -> dict[int, int]:
        """Wait until no transaction is open or half-finished on ``topic`` (every last
        stable offset reached its high watermark: the commit markers are written);
        return the ends."""
        deadline = time.monotonic() + self.timeout
        while True:
            stable = self.end_offsets(topic, partitions, committed=True)
            high = self.end_offsets(topic, partitions, committed=False)
            if stable == high:
                return high
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: {topic} unsettled: stable {stable}, high {high}"
                )
            time.sleep(0.1)

    # -- produce and read --------------------------------------------------------------

    def produce(
        self,
        topic: str,
        records: Iterable[tuple[int, bytes | None, bytes | None]],
        producer: Producer | None = None,
        **conf: Any,
    ) -> list[Delivery]:
        """Send ``(partition, key, value)`` records (with ``producer``, or a new one made of
        ``conf``), flush, and return the delivery reports in the order they came."""
        reports: list[Delivery] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            reports.append(
                Delivery(
                    msg.partition(),
                    msg.offset() if err is None else -1,
                    0 if err is None else err.code(),
                    "NONE" if err is None else err.name(),
                )
            )

        p = producer if producer is not None else self.producer(**conf)
        sent = 0
        for partition, key, value in records:
            p.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
            sent += 1
            p.poll(0)
        left = p.flush(self.timeout)
        if left:
            raise AssertionError(f"{self.name}: {left} of {sent} records unflushed")
        return reports

    def read(
        self,
        topic: str,
        partitions: int,
        *,
        isolation: str = "read_committed",
        settle: bool = True,
        **conf: Any,
    ) -> Partitions:
        """Every record of ``topic`` a fresh consumer sees from the beginning to the end of
        each partition (``settle``: once no transaction is half-finished)."""
        if settle:
            self.settled(topic, partitions)
        consumer = self.consumer(
            isolation_level=isolation,
            enable_partition_eof=True,
            auto_offset_reset="earliest",
            **conf,
        )
        out: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        at_end: set[int] = set()
        try:
            consumer.assign(
                [TopicPartition(topic, p, -2) for p in range(partitions)]
            )  # -2: beginning
            deadline = time.monotonic() + self.timeout
            while len(at_end) < partitions:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{self.name}: {topic} partitions {sorted(set(out) - at_end)} not read "
                        f"to their end within {self.timeout}s"
                    )
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                        continue
                    raise KafkaException(err)
                at_end.discard(msg.partition())
                out[msg.partition()].append(Record(msg.offset(), msg.key(), msg.value()))
        finally:
            consumer.close()
        return {p: tuple(recs) for p, recs in out.items()}


@dataclass(frozen=True, slots=True)
class Observed(Generic[T]):
    kafka: T
    sidecar: T


def observe_both(scenario: Callable[[Target], T], *, kafka: Target, sidecar: Target) -> Observed[T]:
    """Run ``scenario`` against Kafka, then against the sidecar (each on its own topics)."""
    return Observed(kafka=scenario(kafka), sidecar=scenario(sidecar))


# -- scenarios -----------------------------------------------------------------------

Records = list[tuple[int, bytes, bytes]]


def records(partitions: int, per_partition: int, tag: str = "") -> Records:
    """(partition, key, value) round robin over the partitions; values name their place."""
    return [
        (p, f"k{p}-{i}".encode(), f"{tag}v{p}-{i}".encode())
        for i in range(per_partition)
        for p in range(partitions)
    ]


def by_partition(recs: Records) -> dict[int, tuple[tuple[bytes, bytes], ...]]:
    """What a reader of ``recs`` should see per partition (as :func:`keys_values` gives)."""
    out: dict[int, list[tuple[bytes, bytes]]] = {}
    for p, k, v in recs:
        out.setdefault(p, []).append((k, v))
    return {p: tuple(kv) for p, kv in out.items()}


def commit_then_abort(
    target: Target,
    *,
    abort_second: bool = True,
    isolation_levels: tuple[str, ...] = ("read_committed",),
) -> dict[str, object]:
    """Two transactions of 20 records per partition on a 2-partition topic, the second
    aborted (or committed): the delivery errors seen and what a consumer of each
    isolation level reads (``c-`` values from the first, ``a-`` from the second)."""
    topic = target.create_topic(partitions=2)
    producer = target.producer(transactional_id=target.unique("tx"), enable_idempotence=True)
    producer.init_transactions(target.timeout)
    producer.begin_transaction()
    first = target.produce(topic, records(2, 20, "c-"), producer=producer)
    producer.commit_transaction(target.timeout)
    producer.begin_transaction()
    second = target.produce(topic, records(2, 20, "a-"), producer=producer)
    if abort_second:
        producer.abort_transaction(target.timeout)
    else:
        producer.commit_transaction(target.timeout)
    seen: dict[str, object] = {"errors": sorted({r.error_name for r in first + second})}
    for level in isolation_levels:
        seen[level] = keys_values(target.read(topic, 2, isolation=level))
    return seen
