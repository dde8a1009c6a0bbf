"""ListOffsets (v1-10): the earliest offset, the end, or the offset at a time; and
OffsetForLeaderEpoch (v2-4).

What a consumer asks when it has no committed offset (``auto.offset.reset``), seeks to
the beginning or the end, or looks up ``offsets_for_times``:

- -2 EARLIEST: the first offset still stored at or after the log start offset
  (DeleteRecords moves it; the end when nothing is);
- -1 LATEST: the end, the next offset to be written; with isolation READ_COMMITTED
  (v2+) the last stable offset (LSO): the first record of the earliest copy of a
  committed transaction not whole yet in the partition, else the end, never an offset
  inside a transaction
  (:meth:`~kop_dedup.coordination.transactions.stable.StableOffsets.exact`);
- -3 MAX_TIMESTAMP (v7): the record with the greatest timestamp of the last entry
  (Kafka searches the whole partition; records here are stored in publish order);
- -4 EARLIEST_LOCAL (v8): the earliest (nothing is tiered away from the broker);
- -5 LATEST_TIERED (v9): offset -1, as Kafka answers for a topic without tiered
  storage; UNSUPPORTED_VERSION below v9, as -6 (v11, not served) at every version;
- a time: the first record whose timestamp is at or after it, with that timestamp;
  offset and timestamp -1 when no record is that late. Entries are found by Pulsar's
  publish time, then read forward to the record's own timestamp (see
  :meth:`~kop_dedup.pulsar.reader_pool.ReaderPool.at_time`).

Answers for -2/-1 carry timestamp -1, as Kafka's. The leader epoch is 0 (Metadata's)
where an offset is answered. A topic that does not exist or a partition out of range
is UNKNOWN_TOPIC_OR_PARTITION; a partition named twice is INVALID_REQUEST.

OffsetForLeaderEpoch, which the Java consumer sends to validate its position after a
leader change: every partition's leader epoch is 0 and never changes, so epoch 0 ends
at the end offset, a later epoch is unknown (-1/-1), and a current leader epoch above
0 is UNKNOWN_LEADER_EPOCH (75), as Kafka answers a client ahead of it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kafka.protocol.consumer import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)

from kop_dedup import errors
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.reader_pool import TimedOffset
from kop_dedup.transports.kafka import topology
from kop_dedup.transports.kafka.fetch import partition_topic, readers
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "list_offsets", "offset_for_leader_epoch"]

_Topic = ListOffsetsResponse.ListOffsetsTopicResponse
_Partition = _Topic.ListOffsetsPartitionResponse
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING_UPLOAD = -4, -5, -6
_SINCE = {EARLIEST_LOCAL: 8, LATEST_TIERED: 9, EARLIEST_PENDING_UPLOAD: 11}
"""The version each special timestamp came with (KIP-405, KIP-1005, KIP-1023)."""
_LEADER_EPOCH = 0
_UNKNOWN = -1
_ISOLATION_FROM = 2
_READ_COMMITTED = 1


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


async def _one(
    session: Session, topic: str, index: int, timestamp: int, version: int, committed: bool
) -> Any:
    if timestamp in _SINCE and version < _SINCE[timestamp]:
        return _partition(
            index,
            errors.UnsupportedVersion(
                f"timestamp {timestamp} needs ListOffsets v{_SINCE[timestamp]}"
            ),
        )
    try:
        found = await _lookup(session, topic, index, timestamp, version, committed)
    except Exception as exc:
        return _partition(index, translate(exc, f"listing offsets of {topic}-{index}"))
    if found is None:
        return _partition(index, None)
    return _partition(index, None, found.offset, found.timestamp)


async def _lookup(
    session: Session, topic: str, index: int, timestamp: int, version: int, committed: bool
) -> TimedOffset | None:
    """The offset (and timestamp, -1 for the special ones) a timestamp asks for."""
    ptopic = await partition_topic(session, topic, index)
    pool = readers(session)
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return TimedOffset(await pool.start(ptopic, fresh=True), _UNKNOWN)
    if timestamp == LATEST and committed:
        return TimedOffset(await session.runtime.stable.exact(topic, index), _UNKNOWN)
    if timestamp == LATEST:
        return TimedOffset(await pool.end(ptopic, fresh=True), _UNKNOWN)
    if timestamp == LATEST_TIERED:
        return None
    if timestamp == MAX_TIMESTAMP and version >= 7:
        return await pool.max_timestamp(ptopic)
    return await pool.at_time(ptopic, timestamp)


async def list_offsets(session: Session, request: Any, version: int) -> Any:
    asked = [(t.name, p.partition_index, p.timestamp) for t in request.topics for p in t.partitions]
    committed = version >= _ISOLATION_FROM and request.isolation_level == _READ_COMMITTED
    twice = {tp for tp, n in Counter((t, p) for t, p, _ in asked).items() if n > 1}

    async def answer(topic: str, index: int, timestamp: int) -> Any:
        if (topic, index) in twice:
            return _partition(
                index, errors.InvalidRequest(f"{topic}-{index} is named twice in one request")
            )
        try:  # 3 before leadership: the cluster's lookup of a leader creates a topic
            await partition_topic(session, topic, index)
        except errors.KafkaError as exc:
            return _partition(index, exc)
        if (refused := await topology.not_leader(session, topic, index)) is not None:
            return _partition(index, refused)
        return await _one(session, topic, index, timestamp, version, committed)

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


# -- OffsetForLeaderEpoch ------------------------------------------------------------------

_EpochTopic = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
_EpochEnd = _EpochTopic.EpochEndOffset
_NO_CHECK = -1


def _epoch_end(index: int, error: errors.KafkaError | None, epoch: int = -1, end: int = -1) -> Any:
    return _EpochEnd(
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        partition=index,
        leader_epoch=epoch if error is None else -1,
        end_offset=end if error is None else -1,
    )


def _check_epoch(topic: str, index: int, current: int) -> None:
    """The client's current leader epoch against ours (-1: no check)."""
    if current > _LEADER_EPOCH:
        raise errors.UnknownLeaderEpoch(
            f"{topic}-{index}: leader epoch {current} is newer than the broker's ({_LEADER_EPOCH})"
        )
    if current not in (_NO_CHECK, _LEADER_EPOCH):
        raise errors.FencedLeaderEpoch(f"{topic}-{index}: leader epoch is {_LEADER_EPOCH}")


async def _epoch_one(session: Session, topic: str, part: Any) -> Any:
    index = part.partition
    try:
        ptopic = await partition_topic(session, topic, index)
        _check_epoch(topic, index, part.current_leader_epoch)
        if part.leader_epoch != _LEADER_EPOCH:  # an epoch never held: undefined
            return _epoch_end(index, None)
        end = await readers(session).end(ptopic, fresh=True)
    except Exception as exc:
        return _epoch_end(index, translate(exc, f"ending epochs of {topic}-{index}"))
    return _epoch_end(index, None, _LEADER_EPOCH, end)


async def offset_for_leader_epoch(session: Session, request: Any, version: int) -> Any:
    topics = []
    for t in request.topics:
        parts = await asyncio.gather(*(_epoch_one(session, t.topic, p) for p in t.partitions))
        topics.append(_EpochTopic(topic=t.topic, partitions=list(parts)))
    return OffsetForLeaderEpochResponse(version=version, throttle_time_ms=0, topics=topics)


def _epoch_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return OffsetForLeaderEpochResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            _EpochTopic(
                topic=t.topic, partitions=[_epoch_end(p.partition, error) for p in t.partitions]
            )
            for t in request.topics
        ],
    )


APIS = (
    Api(
        key=23,
        name="OffsetForLeaderEpoch",
        request=OffsetForLeaderEpochRequest,
        versions=(2, 4),
        handle=offset_for_leader_epoch,
        error_answer=_epoch_error,
    ),
    Api(
        key=2,
        name="ListOffsets",
        request=ListOffsetsRequest,
        versions=(1, 10),
        handle=list_offsets,
        error_answer=_error,
        concurrent=True,  # librdkafka asks each partition's offset in a request of its own
    ),
)
