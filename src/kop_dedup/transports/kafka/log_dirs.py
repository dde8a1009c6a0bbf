"""DescribeLogDirs (v1-4): ``kafka-log-dirs --describe``, monitoring tools' partition sizes.

One log dir, named after the data namespace (``/pulsar/<tenant>/<namespace>``), holds
every partition: its size is Pulsar's ``storageSize`` of the partition (the topic's
partitioned stats, what its ledgers hold, offloaded data excluded), its offset lag 0
(no replica is behind: BookKeeper replicates), never a future log. Asked for no topics
in particular (``topics`` null, what Kafka's admin client sends), every topic of the
data namespace is listed (one stats call per topic, :data:`_STATS_AT_ONCE` at a time);
topics and partitions that do not exist are left out, as a Kafka broker leaves out what
it does not host. The volume's total and usable bytes are unknown (-1). Only the
tenant's admin roles and superusers may ask (else CLUSTER_AUTHORIZATION_FAILED, as
Kafka asks Describe on the cluster). A Pulsar failure is the log dir's error (and the
answer's, v3+).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from kafka.protocol.admin import DescribeLogDirsRequest, DescribeLogDirsResponse

from kop_dedup import errors
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "describe_log_dirs", "partition_sizes"]

_STATS_AT_ONCE = 8
_PARTITION = re.compile(r"-partition-(\d+)$")
_Result = DescribeLogDirsResponse.DescribeLogDirsResult
_Topic = _Result.DescribeLogDirsTopic
_Partition = _Topic.DescribeLogDirsPartition


def partition_sizes(stats: dict[str, Any]) -> dict[int, int]:
    """Partition index -> storage size in bytes, from Pulsar's partitioned stats."""
    out: dict[int, int] = {}
    for name, partition in (stats.get("partitions") or {}).items():
        found = _PARTITION.search(str(name))
        if found is not None and isinstance(partition, dict):
            out[int(found.group(1))] = int(partition.get("storageSize") or 0)
    return out


async def describe_log_dirs(session: Session, request: Any, version: int) -> Any:
    admin = session.runtime.admin
    try:
        if request.topics is None:
            wanted: dict[str, set[int] | None] = dict.fromkeys(await admin.topics())
        else:
            wanted = {}
            for t in request.topics:
                wanted.setdefault(t.topic, set()).update(t.partitions or ())  # type: ignore[union-attr]
        gate = asyncio.Semaphore(_STATS_AT_ONCE)

        async def sizes(topic: str) -> dict[int, int]:
            try:
                validate_topic(topic)
            except errors.KafkaError:
                return {}
            async with gate:
                return partition_sizes(await admin.topic_stats(topic))

        found = await asyncio.gather(*(sizes(t) for t in wanted))
    except Exception as exc:
        return _answer(session, version, [], translate(exc, "reading the topics' stats"))
    topics = []
    for (topic, partitions), sized in zip(wanted.items(), found, strict=True):
        listed = [
            _Partition(partition_index=i, partition_size=size, offset_lag=0, is_future_key=False)
            for i, size in sorted(sized.items())
            if partitions is None or i in partitions
        ]
        if listed:
            topics.append(_Topic(name=topic, partitions=listed))
    return _answer(session, version, topics, None)


def _answer(
    session: Session | None, version: int, topics: list[Any], error: errors.KafkaError | None
) -> Any:
    code = errors.NONE_ERRNO if error is None else error.errno
    s = None if session is None else session.settings
    log_dir = "" if s is None else f"/pulsar/{s.tenant}/{s.namespace}"
    results = (
        []
        if session is None
        else [
            _Result(
                error_code=code,
                log_dir=log_dir,
                topics=topics,
                total_bytes=-1,
                usable_bytes=-1,
                is_cordoned=False,
            )
        ]
    )
    return DescribeLogDirsResponse(
        version=version, throttle_time_ms=0, error_code=code, results=results
    )


def _error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _answer(None, version, [], error)


APIS = (
    Api(
        key=35,
        name="DescribeLogDirs",
        request=DescribeLogDirsRequest,
        versions=(1, 4),
        handle=describe_log_dirs,
        error_answer=_error,
        response=DescribeLogDirsResponse,
    ),
)
