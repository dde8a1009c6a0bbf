"""CreatePartitions (v0-3) and DeleteRecords (v0-2).

CreatePartitions grows a topic's partitioned Pulsar topic (the topic manager:
INVALID_PARTITIONS for the count it has or a lower one, as Kafka words them); replica
assignments are accepted and not used (the cluster places leaders). Producers see the new
partitions at their next metadata refresh; consumer groups at their next rebalance (the
Java consumer and librdkafka rejoin when a subscribed topic grows). Another sidecar
sees the new count within its partition-count cache (5 s,
``kop_dedup.pulsar.admin._PARTITIONS_TTL_S``). No existing partition changes leader (the
placement keeps them as a topic grows, as Kafka does): its producers go on where they
are.

DeleteRecords moves a partition's log start offset (Kafka's low watermark) up to the
offset given (-1: the high watermark); an offset past the high watermark is
OFFSET_OUT_OF_RANGE, one below the log start answers the log start. From then on
ListOffsets earliest, a Fetch below it (OFFSET_OUT_OF_RANGE, so ``auto.offset.reset``
applies) and an HTTP pull below it (clamped to it) answer as Kafka does; Pulsar keeps
the records until its retention deletes their ledger. The log start is stored with the
topic (:meth:`~kop_dedup.pulsar.topic_admin.TopicAdmin.set_log_start`): every sidecar
honours it, another one within its properties cache (5 s).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
)

from kop_dedup import errors
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.transports.kafka.fetch import partition_topic, readers
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "create_partitions", "delete_records"]

_HIGH_WATERMARK = -1
_Grown = CreatePartitionsResponse.CreatePartitionsTopicResult
_DeletedTopic = DeleteRecordsResponse.DeleteRecordsTopicResult
_Deleted = _DeletedTopic.DeleteRecordsPartitionResult


def _grown(name: str, error: errors.KafkaError | None) -> Any:
    return _Grown(
        name=name,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        error_message=None if error is None else error.message,
    )


async def _grow(session: Session, topic: Any, validate_only: bool) -> Any:
    name = topic.name
    try:
        try:
            validate_topic(name)
        except errors.InvalidTopic:
            raise errors.UnknownTopicOrPartition(f"topic {name!r} does not exist") from None
        await session.runtime.topics.grow(name, int(topic.count), validate_only=validate_only)
    except errors.KafkaError as exc:
        return _grown(name, exc)
    except Exception as exc:
        return _grown(name, translate(exc, f"adding partitions to {name}"))
    return _grown(name, None)


async def create_partitions(session: Session, request: Any, version: int) -> Any:
    seen = Counter(t.name for t in request.topics)
    duplicate = errors.InvalidRequest("Duplicate topic in request.")
    results = [_grown(n, duplicate) for n, times in seen.items() if times > 1]  # once each
    validate_only = bool(request.validate_only)
    unique = [t for t in request.topics if seen[t.name] == 1]
    results += [await _grow(session, topic, validate_only) for topic in unique]
    return CreatePartitionsResponse(version=version, throttle_time_ms=0, results=results)


def _grow_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return CreatePartitionsResponse(
        version=version, throttle_time_ms=0, results=[_grown(t.name, error) for t in request.topics]
    )


# -- DeleteRecords --------------------------------------------------------------------------


def _deleted(index: int, error: errors.KafkaError | None, low: int = -1) -> Any:
    return _Deleted(
        partition_index=index,
        low_watermark=low if error is None else -1,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
    )


async def _move_log_start(session: Session, topic: str, index: int, offset: int) -> int:
    """The partition's log start after moving it to ``offset`` (-1: the high watermark)."""
    ptopic = await partition_topic(session, topic, index)
    pool = readers(session)
    end = await pool.end(ptopic, fresh=True)
    target = end if offset == _HIGH_WATERMARK else offset
    if not 0 <= target <= end:
        raise errors.OffsetOutOfRange(
            f"{topic}-{index}: cannot delete records before offset {offset}: the high "
            f"watermark is {end}"
        )
    await session.runtime.admin.set_log_start(topic, index, target)
    return await pool.start(ptopic, fresh=True)


async def _delete(session: Session, topic: str, index: int, offset: int) -> Any:
    try:
        return _deleted(index, None, await _move_log_start(session, topic, index, offset))
    except Exception as exc:
        return _deleted(index, translate(exc, f"deleting records of {topic}-{index}"))


async def delete_records(session: Session, request: Any, version: int) -> Any:
    topics = []
    for t in request.topics:
        parts = await asyncio.gather(
            *(_delete(session, t.name, p.partition_index, p.offset) for p in t.partitions)
        )
        topics.append(_DeletedTopic(name=t.name, partitions=list(parts)))
    return DeleteRecordsResponse(version=version, throttle_time_ms=0, topics=topics)


def _delete_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return DeleteRecordsResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            _DeletedTopic(
                name=t.name, partitions=[_deleted(p.partition_index, error) for p in t.partitions]
            )
            for t in request.topics
        ],
    )


APIS = (
    Api(
        key=37,
        name="CreatePartitions",
        request=CreatePartitionsRequest,
        versions=(0, 3),
        handle=create_partitions,
        error_answer=_grow_error,
    ),
    Api(
        key=21,
        name="DeleteRecords",
        request=DeleteRecordsRequest,
        versions=(0, 2),
        handle=delete_records,
        error_answer=_delete_error,
    ),
)
