"""The consumer group protocol over the wire (KIP-848): ConsumerGroupHeartbeat (68,
v0-1) and ConsumerGroupDescribe (69, v0-1).

Decode, call :class:`~kop_dedup.coordination.groups.consumer.ConsumerGroups`, encode.
Partitions travel by topic id (:func:`kop_dedup.protocol.topic_ids.topic_id`, which
Metadata v10+ answers too); an owned partition of a topic id no member subscribes to is
ignored. The session timeout and heartbeat interval are the server's, as Kafka's
(``KOP_DEDUP_KAFKA_CONSUMER_SESSION_TIMEOUT_MS``,
``KOP_DEDUP_KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS``). A subscription by regular
expression (``SubscribedTopicRegex``, v1: the Java consumer's
``subscribe(SubscriptionPattern)``, librdkafka's ``^``-prefixed topics) is resolved by
the coordinator (:mod:`kop_dedup.protocol.groups.regex`) over the topics the member's
role may describe: the client's role, or the group's owner for a heartbeat another node
forwarded (a group is used by one role; :func:`~kop_dedup.transports.kafka.authorize.
authorize` claimed it for the client's).

A member with an InstanceId is a static member
(:mod:`kop_dedup.protocol.groups.consumer_static`); a heartbeat naming topics its role
may not describe is refused before it reaches here
(:func:`~kop_dedup.transports.kafka.authorize.authorize`: 29, no message, as Kafka).

ConsumerGroupDescribe answers GROUP_ID_NOT_FOUND (69) for a group that is not a consumer
group (a classic one included): Kafka's admin client then describes it with
DescribeGroups, so ``kafka-consumer-groups --describe`` shows groups of both protocols.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.groups.consumer import ConsumerGroups, Visible
from kop_dedup.protocol.groups.assignors import Assignment
from kop_dedup.protocol.groups.consumer import Beat, ConsumerGroup, ConsumerMember
from kop_dedup.protocol.topic_ids import by_id, topic_id
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.authorizer import DESCRIBE, GROUP
from kop_dedup.security.identity import Identity
from kop_dedup.transports.kafka.registry import Api, Session
from kop_dedup.transports.kafka.routed import group_key
from kop_dedup.transports.kafka.schemas import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)

__all__ = ["APIS", "check_offset_fetch", "consumer_group_describe", "consumer_group_heartbeat"]

_HB = ConsumerGroupHeartbeatResponse
_DESCRIBED = ConsumerGroupDescribeResponse.DescribedGroup
_MEMBER = _DESCRIBED.Member
_CONSUMER_MEMBER = 1
"""MemberType (v1+, KIP-1099): 1 a member of the consumer protocol."""


def _consumer(session: Session) -> ConsumerGroups:
    return session.runtime.groups.consumer


def _by_topic(assignment: Assignment) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, p in sorted(assignment):
        out.setdefault(topic, []).append(p)
    return out


# -- ConsumerGroupHeartbeat --------------------------------------------------------------


def _heartbeat_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    """An error answer as Kafka's: the code and message, the other fields at their
    schema defaults (member epoch 0). TOPIC_AUTHORIZATION_FAILED (29, a subscribed topic
    the role may not describe) has no message, as Kafka 4.1's ``KafkaApis`` answers it."""
    silent = error.errno == errors.TopicAuthorizationFailed.errno
    return _HB(
        version=version,
        throttle_time_ms=0,
        error_code=error.errno,
        error_message=None if silent else str(error) or error.name,
        member_id=None,
        member_epoch=0,
        heartbeat_interval_ms=0,
        assignment=None,
    )


_COORDINATOR_CODES = (14, 15, 16)


def _retried(error: errors.KafkaError) -> errors.KafkaError:
    """A retriable failure (Pulsar slow or away: 7, 56...) as COORDINATOR_NOT_AVAILABLE
    (15): the Java consumer retries a heartbeat only on the coordinator codes its schema
    lists and takes any other as fatal (the member's process stops)."""
    if error.retriable and error.errno not in _COORDINATOR_CODES:
        return errors.CoordinatorNotAvailable(f"{error} (retry)")
    return error


def _owned(request: Any, topics: Iterable[str]) -> Assignment | None:
    if request.topic_partitions is None:
        return None
    names = by_id(topics)
    return frozenset(
        (names[tp.topic_id], p)
        for tp in request.topic_partitions
        if tp.topic_id in names
        for p in tp.partitions
    )


def _visible(session: Session, group_id: str) -> Visible | None:
    """Of a regex's topics, those the member's role may describe (None: any)."""
    if session.identity.superuser and not session.forwarded:
        return None
    auth = session.runtime.authorizer

    async def visible(topics: list[str]) -> list[str]:
        who = session.identity
        if session.forwarded:
            owner = await auth.owner(GROUP, group_id)
            if owner is None:
                return topics
            who = Identity(owner)
        allowed = await auth.may_each(who, DESCRIBE, topics)
        return [t for t in topics if allowed[t]]

    return visible


async def consumer_group_heartbeat(session: Session, request: Any, version: int) -> Any:
    consumer = _consumer(session)
    s = session.settings
    topics = None if request.subscribed_topic_names is None else request.subscribed_topic_names
    try:
        known = consumer.group(request.group_id) or ConsumerGroup.new()
        beat = Beat(
            member_id=request.member_id or "",
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            topics=None if topics is None else tuple(str(t) for t in topics),
            regex=getattr(request, "subscribed_topic_regex", None),
            assignor=request.server_assignor,
            owned=_owned(request, known.subscribed_topics(topics or ())),
            client_id=session.client_id,
            client_host="/" + session.peer.rsplit(":", 1)[0],
            session_timeout_ms=s.kafka_consumer_session_timeout_ms,
        )
        old, member = await consumer.heartbeat(
            request.group_id, beat, _visible(session, request.group_id)
        )
    except Exception as exc:
        error = translate(exc, f"heartbeat in consumer group {request.group_id!r}")
        return _heartbeat_error(request, version, _retried(error))
    full = request.rebalance_timeout_ms != -1 and request.topic_partitions is not None
    full = full and (topics is not None or beat.regex is not None)
    given = request.member_epoch == 0 or full or old is None or old.assigned != member.assigned
    return _heartbeat_answer(version, member, s.kafka_consumer_heartbeat_interval_ms, given)


def _heartbeat_answer(
    version: int, member: ConsumerMember, interval_ms: int, given: bool = True
) -> Any:
    """The answer to a heartbeat. The assignment only when ``given``: as Kafka, to a
    join, to a full request (rebalance timeout, subscription and owned partitions all
    set: a client resending everything after an error) and when it changed. A leave
    (epoch -1, or -2 a static member's) answers no interval and no assignment, as
    Kafka's ``consumerGroupLeave``."""
    assignment = None
    if member.epoch < 0:
        interval_ms = 0
    elif given:
        assignment = _HB.Assignment(
            topic_partitions=[
                _HB.Assignment.TopicPartitions(topic_id=topic_id(t), partitions=ps)
                for t, ps in _by_topic(member.assigned).items()
            ]
        )
    return _HB(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO,
        error_message=None,
        member_id=member.member_id,
        member_epoch=member.epoch,
        heartbeat_interval_ms=interval_ms,
        assignment=assignment,
    )


# -- OffsetFetch of a member ------------------------------------------------------------

_MEMBER_FETCH_FROM = 9
"""OffsetFetch v9+ names the member and its epoch (KIP-848)."""


def check_offset_fetch(session: Session, request: Any, version: int, group_id: str) -> None:
    """An OffsetFetch v9+ naming a member of a consumer group (read just before): Kafka's
    ``ConsumerGroup.validateOffsetFetch``, 25 for an unknown member, 113 for another
    epoch; one naming no member (an admin's) passes."""
    if version < _MEMBER_FETCH_FROM:
        return
    asked = next((g for g in request.groups if g.group_id == group_id), None)
    if asked is None or (asked.member_id is None and asked.member_epoch < 0):
        return
    consumer = _consumer(session)
    group = consumer.group(group_id) if consumer.serves(group_id) else None
    if group is not None:
        group.validate_commit(asked.member_id or "", asked.member_epoch)


# -- ConsumerGroupDescribe ---------------------------------------------------------------


def _assignment(assignment: Assignment) -> Any:
    tps = _DESCRIBED.Member.Assignment.TopicPartitions
    return _DESCRIBED.Member.Assignment(
        topic_partitions=[
            tps(topic_id=topic_id(t), topic_name=t, partitions=ps)
            for t, ps in _by_topic(assignment).items()
        ],
    )


def _described(group_id: str, group: ConsumerGroup) -> Any:
    return _DESCRIBED(
        error_code=errors.NONE_ERRNO,
        error_message=None,
        group_id=group_id,
        group_state=group.state,
        group_epoch=group.epoch,
        assignment_epoch=group.assignment_epoch,
        assignor_name=group.assignor,
        members=[
            _MEMBER(
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=list(m.topics),
                subscribed_topic_regex=m.regex,
                assignment=_assignment(m.assigned),
                target_assignment=_assignment(group.target.get(m.member_id, frozenset())),
                member_type=_CONSUMER_MEMBER,
            )
            for m in group.members.values()
        ],
    )


def _described_error(group_id: str, error: errors.KafkaError) -> Any:
    return _DESCRIBED(
        error_code=error.errno,
        error_message=str(error) or error.name,
        group_id=group_id,
        group_state="",
        group_epoch=-1,
        assignment_epoch=-1,
        assignor_name="",
        members=[],
    )


async def consumer_group_describe(session: Session, request: Any, version: int) -> Any:
    consumer = _consumer(session)
    out = []
    for group_id in request.group_ids:
        try:
            group = await consumer.read(group_id)
        except Exception as exc:
            out.append(_described_error(group_id, translate(exc, f"describing {group_id!r}")))
            continue
        if group is None:
            missing = errors.GroupIdNotFound(f"group {group_id!r} is not a consumer group")
            out.append(_described_error(group_id, missing))
        else:
            out.append(_described(group_id, group))
    return ConsumerGroupDescribeResponse(version=version, throttle_time_ms=0, groups=out)


def _describe_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return ConsumerGroupDescribeResponse(
        version=version,
        throttle_time_ms=0,
        groups=[_described_error(g, error) for g in request.group_ids],
    )


def _first_group(request: Any, _version: int) -> tuple[int, str] | None:
    """Admin clients batch the groups of one describe by coordinator."""
    groups = list(request.group_ids or [])
    return (0, str(groups[0])) if groups else None


APIS = (
    Api(
        key=68,
        name="ConsumerGroupHeartbeat",
        request=ConsumerGroupHeartbeatRequest,
        versions=(0, 1),
        handle=consumer_group_heartbeat,
        error_answer=_heartbeat_error,
        coordinator_key=group_key,
        response=ConsumerGroupHeartbeatResponse,
    ),
    Api(
        key=69,
        name="ConsumerGroupDescribe",
        request=ConsumerGroupDescribeRequest,
        versions=(0, 1),
        handle=consumer_group_describe,
        error_answer=_describe_error,
        coordinator_key=_first_group,
        response=ConsumerGroupDescribeResponse,
    ),
)
