"""Produce (v3+, RecordBatch v2): each partition's batch through ``ProduceService.produce``.

The same path HTTP takes, so the same answers: 46 DUPLICATE_SEQUENCE_NUMBER for a
batch already stored (clients count it delivered), 45 for a gap, 47 for a fenced
epoch, retriable codes whose retries are safe; a batch without a producer id is
written without deduplication. Before that, as Kafka's ``KafkaApis`` does: acks other
than -1, 0, 1 are INVALID_REQUIRED_ACKS; a topic that does not exist (Produce never
creates one: Metadata does) or a partition out of range is
UNKNOWN_TOPIC_OR_PARTITION; the batch is checked (:mod:`.batches`). Transactional
batches need a transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the
whole request) and are refused with INVALID_TXN_STATE until the listener serves
transactions. The partitions of one request are produced side by side.

acks=1 and acks=all both answer once Pulsar has stored the entry (a Pulsar write is
durable per the namespace's persistence policy); acks=0 gets no answer, and a failure
closes the connection, as Kafka does, so that the client notices.

The base offset: see :mod:`kop_dedup.pulsar.produced` (``KAFKA_PRODUCE_OFFSETS``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from kop_dedup import errors
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.transports.kafka.batches import decode_batch, is_transactional
from kop_dedup.transports.kafka.registry import Api, CloseConnection, Session

__all__ = ["APIS", "produce"]

_Topic = ProduceResponse.TopicProduceResponse
_Partition = _Topic.PartitionProduceResponse
_ACKS = (-1, 0, 1)
_MIN_SERVED = 3


def _partition(index: int, error: errors.KafkaError | None, base_offset: int = -1) -> Any:
    return _Partition(
        index=index,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        base_offset=base_offset,
        log_append_time_ms=-1,
        log_start_offset=-1,
        record_errors=[],
        error_message=None if error is None else error.message,
    )


async def _one(
    session: Session, version: int, topic: str, index: int, data: bytes, deadline: float
) -> tuple[int, errors.KafkaError | None, int]:
    """(partition, error, base offset) for one partition's batch."""
    runtime = session.runtime
    try:
        validate_topic(topic)
        count = await runtime.admin.partitions(topic, create_with=None)
    except (errors.InvalidTopic, errors.UnknownTopicOrPartition):
        return index, errors.UnknownTopicOrPartition(f"topic {topic!r} does not exist"), -1
    except errors.KafkaError as exc:
        return index, exc, -1
    if not 0 <= index < count:
        return (
            index,
            errors.UnknownTopicOrPartition(
                f"topic {topic!r} has partitions 0..{count - 1}; got {index}"
            ),
            -1,
        )
    if is_transactional(data):
        return (
            index,
            errors.InvalidTxnState(
                "transactional batches are not served on the Kafka listener yet"
            ),
            -1,
        )
    try:
        batch = decode_batch(
            topic,
            index,
            data,
            produce_version=version,
            max_records=session.settings.max_batch_records,
        )
    except errors.KafkaError as exc:
        return index, exc, -1
    result = await runtime.service.produce(batch, deadline)
    offset = -1
    if result.message_id is not None:
        ptopic = runtime.service.naming.partition_topic(topic, index)
        offset = await session.shared.offsets.base_offset(
            ptopic, result.message_id, len(batch.records)
        )
    return index, result.error, offset


async def produce(session: Session, request: Any, version: int) -> Any:
    if request.acks != 0:
        return await _produce(session, request, version)
    try:  # acks=0: whatever fails is told by closing the connection, never by an answer
        return await _produce(session, request, version)
    except CloseConnection:
        raise
    except Exception as exc:
        raise CloseConnection(
            f"a Produce with acks=0 failed ({exc!r}); closing the connection tells the client",
            kind="acks0_error",
        ) from exc


async def _produce(session: Session, request: Any, version: int) -> Any:
    s = session.settings
    acks = request.acks
    parts = [(t.name, p) for t in request.topic_data for p in t.partition_data]
    results: list[tuple[int, errors.KafkaError | None, int]]
    if acks not in _ACKS:
        results = [
            (p.index, errors.InvalidRequiredAcks(f"acks must be -1, 0 or 1; got {acks}"), -1)
            for _, p in parts
        ]
        by_topic = [t for t, _ in parts]
    elif request.transactional_id is None and any(
        is_transactional(p.records or b"") for _, p in parts
    ):
        raise errors.TransactionalIdAuthorizationFailed(
            "transactional records need the request's transactional id"
        )
    else:
        timeout_ms = request.timeout_ms if request.timeout_ms > 0 else s.default_timeout_ms
        deadline = time.monotonic() + min(timeout_ms, s.max_timeout_ms) / 1000
        results = list(
            await asyncio.gather(
                *(_one(session, version, t, p.index, p.records or b"", deadline) for t, p in parts)
            )
        )
        by_topic = [t for t, _ in parts]
    failed = [e for _, e, _ in results if e is not None]
    if acks == 0:
        if failed:
            raise CloseConnection(
                f"a Produce with acks=0 failed ({', '.join(sorted({e.name for e in failed}))}); "
                "closing the connection tells the client",
                kind="acks0_error",
            )
        return None
    topics: dict[str, list[Any]] = {}
    for name, (index, error, offset) in zip(by_topic, results, strict=True):
        topics.setdefault(name, []).append(_partition(index, error, offset))
    return ProduceResponse(
        version=version,
        responses=[_Topic(name=n, partition_responses=p) for n, p in topics.items()],
        throttle_time_ms=0,
    )


def _error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return ProduceResponse(
        version=version,
        responses=[
            _Topic(
                name=t.name,
                partition_responses=[_partition(p.index, error) for p in t.partition_data],
            )
            for t in request.topic_data
        ],
        throttle_time_ms=0,
    )


APIS = (
    Api(
        key=0,
        name="Produce",
        request=ProduceRequest,
        versions=(0, 12),
        served_from=_MIN_SERVED,
        handle=produce,
        error_answer=_error,
        concurrent=True,
    ),
)
