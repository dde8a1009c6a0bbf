"""Routes for consumer groups with server-side offsets: HTTP <-> the group coordinator.

Answers: 200 with ``errorCode`` 0; 409 for a member the group moved on from (Kafka's
22 ILLEGAL_GENERATION or 25 UNKNOWN_MEMBER_ID in the body, with the reason) and for a
join to a group at ``MAX_GROUP_MEMBERS`` (81 GROUP_MAX_SIZE_REACHED); 429 for a new
group past ``MAX_GROUPS`` (89 THROTTLING_QUOTA_EXCEEDED); 400 for
a request that cannot be carried out as asked (an offset out of range, a partition that
does not exist); 503 for a retriable failure below (retry); 404 for an unknown group.
"""

from __future__ import annotations

import base64
import functools
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from kop_dedup import errors
from kop_dedup.coordination.groups.api import (
    LagReport,
    PartitionLag,
    PullResult,
    ResetRequest,
    ResetStatus,
    ResolvedReset,
    UnknownGroup,
)
from kop_dedup.protocol.groups import AutoReset, Group, Mode, StaleMember
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.authorizer import CONSUME
from kop_dedup.transports.http.answers import (
    INVALID_RESPONSE,
    JSON_OBJECT,
    TOO_LARGE_RESPONSE,
    over_setting,
)
from kop_dedup.transports.http.bodies import body_spec, parsed_body, register_bodies
from kop_dedup.transports.http.deps import (
    AUTHORIZATION_ERRORS,
    AccessDep,
    Authorized,
    OwnsGroup,
    RuntimeDep,
)
from kop_dedup.transports.http.models import Int32, Int64, Model, Offset, PartitionIndex

__all__ = [
    "CommitIn",
    "GroupIn",
    "JoinIn",
    "PullIn",
    "ResetIn",
    "router",
]

router = APIRouter(dependencies=[Authorized, OwnsGroup], tags=["groups"])

_ANSWERS: dict[int | str, dict[str, Any]] = {
    400: {"description": "cannot be carried out as asked (see errorMessage)", **JSON_OBJECT},
    404: {
        "description": "no such group (69), or a topic named that does not exist (3)",
        **JSON_OBJECT,
    },
    409: {"description": "the member is stale: errorCode 22 or 25", **JSON_OBJECT},
    503: {"description": "a retriable failure below: retry", **JSON_OBJECT},
    **TOO_LARGE_RESPONSE,
    **INVALID_RESPONSE,
}

GroupName = Annotated[str, Field(min_length=1, max_length=32_767)]
MAX_TOPICS = 100
"""Topics one member may read (a missing one is 3, HTTP 404, unless
GROUP_AUTO_CREATE_TOPICS)."""


class GroupIn(Model):
    mode: Literal["clustering", "broadcast"] | None = None
    autoOffsetReset: Literal["earliest", "latest", "none"] | None = None  # noqa: N815
    sessionTimeoutMs: int | None = Field(default=None, ge=100, le=3_600_000)  # noqa: N815
    broadcastExpireMs: int | None = Field(default=None, ge=100, le=86_400_000)  # noqa: N815


class JoinIn(Model):
    memberId: str | None = Field(default=None, min_length=1, max_length=1000)  # noqa: N815
    topics: list[Annotated[str, Field(min_length=1, max_length=249)]] = Field(
        min_length=1, max_length=MAX_TOPICS
    )


class PullIn(Model):
    maxRecords: int = Field(ge=1, le=100_000)  # noqa: N815
    maxBytes: int | None = Field(default=None, ge=1)  # noqa: N815
    waitMs: int = Field(  # noqa: N815
        default=0,
        ge=0,
        le=(1 << 63) - 1,
        description="at most KOP_DEDUP_MAX_PULL_WAIT_MS (the document's maximum is the "
        "setting's value); also at most half the group's session",
    )


class CommitOffsetIn(Model):
    topic: str = Field(min_length=1, max_length=249)
    partition: PartitionIndex
    offset: Offset


class CommitIn(Model):
    offsets: list[CommitOffsetIn] | None = Field(
        default=None, description="absent: commit exactly what was delivered to the member"
    )
    generation: int | None = Field(default=None, description="the generation the member knows")


class ResetIn(Model):
    topic: str = Field(min_length=1, max_length=249)
    partitions: list[Int32] | None = Field(default=None, max_length=10_000)
    to: Literal["earliest", "latest", "timestamp", "offset"]
    value: Int64 | None = Field(default=None, description="epoch ms (timestamp) or offset")
    members: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(
        default=None, max_length=10_000, description="broadcast: only these members"
    )


register_bodies(GroupIn, JoinIn, PullIn, CommitIn, ResetIn)


def _error(error: errors.KafkaError, status: int) -> JSONResponse:
    return JSONResponse(
        {"errorCode": error.errno, "error": error.name, "errorMessage": error.message},
        status_code=status,
    )


def _failure(exc: Exception, what: str) -> JSONResponse:
    if isinstance(exc, StaleMember):
        return _error(exc.error, 409)
    if isinstance(exc, UnknownGroup):
        return _error(exc, 404)
    if isinstance(exc, errors.GroupMaxSizeReached | errors.ThrottlingQuotaExceeded):
        # a full group (409: no retry helps until one leaves), no room for a new one (429)
        return _error(exc, 409 if isinstance(exc, errors.GroupMaxSizeReached) else 429)
    error = translate(exc, what)
    if isinstance(error, errors.UnknownTopicOrPartition):
        return _error(error, 404)  # a topic the group names does not exist
    if isinstance(error, errors.InvalidRequest | errors.OffsetOutOfRange | errors.InvalidTopic):
        return _error(error, 400)
    return _error(error, 503 if error.retriable else 400)


def _ok(**body: Any) -> JSONResponse:
    return JSONResponse({"errorCode": errors.NONE_ERRNO, "error": errors.NONE_NAME, **body})


def _assignment(tps: list[tuple[str, int]]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(by_topic.items())]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _pull_answer(result: PullResult) -> dict[str, Any]:
    records = []
    for (topic, partition), r in result.records:
        rec = r.record
        ledger, entry, batch = r.position
        records.append(
            {
                "topic": topic,
                "partition": partition,
                "offset": r.offset,
                "key": _b64(rec.key),
                "value": _b64(rec.value),
                "headers": [{"key": h.key, "value": _b64(h.value)} for h in rec.headers],
                "timestamp": rec.timestamp,
                "messageId": f"{ledger}:{entry}:-1:{batch}",
            }
        )
    return {
        "errorCode": errors.NONE_ERRNO,
        "error": errors.NONE_NAME,
        "records": records,
        "generation": result.generation,
        "assignment": _assignment(result.assignment),
        "nextOffsets": [
            {"topic": t, "partition": p, "offset": o}
            for (t, p), o in sorted(result.next_offsets.items())
        ],
        "resetApplied": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "epoch": r.epoch,
                "to": r.to,
            }
            for r in result.resets_applied
        ],
        "clamped": [
            {"topic": c.topic, "partition": c.partition, "from": c.start, "to": c.earliest}
            for c in result.clamped
        ],
    }


def _group(group_id: str, group: Group) -> dict[str, Any]:
    c = group.config
    return {
        "groupId": group_id,
        "mode": c.mode.value,
        "autoOffsetReset": c.auto_offset_reset.value,
        "sessionTimeoutMs": c.session_timeout_ms,
        "broadcastExpireMs": c.broadcast_expire_ms,
        "generation": group.generation,
        "members": [
            {"memberId": m, "topics": list(v.topics), "lastSeenMs": v.last_seen_ms}
            for m, v in sorted(group.members.items())
        ],
        "assignment": {m: _assignment(list(tps)) for m, tps in sorted(group.assignment.items())},
    }


def _resolved(r: ResolvedReset) -> dict[str, Any]:
    return {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "position": r.position,
        "clamped": r.clamped,
        "clampedTo": r.clamped_to,
        "epoch": r.epoch,
        "appliedAt": r.applied_at,
        "fencedBelowGeneration": r.fenced_below,
    }


def _status(r: ResetStatus) -> dict[str, Any]:
    return {
        "topic": r.topic,
        "partition": r.partition,
        "epoch": r.epoch,
        "offset": r.offset,
        "to": r.to,
        "value": r.value,
        "atMs": r.at_ms,
        "members": r.members,
    }


def _lag_row(r: PartitionLag) -> dict[str, Any]:
    if r.is_minimum:
        return {
            "topic": r.topic,
            "partition": r.partition,
            "member": None,
            "groupMinimum": r.minimum,
            "end": r.end,
            "lag": r.lag,
        }
    row: dict[str, Any] = {
        "topic": r.topic,
        "partition": r.partition,
        "end": r.end,
        "committed": r.committed,
        "pulled": r.pulled,
        "ready": r.ready,
        "inflight": r.inflight,
        "lag": r.lag,
        "oldestInflightMs": r.oldest_inflight_ms,
    }
    if r.member is not None:
        row["member"] = r.member
    return row


def _lag(report: LagReport) -> dict[str, Any]:
    return {
        "groupId": report.group_id,
        "mode": report.mode,
        "generation": report.generation,
        "partitions": [_lag_row(r) for r in report.partitions],
    }


@router.put("/v1/groups/{groupId}", openapi_extra=body_spec(GroupIn), responses=_ANSWERS)
async def configure_group(
    groupId: str,  # noqa: N803
    body: Annotated[GroupIn, Depends(parsed_body(GroupIn))],
    runtime: RuntimeDep,
) -> JSONResponse:
    """Create or update a group: mode (clustering: partitions spread over members;
    broadcast: every member reads everything), autoOffsetReset, sessionTimeoutMs,
    broadcastExpireMs."""
    try:
        doc = await runtime.groups.configure(
            groupId,
            mode=Mode(body.mode) if body.mode else None,
            auto_offset_reset=AutoReset(body.autoOffsetReset) if body.autoOffsetReset else None,
            session_timeout_ms=body.sessionTimeoutMs,
            broadcast_expire_ms=body.broadcastExpireMs,
        )
    except Exception as exc:
        return _failure(exc, "configuring the group")
    return _ok(**_group(groupId, doc))


@router.get("/v1/groups/{groupId}", responses=_ANSWERS)
async def describe_group(groupId: str, runtime: RuntimeDep) -> JSONResponse:  # noqa: N803
    """A group's configuration, generation, members and assignment."""
    try:
        doc = await runtime.groups.describe(groupId)
    except Exception as exc:
        return _failure(exc, "reading the group")
    if doc is None:
        return _error(UnknownGroup(f"no group {groupId!r}"), 404)
    return _ok(**_group(groupId, doc))


@router.post("/v1/groups/{groupId}/members", openapi_extra=body_spec(JoinIn), responses=_ANSWERS)
async def join(
    groupId: str,  # noqa: N803
    body: Annotated[JoinIn, Depends(parsed_body(JoinIn))],
    runtime: RuntimeDep,
    access: AccessDep,
) -> JSONResponse:
    """Join (a client-chosen memberId keeps a restarted client's identity): the member's
    id, the generation and its assignment. What it was given but had not committed comes
    again."""
    await access.require(CONSUME, body.topics)
    try:
        joined = await runtime.groups.join(groupId, body.memberId, body.topics)
    except Exception as exc:
        return _failure(exc, "joining the group")
    return _ok(
        memberId=joined.member_id,
        generation=joined.generation,
        assignment=_assignment(list(joined.assignment)),
    )


@router.post("/v1/groups/{groupId}/members/{memberId}/heartbeat", responses=_ANSWERS)
async def heartbeat(groupId: str, memberId: str, runtime: RuntimeDep) -> JSONResponse:  # noqa: N803
    """Keep the member's session; the current generation and assignment."""
    try:
        joined = await runtime.groups.heartbeat(groupId, memberId)
    except Exception as exc:
        return _failure(exc, "heartbeat")
    return _ok(generation=joined.generation, assignment=_assignment(list(joined.assignment)))


@router.delete("/v1/groups/{groupId}/members/{memberId}", responses=_ANSWERS)
async def leave(groupId: str, memberId: str, runtime: RuntimeDep) -> JSONResponse:  # noqa: N803
    """Leave: its partitions go to the other members, from the committed offsets."""
    try:
        await runtime.groups.leave(groupId, memberId)
    except Exception as exc:
        return _failure(exc, "leaving the group")
    return _ok()


@router.post(
    "/v1/groups/{groupId}/members/{memberId}/pull",
    openapi_extra=body_spec(PullIn),
    responses=_ANSWERS,
)
async def pull(
    groupId: str,  # noqa: N803
    memberId: str,  # noqa: N803
    body: Annotated[PullIn, Depends(parsed_body(PullIn))],
    runtime: RuntimeDep,
    request: Request,
    access: AccessDep,
) -> JSONResponse:
    """Records from the member's positions (keys and values base64), at most maxRecords
    (and about maxBytes), waiting up to waitMs for some. ``resetApplied`` names resets
    applied by this pull; ``clamped`` partitions whose start had been deleted by
    retention (the pull starts at the earliest still stored). A client that goes away
    mid-poll loses nothing: what it was not answered stays ready. Every pull needs
    ``consume`` on the topics it reads (a revoked grant counts at the next pull), asked
    once the group is loaded (a group not loaded yet is never read unchecked)."""
    s = runtime.settings
    if late := over_setting("waitMs", body.waitMs, s.max_pull_wait_ms, "MAX_PULL_WAIT_MS"):
        return late
    try:
        result = await runtime.groups.pull(
            groupId,
            memberId,
            max_records=min(body.maxRecords, s.max_pull_records),
            max_bytes=body.maxBytes,
            wait_ms=body.waitMs,
            gone=request.is_disconnected,
            # asked by the coordinator once the group is loaded, of the topics it reads
            may_read=None if access.who.superuser else functools.partial(access.require, CONSUME),
        )
    except AUTHORIZATION_ERRORS:
        raise  # the 403 of the app's handler
    except Exception as exc:
        return _failure(exc, "pulling")
    return JSONResponse(_pull_answer(result))


@router.post(
    "/v1/groups/{groupId}/members/{memberId}/commit",
    openapi_extra=body_spec(CommitIn),
    responses=_ANSWERS,
)
async def commit(
    groupId: str,  # noqa: N803
    memberId: str,  # noqa: N803
    body: Annotated[CommitIn, Depends(parsed_body(CommitIn))],
    runtime: RuntimeDep,
    access: AccessDep,
) -> JSONResponse:
    """Commit: with no ``offsets``, exactly what was delivered to the member (not more);
    else each offset given (the next record to read). A stale generation or member: 409
    with 22 or 25; a commit of a position from before a reset the member has not pulled
    since: 409."""
    offsets = (
        None if body.offsets is None else [(o.topic, o.partition, o.offset) for o in body.offsets]
    )
    await access.require(CONSUME, (o.topic for o in body.offsets or ()))
    try:
        done = await runtime.groups.commit(groupId, memberId, offsets, body.generation)
    except Exception as exc:
        return _failure(exc, "committing")
    return _ok(
        committed=[{"topic": c.topic, "partition": c.partition, "offset": c.offset} for c in done]
    )


@router.post("/v1/groups/{groupId}/reset", openapi_extra=body_spec(ResetIn), responses=_ANSWERS)
async def reset(
    groupId: str,  # noqa: N803
    body: Annotated[ResetIn, Depends(parsed_body(ResetIn))],
    runtime: RuntimeDep,
    access: AccessDep,
) -> JSONResponse:
    """Server-side reset: the target is resolved now and stored durably with a higher
    epoch; each member's next pull starts there (whichever sidecar serves it). A Kafka
    group gets it as its committed offsets and, with members, a rebalance (``appliedAt``
    ``rebalance``): its members rejoin and start there; their commits at a generation
    below ``fencedBelowGeneration`` are refused (22). A timestamp before the earliest or
    after the end is clamped; an offset outside the partition: 400."""
    await access.require(CONSUME, [body.topic])
    request = ResetRequest(
        body.topic,
        body.to,
        body.value,
        None if body.partitions is None else tuple(body.partitions),
        None if body.members is None else tuple(body.members),
    )
    try:
        resolved = await runtime.groups.reset(groupId, request)
    except Exception as exc:
        return _failure(exc, "resetting")
    return _ok(groupId=groupId, resolved=[_resolved(r) for r in resolved])


@router.get("/v1/groups/{groupId}/reset", responses=_ANSWERS)
async def reset_status(groupId: str, runtime: RuntimeDep) -> JSONResponse:  # noqa: N803
    """Each reset of the group and whether each member has applied it."""
    try:
        resets = await runtime.groups.reset_status(groupId)
    except Exception as exc:
        return _failure(exc, "reading resets")  # 404 for a group with nothing stored
    return _ok(groupId=groupId, resets=[_status(r) for r in resets])


@router.get("/v1/groups/{groupId}/lag", responses=_ANSWERS)
async def lag(groupId: str, runtime: RuntimeDep) -> JSONResponse:  # noqa: N803
    """Per partition (per member in broadcast mode, plus the group minimum): end,
    committed, pulled, ready, inflight, lag, in records; the oldest inflight's age."""
    try:
        report = await runtime.group_lag.lag(groupId)
    except Exception as exc:
        return _failure(exc, "computing lag")  # 404 for a group with nothing stored
    return _ok(**_lag(report))
