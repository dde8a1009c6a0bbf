"""OffsetCommit (v2-9) and OffsetFetch (v1-9) for consumers that assign partitions
themselves (``assign()``, ``commit()``, ``committed()``): the group's offsets in the
store the HTTP API and transactions share, through
:mod:`kop_dedup.coordination.groups.simple` (Kafka's rules for who may commit).

OffsetCommit, as Kafka's ``KafkaApis`` and group coordinator answer it: a partition of
a topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION (3), metadata over 4096
bytes (``offset.metadata.max.bytes``) OFFSET_METADATA_TOO_LARGE (12); the others are
committed together, or all get the group's answer (22, 25, or 69 from v9 for a
generation of a group that does not exist). The retention time (v2-4) and leader
epochs are ignored.

OffsetFetch: -1 and empty metadata for a partition without a committed offset (a
topic that does not exist included, as Kafka); ``require_stable`` (v7+) answers 88
UNSTABLE_OFFSET_COMMIT for partitions with offsets pending in a transaction; a null
topic list (v2+) answers every partition the group has an offset for, of the topics
the caller may consume (Kafka leaves out the topics a caller is not authorized on;
named topics were authorized before, 29); v8+ asks for several groups at once. An error
of the whole group (a member's stale epoch, 113; an unknown member, 25; a coordinator
error) is the group's (v8+) or the answer's (v2-7) code with no topic listed, as Kafka's
``OffsetFetchResponse.groupError``; v1 has no such code and answers each partition asked
at -1 with it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.consumer import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

from kop_dedup import errors
from kop_dedup.coordination.groups import simple
from kop_dedup.coordination.groups.store import UNKNOWN_OFFSET, CommittedOffset, StagedOffset
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.authorizer import CONSUME
from kop_dedup.transports.kafka.consumer_groups import check_offset_fetch
from kop_dedup.transports.kafka.fetch import partition_topic
from kop_dedup.transports.kafka.registry import Api, Session
from kop_dedup.transports.kafka.routed import group_key

__all__ = ["APIS", "offset_commit", "offset_fetch"]

MAX_METADATA_BYTES = 4096
_GROUP_ID_NOT_FOUND_FROM = 9
_REQUIRE_STABLE_FROM = 7
_GROUPS_FROM = 8
_TOP_LEVEL_ERROR_FROM = 2

_CTopic = OffsetCommitResponse.OffsetCommitResponseTopic
_CPartition = _CTopic.OffsetCommitResponsePartition


# -- OffsetCommit -------------------------------------------------------------------------


async def _checked(
    session: Session, topic: str, index: int, offset: int, metadata: str | None
) -> StagedOffset | errors.KafkaError:
    if len((metadata or "").encode()) > MAX_METADATA_BYTES:
        return errors.OffsetMetadataTooLarge(
            f"{topic}-{index}: metadata over {MAX_METADATA_BYTES} bytes"
        )
    try:
        await partition_topic(session, topic, index)
    except errors.KafkaError as exc:
        return exc
    return StagedOffset(topic, index, offset, metadata or "")


async def offset_commit(session: Session, request: Any, version: int) -> Any:
    asked = [(t.name, p) for t in request.topics for p in t.partitions]
    checked = await asyncio.gather(
        *(
            _checked(session, t, p.partition_index, p.committed_offset, p.committed_metadata)
            for t, p in asked
        )
    )
    staged = [c for c in checked if isinstance(c, StagedOffset)]
    outcome: errors.KafkaError | None = None
    if staged:
        missing = (
            errors.GroupIdNotFound(f"group {request.group_id!r} does not exist")
            if version >= _GROUP_ID_NOT_FOUND_FROM
            else errors.IllegalGeneration(
                f"group {request.group_id!r} does not exist: generation "
                f"{request.generation_id_or_member_epoch} is not its"
            )
        )
        try:
            await simple.commit(
                session.runtime.groups,
                request.group_id,
                request.member_id or "",
                request.generation_id_or_member_epoch,
                staged,
                missing=missing,
                instance_id=getattr(request, "group_instance_id", None),
            )
        except Exception as exc:
            outcome = translate(exc, f"committing offsets of group {request.group_id!r}")
    topics: dict[str, list[Any]] = {}
    for (topic, p), result in zip(asked, checked, strict=True):
        error = result if isinstance(result, errors.KafkaError) else outcome
        code = errors.NONE_ERRNO if error is None else error.errno
        topics.setdefault(topic, []).append(
            _CPartition(partition_index=p.partition_index, error_code=code)
        )
    return OffsetCommitResponse(
        version=version,
        throttle_time_ms=0,
        topics=[_CTopic(name=n, partitions=parts) for n, parts in topics.items()],
    )


def _commit_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return OffsetCommitResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            _CTopic(
                name=t.name,
                partitions=[
                    _CPartition(partition_index=p.partition_index, error_code=error.errno)
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ],
    )


# -- OffsetFetch --------------------------------------------------------------------------


def _asked(request: Any, version: int) -> list[tuple[str, list[tuple[str, list[int]]] | None]]:
    """(group, [(topic, partitions)] or None for all) per group asked."""

    def topics(items: Any) -> list[tuple[str, list[int]]] | None:
        if items is None:
            return None
        return [(t.name, list(t.partition_indexes)) for t in items]

    if version >= _GROUPS_FROM:
        return [(g.group_id, topics(g.topics)) for g in request.groups]
    return [(request.group_id, topics(request.topics))]


def _fetched(
    answers: list[CommittedOffset], wanted: list[tuple[str, list[int]]] | None
) -> dict[str, list[tuple[int, CommittedOffset]]]:
    """The answers per topic, in the order asked (every partition stored when None)."""
    by_tp = {(a.topic, a.partition): a for a in answers}
    out: dict[str, list[tuple[int, CommittedOffset]]] = {}
    if wanted is None:
        for a in answers:
            out.setdefault(a.topic, []).append((a.partition, a))
        return out
    for topic, indexes in wanted:
        for index in indexes:
            found = by_tp.get((topic, index)) or CommittedOffset(
                topic, index, UNKNOWN_OFFSET, "", None
            )
            out.setdefault(topic, []).append((index, found))
    return out


def _errored(
    wanted: list[tuple[str, list[int]]] | None, version: int
) -> dict[str, list[tuple[int, CommittedOffset]]]:
    """What a group-level error lists: nothing from v2 (the code says it), the partitions
    asked at -1 before."""
    return {} if version >= _TOP_LEVEL_ERROR_FROM else _fetched([], wanted or [])


def _fetch_partition(cls: Any, index: int, answer: CommittedOffset | None, error: Any) -> Any:
    failed = error if error is not None else (answer.error if answer is not None else None)
    return cls(
        partition_index=index,
        committed_offset=UNKNOWN_OFFSET if answer is None or failed else answer.offset,
        committed_leader_epoch=-1,
        metadata="" if answer is None or failed else answer.metadata,
        error_code=errors.NONE_ERRNO if failed is None else failed.errno,
    )


def _group_answer(
    version: int,
    group: str,
    found: dict[str, list[tuple[int, CommittedOffset]]],
    error: errors.KafkaError | None,
) -> Any:
    if version >= _GROUPS_FROM:
        g = OffsetFetchResponse.OffsetFetchResponseGroup
        topic, part = (
            g.OffsetFetchResponseTopics,
            g.OffsetFetchResponseTopics.OffsetFetchResponsePartitions,
        )
        return g(
            group_id=group,
            topics=[
                topic(name=n, partitions=[_fetch_partition(part, i, a, None) for i, a in items])
                for n, items in found.items()
            ],
            error_code=errors.NONE_ERRNO if error is None else error.errno,
        )
    topic = OffsetFetchResponse.OffsetFetchResponseTopic
    part = topic.OffsetFetchResponsePartition
    per_partition = error if version < _TOP_LEVEL_ERROR_FROM else None
    return [
        topic(name=n, partitions=[_fetch_partition(part, i, a, per_partition) for i, a in items])
        for n, items in found.items()
    ]


async def offset_fetch(session: Session, request: Any, version: int) -> Any:
    stable = version >= _REQUIRE_STABLE_FROM and bool(request.require_stable)
    groups = []
    for group, wanted in _asked(request, version):
        error: errors.KafkaError | None = None
        try:
            answers = await simple.fetch(session.runtime.groups, group, require_stable=stable)
            check_offset_fetch(session, request, version, group)  # KIP-848: 25, 113
        except Exception as exc:
            error, answers = translate(exc, f"fetching offsets of group {group!r}"), []
        found = _fetched(answers, wanted) if error is None else _errored(wanted, version)
        groups.append((group, found, error))
    if version >= _GROUPS_FROM:
        answer = OffsetFetchResponse(
            version=version,
            throttle_time_ms=0,
            groups=[_group_answer(version, g, f, e) for g, f, e in groups],
        )
        await _readable_only(session, answer)
        return answer
    group, found, error = groups[0]
    answer = OffsetFetchResponse(
        version=version,
        throttle_time_ms=0,
        topics=_group_answer(version, group, found, error),
        error_code=errors.NONE_ERRNO if error is None else error.errno,
    )
    await _readable_only(session, answer)
    return answer


async def _readable_only(session: Session, answer: Any) -> None:
    """Leave out of an OffsetFetch answer the topics the caller may not consume: run
    where the client is, on the answer of the node that served it or of the coordinator
    it was forwarded to (which does not know the caller)."""
    who = session.identity
    if who.superuser or session.forwarded:
        return
    auth = session.runtime.authorizer
    holders = answer.groups if answer.version >= _GROUPS_FROM else [answer]
    for holder in holders:
        holder.topics = [t for t in holder.topics if await auth.may(who, CONSUME, t.name)]


def _fetch_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    asked = _asked(request, version)
    found = [(g, _errored(wanted, version), error) for g, wanted in asked]
    if version >= _GROUPS_FROM:
        return OffsetFetchResponse(
            version=version,
            throttle_time_ms=0,
            groups=[_group_answer(version, g, f, e) for g, f, e in found],
        )
    return OffsetFetchResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            OffsetFetchResponse.OffsetFetchResponseTopic(
                name=n,
                partitions=[
                    _fetch_partition(
                        OffsetFetchResponse.OffsetFetchResponseTopic.OffsetFetchResponsePartition,
                        i,
                        a,
                        error,
                    )
                    for i, a in items
                ],
            )
            for n, items in found[0][1].items()
        ],
        error_code=error.errno,
    )


def _fetch_key(request: Any, version: int) -> tuple[int, str] | None:
    """OffsetFetch names one group (v0-7) or several (v8+, batched by coordinator by
    admin clients: the first one's coordinator is the request's)."""
    if version < 8:
        return group_key(request, version)
    groups = list(request.groups or [])
    return (0, str(groups[0].group_id)) if groups else None


APIS = (
    Api(
        key=8,
        name="OffsetCommit",
        request=OffsetCommitRequest,
        versions=(2, 9),
        handle=offset_commit,
        error_answer=_commit_error,
        coordinator_key=group_key,
        response=OffsetCommitResponse,
    ),
    Api(
        key=9,
        name="OffsetFetch",
        request=OffsetFetchRequest,
        versions=(1, 9),
        handle=offset_fetch,
        error_answer=_fetch_error,
        coordinator_key=_fetch_key,
        response=OffsetFetchResponse,
        after_forward=_readable_only,
    ),
)
