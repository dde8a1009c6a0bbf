"""ListOffsets (v1-7): the earliest offset, the end, or the offset at a time.

What a consumer asks when it has no committed offset (``auto.offset.reset``), seeks to
the beginning or the end, or looks up ``offsets_for_times``:

- -2 EARLIEST: the first offset still stored (the end when nothing is);
- -1 LATEST: the end, the next offset to be written (read_committed asks for the last
  stable offset: the same here, only committed records reach a data topic);
- -3 MAX_TIMESTAMP (v7): the record with the greatest timestamp of the last entry
  (Kafka searches the whole partition; records here are stored in publish order);
- a time: the first record whose timestamp is at or after it, with that timestamp;
  offset and timestamp -1 when no record is that late. Entries are found by Pulsar's
  publish time, then read forward to the record's own timestamp (see
  :meth:`~kop_dedup.pulsar.reader_pool.ReaderPool.at_time`).

Answers for -2/-1 carry timestamp -1, as Kafka's. The leader epoch is 0 (Metadata's)
where an offset is answered. A topic that does not exist or a partition out of range
is UNKNOWN_TOPIC_OR_PARTITION; a partition named twice is INVALID_REQUEST.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from kop_dedup import errors
from kop_dedup.pulsar.failures import translate
from kop_dedup.transports.kafka import topology
from kop_dedup.transports.kafka.fetch import partition_topic, readers
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "list_offsets"]

_Topic = ListOffsetsResponse.ListOffsetsTopicResponse
_Partition = _Topic.ListOffsetsPartitionResponse
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
_LEADER_EPOCH = 0
_UNKNOWN = -1


def _partition(
    index: int, error: errors.KafkaError | None, offset: int = _UNKNOWN, timestamp: int = _UNKNOWN
) -> Any:
    return _Partition(
        partition_index=index,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        old_style_offsets=[],
        timestamp=timestamp,
        offset=offset,
        leader_epoch=_LEADER_EPOCH if error is None and offset >= 0 else -1,
    )


async def _one(session: Session, topic: str, index: int, timestamp: int, version: int) -> Any:
    try:
        ptopic = await partition_topic(session, topic, index)
        pool = readers(session)
        if timestamp == EARLIEST:
            return _partition(index, None, await pool.start(ptopic, fresh=True))
        if timestamp == LATEST:
            return _partition(index, None, await pool.end(ptopic, fresh=True))
        found = (
            await pool.max_timestamp(ptopic)
            if timestamp == MAX_TIMESTAMP and version >= 7
            else await pool.at_time(ptopic, timestamp)
        )
    except Exception as exc:
        return _partition(index, translate(exc, f"listing offsets of {topic}-{index}"))
    if found is None:
        return _partition(index, None)
    return _partition(index, None, found.offset, found.timestamp)


async def list_offsets(session: Session, request: Any, version: int) -> Any:
    asked = [(t.name, p.partition_index, p.timestamp) for t in request.topics for p in t.partitions]
    twice = {tp for tp, n in Counter((t, p) for t, p, _ in asked).items() if n > 1}

    async def answer(topic: str, index: int, timestamp: int) -> Any:
        if (topic, index) in twice:
            return _partition(
                index, errors.InvalidRequest(f"{topic}-{index} is named twice in one request")
            )
        if (refused := await topology.not_leader(session, topic, index)) is not None:
            return _partition(index, refused)
        return await _one(session, topic, index, timestamp, version)

    answers = await asyncio.gather(*(answer(*a) for a in asked))
    topics: dict[str, list[Any]] = {}
    for (topic, _, _), partition in zip(asked, answers, strict=True):
        topics.setdefault(topic, []).append(partition)
    return ListOffsetsResponse(
        version=version,
        throttle_time_ms=0,
        topics=[_Topic(name=name, partitions=parts) for name, parts in topics.items()],
    )


def _error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return ListOffsetsResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            _Topic(
                name=t.name, partitions=[_partition(p.partition_index, error) for p in t.partitions]
            )
            for t in request.topics
        ],
    )


APIS = (
    Api(
        key=2,
        name="ListOffsets",
        request=ListOffsetsRequest,
        versions=(1, 7),
        handle=list_offsets,
        error_answer=_error,
    ),
)
