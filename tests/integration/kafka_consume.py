"""Helpers of the Kafka consume tests: produce with a real idempotent producer, read
back with each client in assign mode (no group subscription)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = [
    "Got",
    "aiokafka_read",
    "batches",
    "confluent_consumer",
    "confluent_read",
    "create",
    "fetch_request",
    "kafka_python_read",
    "list_offsets_request",
    "offset_commit_request",
    "offset_fetch_request",
    "produce",
    "topic_name",
]


@dataclass(frozen=True, slots=True)
class Got:
    """One record as a consumer saw it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = -1
    headers: tuple[tuple[str, bytes | None], ...] = ()


def topic_name(stem: str = "kc") -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


def create(bootstrap: str, partitions: int = 1, stem: str = "kc") -> str:
    topic = topic_name(stem)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)
    return topic


def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[int, bytes | None, bytes | None]],
    **conf: Any,
) -> list[Got]:
    """Send (partition, key, value) with an idempotent confluent-kafka producer; the
    delivery reports (partition, offset) in the order they came, every one a success."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            **conf,
        }
    )
    out: list[Got] = []
    failures: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(err)
        else:
            out.append(Got(msg.partition(), msg.offset(), msg.key(), msg.value()))

    for partition, key, value in records:
        producer.produce(topic, value=value, key=key, partition=partition, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert failures == []
    return out


def confluent_consumer(bootstrap: str, **conf: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            **conf,
        }
    )


def confluent_read(
    consumer: Consumer,
    assignment: list[TopicPartition],
    expect: int,
    timeout: float = 60.0,
) -> list[Got]:
    """Assign, then poll until ``expect`` records came (or the deadline)."""
    consumer.assign(assignment)
    out: list[Got] = []
    deadline = time.monotonic() + timeout
    while len(out) < expect and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(err)
        out.append(
            Got(
                msg.partition(),
                msg.offset(),
                msg.key(),
                msg.value(),
                msg.timestamp()[1],
                tuple(msg.headers() or ()),
            )
        )
    return out


def kafka_python_read(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    expect: int,
    *,
    start: dict[int, int] | None = None,
    committed: bool = False,
    timeout: float = 60.0,
    **conf: Any,
) -> list[Got]:
    """Read ``partitions`` from the beginning, from ``start``, or (``committed``) from the
    offsets committed for the ``group_id`` given in ``conf``."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPythonTP

    conf.setdefault("group_id", None)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **conf)
    try:
        tps = [KafkaPythonTP(topic, p) for p in partitions]
        consumer.assign(tps)
        if not committed and start is None:
            consumer.seek_to_beginning(*tps)
        elif not committed:
            for tp in tps:
                consumer.seek(tp, start[tp.partition])
        out: list[Got] = []
        deadline = time.monotonic() + timeout
        while len(out) < expect and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                out.extend(
                    Got(
                        tp.partition,
                        m.offset,
                        m.key,
                        m.value,
                        m.timestamp,
                        tuple((k, v) for k, v in m.headers),
                    )
                    for m in msgs
                )
        return out
    finally:
        consumer.close()


def aiokafka_read(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    expect: int,
    *,
    start: dict[int, int] | None = None,
    committed: bool = False,
    timeout: float = 60.0,
    **conf: Any,
) -> list[Got]:
    """As :func:`kafka_python_read`, with aiokafka."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTP

    async def run() -> list[Got]:
        conf.setdefault("group_id", None)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **conf)
        await consumer.start()
        try:
            tps = [AioTP(topic, p) for p in partitions]
            consumer.assign(tps)
            if not committed and start is None:
                await consumer.seek_to_beginning(*tps)
            elif not committed:
                for tp in tps:
                    consumer.seek(tp, start[tp.partition])
            out: list[Got] = []
            deadline = time.monotonic() + timeout
            while len(out) < expect and time.monotonic() < deadline:
                got = await consumer.getmany(timeout_ms=500)
                for tp, msgs in got.items():
                    out.extend(
                        Got(
                            tp.partition,
                            m.offset,
                            m.key,
                            m.value,
                            m.timestamp,
                            tuple((k, v) for k, v in m.headers),
                        )
                        for m in msgs
                    )
            return out
        finally:
            await consumer.stop()

    return asyncio.run(run())


# -- bare requests (tests/kafka_wire.py's WireClient sends them) ---------------------------


def fetch_request(
    topic: str,
    partitions: dict[int, int],
    *,
    max_wait_ms: int = 500,
    min_bytes: int = 1,
    max_bytes: int = 50 << 20,
    partition_max_bytes: int = 1 << 20,
    isolation_level: int = 0,
    session_id: int = 0,
    session_epoch: int = -1,
) -> Any:
    """A Fetch of ``partitions`` ({partition: fetch offset}) of one topic."""
    from kafka.protocol.consumer import FetchRequest

    t = FetchRequest.FetchTopic
    p = t.FetchPartition
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=[
            t(
                topic=topic,
                partitions=[
                    p(
                        partition=index,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=partition_max_bytes,
                    )
                    for index, offset in partitions.items()
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def batches(records: bytes) -> list[Any]:
    """The record batches of a Fetch answer's records, decoded (kafka-python's reader,
    another implementation than the one that built them)."""
    from kafka.record.default_records import DefaultRecordBatch

    out = []
    view = memoryview(records or b"")
    at = 0
    while at + 12 <= len(view):
        length = int.from_bytes(view[at + 8 : at + 12], "big")
        out.append(DefaultRecordBatch(bytes(view[at : at + 12 + length])))
        at += 12 + length
    return out


def list_offsets_request(topic: str, times: dict[int, int], isolation_level: int = 0) -> Any:
    from kafka.protocol.consumer import ListOffsetsRequest

    t = ListOffsetsRequest.ListOffsetsTopic
    p = t.ListOffsetsPartition
    return ListOffsetsRequest(
        replica_id=-1,
        isolation_level=isolation_level,
        topics=[
            t(
                name=topic,
                partitions=[
                    p(partition_index=i, current_leader_epoch=-1, timestamp=ts, max_num_offsets=1)
                    for i, ts in times.items()
                ],
            )
        ],
        timeout_ms=0,
    )


def offset_commit_request(
    group: str,
    topic: str,
    offsets: dict[int, int],
    *,
    generation: int = -1,
    member: str = "",
    metadata: str | None = "",
) -> Any:
    from kafka.protocol.consumer import OffsetCommitRequest

    t = OffsetCommitRequest.OffsetCommitRequestTopic
    p = t.OffsetCommitRequestPartition
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[
            t(
                name=topic,
                partitions=[
                    p(
                        partition_index=i,
                        committed_offset=o,
                        committed_leader_epoch=-1,
                        commit_timestamp=-1,
                        committed_metadata=metadata,
                    )
                    for i, o in offsets.items()
                ],
            )
        ],
    )


def offset_fetch_request(
    group: str, topic: str | None, partitions: list[int], *, require_stable: bool = False
) -> Any:
    """OffsetFetch of one group (v1-7 shape; ``topic`` None: every partition)."""
    from kafka.protocol.consumer import OffsetFetchRequest

    t = OffsetFetchRequest.OffsetFetchRequestTopic
    return OffsetFetchRequest(
        group_id=group,
        topics=None if topic is None else [t(name=topic, partition_indexes=partitions)],
        require_stable=require_stable,
    )
