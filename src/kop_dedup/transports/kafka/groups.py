"""The classic group protocol over the wire: JoinGroup (v0-9), SyncGroup (v0-5),
Heartbeat (v0-4), LeaveGroup (v0-5), DescribeGroups (v0-5), ListGroups (v0-5).

Decode, call :class:`~kop_dedup.coordination.groups.classic.ClassicGroups`, encode.
ListGroups compares its state and type filters case-insensitively, as Kafka does, and
lists (and DescribeGroups describes) a group of plain commits only as Empty. A
JoinGroup v4+ without a member id is answered MEMBER_ID_REQUIRED (79) with a new id
(KIP-394), unless it names a ``group.instance.id`` (static membership, KIP-345: a
restart takes its old member's place; Heartbeat, SyncGroup and LeaveGroup v3+ and
OffsetCommit v7+ carry the instance id, checked as Kafka does: 82 for a replaced id);
a JoinGroup or SyncGroup waits for its round (the connection's later
requests wait behind it, as Kafka mutes the channel). Failures of the group store
are translated in one place (:func:`kop_dedup.pulsar.failures.translate`).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from kop_dedup import errors
from kop_dedup.coordination.groups.classic import ClassicGroups, NewMemberId
from kop_dedup.protocol.groups.classic import EMPTY, STABLE, ClassicGroup, JoinRequest
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.authorizer import GROUP
from kop_dedup.transports.kafka import topology
from kop_dedup.transports.kafka.registry import Api, Session
from kop_dedup.transports.kafka.routed import group_key

__all__ = ["APIS"]

_KNOWN_ID_FROM = 4
"""JoinGroup v4+: a new member gets MEMBER_ID_REQUIRED and its id (KIP-394)."""
_REBALANCE_TIMEOUT_FROM = 1
_BATCH_LEAVE_FROM = 3
_SKIP_ASSIGNMENT_FROM = 9
"""JoinGroup v9+ tells a restarted static leader to skip the assignment (KIP-814);
below, Kafka answers it the leader id as it was, so it does not assign."""


def _classic(session: Session) -> ClassicGroups:
    return session.runtime.groups.classic


def _host(session: Session) -> str:
    return "/" + session.peer.rsplit(":", 1)[0]


def _failed(exc: Exception, what: str) -> errors.KafkaError:
    return translate(exc, what)


# -- JoinGroup ---------------------------------------------------------------------------


def _join_answer(version: int, error: errors.KafkaError | None, **fields: Any) -> Any:
    return JoinGroupResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        generation_id=fields.get("generation_id", -1),
        protocol_type=fields.get("protocol_type"),
        protocol_name=fields.get("protocol_name", "" if version < 7 else None),
        leader=fields.get("leader", ""),
        skip_assignment=fields.get("skip_assignment", False),
        member_id=fields.get("member_id", ""),
        members=fields.get("members", []),
    )


async def join_group(session: Session, request: Any, version: int) -> Any:
    req = JoinRequest(
        request.member_id or "",
        getattr(request, "group_instance_id", None),
        session.client_id,
        _host(session),
        request.session_timeout_ms,
        (
            request.rebalance_timeout_ms
            if version >= _REBALANCE_TIMEOUT_FROM
            else request.session_timeout_ms
        ),
        request.protocol_type or "",
        tuple((p.name, bytes(p.metadata)) for p in request.protocols),
    )
    try:
        answer = await _classic(session).join(
            request.group_id, req, require_known_id=version >= _KNOWN_ID_FROM
        )
    except Exception as exc:
        error = _failed(exc, f"joining group {request.group_id!r}")
        return _join_answer(version, error, member_id=req.member_id)
    if isinstance(answer, NewMemberId):
        return _join_answer(version, errors.MemberIdRequired(), member_id=answer.member_id)
    member = JoinGroupResponse.JoinGroupResponseMember
    return _join_answer(
        version,
        None,
        generation_id=answer.generation,
        protocol_type=answer.protocol_type,
        protocol_name=answer.protocol or "",
        leader=(
            answer.leader_before
            if answer.skip_assignment and version < _SKIP_ASSIGNMENT_FROM
            else answer.leader
        ),
        skip_assignment=answer.skip_assignment,
        member_id=answer.member_id,
        members=[
            member(member_id=m, group_instance_id=i, metadata=meta) for m, i, meta in answer.members
        ],
    )


def _join_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return _join_answer(version, error, member_id=getattr(request, "member_id", "") or "")


# -- SyncGroup ---------------------------------------------------------------------------


def _sync_answer(version: int, error: errors.KafkaError | None, **fields: Any) -> Any:
    return SyncGroupResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        protocol_type=fields.get("protocol_type"),
        protocol_name=fields.get("protocol_name"),
        assignment=fields.get("assignment", b""),
    )


async def sync_group(session: Session, request: Any, version: int) -> Any:
    try:
        answer = await _classic(session).sync(
            request.group_id,
            request.member_id,
            request.generation_id,
            {a.member_id: bytes(a.assignment) for a in request.assignments},
            protocol_type=getattr(request, "protocol_type", None),
            protocol=getattr(request, "protocol_name", None),
            instance_id=getattr(request, "group_instance_id", None),
        )
    except Exception as exc:
        return _sync_answer(version, _failed(exc, f"syncing group {request.group_id!r}"))
    return _sync_answer(
        version,
        None,
        protocol_type=answer.protocol_type,
        protocol_name=answer.protocol,
        assignment=answer.assignment,
    )


def _sync_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _sync_answer(version, error)


# -- Heartbeat, LeaveGroup ---------------------------------------------------------------


def _heartbeat_answer(version: int, error: errors.KafkaError | None) -> Any:
    return HeartbeatResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
    )


async def heartbeat(session: Session, request: Any, version: int) -> Any:
    try:
        await _classic(session).heartbeat(
            request.group_id,
            request.member_id,
            request.generation_id,
            getattr(request, "group_instance_id", None),
        )
    except Exception as exc:
        return _heartbeat_answer(version, _failed(exc, f"heartbeat in {request.group_id!r}"))
    return _heartbeat_answer(version, None)


def _heartbeat_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _heartbeat_answer(version, error)


def _leave_answer(
    version: int, error: errors.KafkaError | None, members: list[tuple[Any, Any]]
) -> Any:
    out = LeaveGroupResponse.MemberResponse
    return LeaveGroupResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        members=[
            out(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                error_code=errors.NONE_ERRNO if e is None else e.errno,
            )
            for m, e in members
        ],
    )


async def leave_group(session: Session, request: Any, version: int) -> Any:
    batch = version >= _BATCH_LEAVE_FROM
    ids: list[str | tuple[str, str | None]] = (
        [(m.member_id, m.group_instance_id) for m in request.members]
        if batch
        else [request.member_id]
    )
    try:
        results = await _classic(session).leave(request.group_id, ids)
    except Exception as exc:
        error = _failed(exc, f"leaving group {request.group_id!r}")
        return _leave_answer(version, error, [])
    if not batch:
        return _leave_answer(version, results[0], [])
    return _leave_answer(version, None, list(zip(request.members, results, strict=True)))


def _leave_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _leave_answer(version, error, [])


# -- DescribeGroups, ListGroups -----------------------------------------------------------


def _described(group_id: str, group: ClassicGroup | None, plain: bool = False) -> Any:
    """A group as DescribeGroups answers it; ``plain``: a group of commits only (Empty)."""
    described = DescribeGroupsResponse.DescribedGroup
    member = described.DescribedGroupMember
    if group is None:
        return described(
            error_code=errors.NONE_ERRNO,
            group_id=group_id,
            group_state=EMPTY if plain else "Dead",
            protocol_type="",
            protocol_data="",
            members=[],
            authorized_operations=None,
        )
    return described(
        error_code=errors.NONE_ERRNO,
        group_id=group_id,
        group_state=group.state,
        protocol_type=group.protocol_type or "",
        protocol_data=group.protocol or "",
        members=[
            member(
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata(group.protocol) if group.state == STABLE else b"",
                member_assignment=m.assignment if group.state == STABLE else b"",
            )
            for m in group.members.values()
        ],
        authorized_operations=None,
    )


async def describe_groups(session: Session, request: Any, version: int) -> Any:
    classic = _classic(session)
    out = []
    for group_id in request.groups:
        try:
            group = await classic.read(group_id)
            out.append(_described(group_id, group, classic.plain_commits(group_id)))
        except Exception as exc:
            error = _failed(exc, f"describing group {group_id!r}")
            out.append(_described_error(group_id, error))
    return DescribeGroupsResponse(version=version, throttle_time_ms=0, groups=out)


def _described_error(group_id: str, error: errors.KafkaError) -> Any:
    return DescribeGroupsResponse.DescribedGroup(
        error_code=error.errno,
        group_id=group_id,
        group_state="",
        protocol_type="",
        protocol_data="",
        members=[],
        authorized_operations=None,
    )


def _describe_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return DescribeGroupsResponse(
        version=version,
        throttle_time_ms=0,
        groups=[_described_error(g, error) for g in request.groups],
    )


async def list_groups(session: Session, request: Any, version: int) -> Any:
    classic = _classic(session)
    store = classic.store
    listed = ListGroupsResponse.ListedGroup
    # Kafka compares both filters case-insensitively: kafka-consumer-groups --list (4.x)
    # asks for the types "Classic" and "Consumer"
    states = {s.lower() for s in getattr(request, "states_filter", None) or []}
    types = {t.lower() for t in getattr(request, "types_filter", None) or []}
    out = []
    try:
        for p in topology.listed_group_partitions(session, store.parts.count):
            await store.read_partition(p)
            for group_id in store.groups_in(p):
                group = classic.group(group_id)
                if group is not None:
                    state = group.state if group.members or group.state != EMPTY else EMPTY
                    protocol_type = group.protocol_type or ""
                elif classic.plain_commits(group_id):
                    state, protocol_type = EMPTY, ""
                else:
                    continue
                if (states and state.lower() not in states) or (types and "classic" not in types):
                    continue
                out.append(
                    listed(
                        group_id=group_id,
                        protocol_type=protocol_type,
                        group_state=state,
                        group_type="classic",
                    )
                )
        mine = await session.runtime.authorizer.visible(
            session.identity, GROUP, [g.group_id for g in out]
        )
    except Exception as exc:
        return _list_error(request, version, _failed(exc, "listing groups"))
    out = [g for g in out if g.group_id in set(mine)]
    return ListGroupsResponse(
        version=version, throttle_time_ms=0, error_code=errors.NONE_ERRNO, groups=out
    )


def _list_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return ListGroupsResponse(
        version=version, throttle_time_ms=0, error_code=error.errno, groups=[]
    )


def _first_group(request: Any, _version: int) -> tuple[int, str] | None:
    """DescribeGroups names several groups: admin clients batch them by coordinator, so
    the first one's coordinator is the request's."""
    groups = list(request.groups or [])
    return (0, str(groups[0])) if groups else None


APIS = (
    Api(
        key=11,
        name="JoinGroup",
        request=JoinGroupRequest,
        versions=(0, 9),
        handle=join_group,
        error_answer=_join_error,
        coordinator_key=group_key,
        response=JoinGroupResponse,
    ),
    Api(
        key=12,
        name="Heartbeat",
        request=HeartbeatRequest,
        versions=(0, 4),
        handle=heartbeat,
        error_answer=_heartbeat_error,
        coordinator_key=group_key,
        response=HeartbeatResponse,
    ),
    Api(
        key=13,
        name="LeaveGroup",
        request=LeaveGroupRequest,
        versions=(0, 5),
        handle=leave_group,
        error_answer=_leave_error,
        coordinator_key=group_key,
        response=LeaveGroupResponse,
    ),
    Api(
        key=14,
        name="SyncGroup",
        request=SyncGroupRequest,
        versions=(0, 5),
        handle=sync_group,
        error_answer=_sync_error,
        coordinator_key=group_key,
        response=SyncGroupResponse,
    ),
    Api(
        key=15,
        name="DescribeGroups",
        request=DescribeGroupsRequest,
        versions=(0, 5),
        handle=describe_groups,
        error_answer=_describe_error,
        coordinator_key=_first_group,
        response=DescribeGroupsResponse,
    ),
    Api(
        key=16,
        name="ListGroups",
        request=ListGroupsRequest,
        versions=(0, 5),
        handle=list_groups,
        error_answer=_list_error,
    ),
)
