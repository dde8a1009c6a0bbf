"""DeleteGroups (v0-2) and OffsetDelete (v0) over the wire, for Kafka and HTTP groups:
decode, call :class:`~kop_dedup.coordination.groups.deletion.GroupDeletion`, encode.

DeleteGroups answers each group on its own (0, 68 NON_EMPTY_GROUP, 69
GROUP_ID_NOT_FOUND, or the store's failure: 16 NOT_COORDINATOR and the like).
OffsetDelete answers the whole request with one code (24, 68, 69, or the store's
failure) or each partition (0, 86 GROUP_SUBSCRIBED_TO_TOPIC, or 3
UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist, which the coordinator
never sees), as Kafka's ``KafkaApis`` and group coordinator.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse
from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse

from kop_dedup import errors
from kop_dedup.coordination.groups.deletion import GroupDeletion
from kop_dedup.pulsar.failures import translate
from kop_dedup.transports.kafka.fetch import partition_topic
from kop_dedup.transports.kafka.registry import Api, Session
from kop_dedup.transports.kafka.routed import group_key

__all__ = ["APIS"]

_Result = DeleteGroupsResponse.DeletableGroupResult
_Topic = OffsetDeleteResponse.OffsetDeleteResponseTopic
_Partition = _Topic.OffsetDeleteResponsePartition


def _deletion(session: Session) -> GroupDeletion:
    return session.runtime.group_deletion


def _code(error: errors.KafkaError | None) -> int:
    return errors.NONE_ERRNO if error is None else error.errno


# -- DeleteGroups --------------------------------------------------------------------------


async def delete_groups(session: Session, request: Any, version: int) -> Any:
    deletion = _deletion(session)
    results = []
    for group_id in request.groups_names:
        error: errors.KafkaError | None = None
        try:
            await deletion.delete_group(group_id)  # its owner forgotten with it
        except Exception as exc:
            error = translate(exc, f"deleting group {group_id!r}")
        results.append(_Result(group_id=group_id, error_code=_code(error)))
    return DeleteGroupsResponse(version=version, throttle_time_ms=0, results=results)


def _delete_groups_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return DeleteGroupsResponse(
        version=version,
        throttle_time_ms=0,
        results=[_Result(group_id=g, error_code=error.errno) for g in request.groups_names],
    )


# -- OffsetDelete --------------------------------------------------------------------------


async def _known(session: Session, topic: str, index: int) -> errors.KafkaError | None:
    try:
        await partition_topic(session, topic, index)
    except Exception as exc:
        return translate(exc, f"looking up {topic}-{index}")
    return None


async def offset_delete(session: Session, request: Any, version: int) -> Any:
    asked = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    unknown = dict(
        zip(asked, await asyncio.gather(*(_known(session, t, i) for t, i in asked)), strict=True)
    )
    known: dict[str, list[int]] = {}
    for (topic, index), error in unknown.items():
        if error is None:
            known.setdefault(topic, []).append(index)
    try:
        answer = await _deletion(session).delete_offsets(request.group_id, list(known.items()))
    except Exception as exc:
        error = translate(exc, f"deleting offsets of group {request.group_id!r}")
        return _offset_delete_error(request, version, error)
    codes = {(topic, i): _code(e) for topic, parts in answer for i, e in parts}
    by_topic: dict[str, list[Any]] = {}
    for (topic, index), error in unknown.items():
        code = codes[topic, index] if error is None else error.errno
        by_topic.setdefault(topic, []).append(_Partition(partition_index=index, error_code=code))
    return OffsetDeleteResponse(
        version=version,
        error_code=errors.NONE_ERRNO,
        throttle_time_ms=0,
        topics=[_Topic(name=t, partitions=parts) for t, parts in by_topic.items()],
    )


def _offset_delete_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return OffsetDeleteResponse(
        version=version, error_code=error.errno, throttle_time_ms=0, topics=[]
    )


def _first_named(request: Any, _version: int) -> tuple[int, str] | None:
    """DeleteGroups names several groups: admin clients batch them by coordinator, so
    the first one's coordinator is the request's."""
    groups = list(request.groups_names or [])
    return (0, str(groups[0])) if groups else None


APIS = (
    Api(
        key=42,
        name="DeleteGroups",
        request=DeleteGroupsRequest,
        versions=(0, 2),
        handle=delete_groups,
        error_answer=_delete_groups_error,
        coordinator_key=_first_named,
        response=DeleteGroupsResponse,
    ),
    Api(
        key=47,
        name="OffsetDelete",
        request=OffsetDeleteRequest,
        versions=(0, 0),
        handle=offset_delete,
        error_answer=_offset_delete_error,
        coordinator_key=group_key,
        response=OffsetDeleteResponse,
    ),
)
