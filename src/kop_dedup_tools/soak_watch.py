"""What the soak reads through Kafka clients: the LSO watcher during the run, the
group's committed offsets and the input's end for the supervisor, and the output read
back read_committed at the end.

:class:`Watcher` runs threads while the copiers copy: ``askers`` (default 2) ask
ListOffsets with isolation READ_COMMITTED (confluent-kafka's ``AdminClient.list_offsets``,
each its own client) for every output partition in a loop, out of step with each other
(a copy in progress is a window of a few hundred milliseconds: more askers see more of
them), and one is a read_committed consumer assigned to every
output partition with ``enable.partition.eof``, noting the offset where it reached the
end each time (the end the sidecar's Fetch answered). Both kinds of answer are
:class:`~kop_dedup_tools.soak_check.Answer` s, judged at the end against where each
committed transaction's copies landed.

librdkafka's own log lines (a sidecar gone, a broker paused) go to the logger given,
not to the terminal.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from kop_dedup_tools.soak_check import ATTEMPT_HEADER, Answer, OutRecord

__all__ = ["KafkaSide", "Watcher", "read_committed"]


def _latest() -> OffsetSpec:
    spec: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    return spec


def _text(raw: str | bytes | None) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else (raw or "")


def _tps(topics: Mapping[str, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]


class KafkaSide:
    """Short Kafka calls through the sidecars' listeners (``bootstrap``)."""

    def __init__(self, bootstrap: str, logger: logging.Logger) -> None:
        self.bootstrap, self.logger = bootstrap, logger
        self._admin: AdminClient | None = None
        self._groups: dict[str, Consumer] = {}

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "logger": self.logger, **extra}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.config())
        return self._admin

    def ends(self, topics: Mapping[str, int], *, committed: bool) -> dict[tuple[str, int], int]:
        """ListOffsets LATEST (isolation READ_COMMITTED when ``committed``); raises when a
        partition has no answer (an offset below 0 is none)."""
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        futures = self.admin.list_offsets(
            {tp: _latest() for tp in _tps(topics)},
            isolation_level=level,
            request_timeout=10,
        )
        out = {(tp.topic, tp.partition): f.result(timeout=15).offset for tp, f in futures.items()}
        if any(offset < 0 for offset in out.values()):
            raise ValueError(f"ListOffsets answered no offset: {out}")
        return out

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed offsets (partitions it never committed: 0)."""
        consumer = self._groups.get(group)
        if consumer is None:
            consumer = Consumer(self.config(**{"group.id": group, "enable.auto.commit": False}))
            self._groups[group] = consumer
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 15)
        return {tp.partition: max(tp.offset, 0) for tp in got}

    def produce(
        self, topic: str, records: list[tuple[int, str]], *, timeout: float
    ) -> tuple[list[str], list[str]]:
        """Send (partition, value) records with an idempotent producer (key = value) and
        wait up to ``timeout``: (values acknowledged, values not acknowledged)."""
        acked: list[str] = []
        failed: list[str] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            (failed if err is not None else acked).append(msg.value().decode())

        producer = Producer(
            self.config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 5})
        )
        for partition, value in records:
            while True:
                try:
                    producer.produce(
                        topic, value, value, partition=partition, on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        left = producer.flush(timeout)
        if left:
            producer.purge()
            producer.flush(5)
        sent = set(acked) | set(failed)
        failed += [v for _, v in records if v not in sent]
        return acked, failed

    def close(self) -> None:
        for consumer in self._groups.values():
            consumer.close()
        self._groups.clear()


class Watcher:
    """The LSO watcher (see the module docstring); :attr:`answers` grows while it runs."""

    def __init__(
        self,
        side: KafkaSide,
        topics: Mapping[str, int],
        clock: Callable[[], float],
        *,
        interval_s: float = 0.05,
        askers: int = 2,
    ) -> None:
        self._side, self._topics, self._clock = side, dict(topics), clock
        self._interval = interval_s
        self.answers: list[Answer] = []
        self.errors: Counter[str] = Counter()
        self.consumed = 0
        self._halt = threading.Event()
        self._threads = [
            *(
                threading.Thread(target=self._list_offsets, name=f"soak-lso-{i}", daemon=True)
                for i in range(askers)
            ),
            threading.Thread(target=self._consume, name="soak-eof", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._halt.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _list_offsets(self) -> None:
        admin = AdminClient(self._side.config())
        request = {tp: _latest() for tp in _tps(self._topics)}
        while not self._halt.is_set():
            futures = admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=5
            )
            for tp, future in futures.items():
                try:
                    offset = future.result(timeout=10).offset
                except Exception as exc:  # a fault: ask again
                    self.errors[f"list-offsets {type(exc).__name__}"] += 1
                    continue
                if offset < 0:  # no offset: not an answer
                    self.errors["list-offsets answered no offset"] += 1
                    continue
                self.answers.append(
                    Answer(self._clock(), tp.topic, tp.partition, offset, "list-offsets")
                )
            self._halt.wait(self._interval)

    def _consume(self) -> None:
        consumer = Consumer(
            self._side.config(
                **{
                    "group.id": f"soak-watch-{uuid.uuid4().hex[:8]}",  # assigned, never joins
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 100,
                }
            )
        )
        consumer.assign(
            [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in _tps(self._topics)]
        )
        try:
            while not self._halt.is_set():
                for msg in consumer.consume(1000, 0.5):
                    err = msg.error()
                    if err is None:
                        self.consumed += 1
                    elif err.code() == KafkaError._PARTITION_EOF:
                        self.answers.append(
                            Answer(
                                self._clock(),
                                str(msg.topic()),
                                int(msg.partition() or 0),
                                int(msg.offset() or 0),
                                "consumer-eof",
                            )
                        )
                    else:
                        self.errors[f"consumer {err.name()}"] += 1
        finally:
            consumer.close()


def read_committed(
    side: KafkaSide, topic: str, ends: Mapping[int, int], *, timeout: float = 120.0
) -> list[OutRecord]:
    """Every record of ``topic`` read read_committed from the beginning up to ``ends``
    (per partition; the reader stops at a partition's end once it has reached it)."""
    consumer = Consumer(
        side.config(
            **{
                "group.id": f"soak-read-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    out: list[OutRecord] = []
    reached = {p: end == 0 for p, end in ends.items()}
    deadline = time.monotonic() + timeout
    try:
        while not all(reached.values()):
            if time.monotonic() > deadline:
                short = {p: e for p, e in ends.items() if not reached[p]}
                raise TimeoutError(f"reading {topic} read_committed did not reach {short}")
            for msg in consumer.consume(1000, 1.0):
                err = msg.error()
                if err is not None:
                    partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                    if err.code() == KafkaError._PARTITION_EOF and offset >= ends[partition]:
                        reached[partition] = True
                    continue
                headers = dict(msg.headers() or [])
                attempt = headers.get(ATTEMPT_HEADER)
                out.append(
                    OutRecord(
                        int(msg.partition() or 0),
                        int(msg.offset() or 0),
                        _text(msg.value()),
                        None if attempt is None else _text(attempt),
                    )
                )
    finally:
        consumer.close()
    return out
