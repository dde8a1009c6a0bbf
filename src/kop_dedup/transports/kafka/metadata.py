"""Metadata and FindCoordinator: the cluster as :mod:`.topology` tells it.

Brokers are the cluster's live nodes at their advertised addresses (this node alone
in sidecar mode); each partition's leader is the node the cluster's placement names
(:mod:`kop_dedup.cluster.placement`), the same answer from every node; FindCoordinator
answers the owner of the key's state partition. Topics are the partitioned topics of
the Kafka namespace (``KOP_DEDUP_NAMESPACE``). A Metadata request naming a topic that
does not exist creates it with ``KAFKA_DEFAULT_PARTITIONS`` when
``KAFKA_AUTO_CREATE_TOPICS`` is on and the client allows it (v4+), at most
``KAFKA_MAX_AUTO_CREATE_TOPICS`` per request (the others: 3), and answers it at
once (Kafka answers LEADER_NOT_AVAILABLE first and lets the client ask again); otherwise
UNKNOWN_TOPIC_OR_PARTITION, or INVALID_TOPIC_EXCEPTION for a name Kafka (or the
mapping to Pulsar) refuses. Each topic has a stable id (:mod:`kop_dedup.protocol.topic_ids`,
answered from v10; Produce and Fetch are capped at v12, so only Metadata and the consumer
protocol use it). A request naming any nonzero topic id is a request by id, as Kafka's:
the names are ignored (the Java consumer's ``forTopicIds`` sends ``""``, librdkafka
null), a known id is answered with its topic and an unknown one UNKNOWN_TOPIC_ID (100)
with the id. Leader epochs are 0: leadership is recomputed, not elected, so there is no
epoch every node would agree on.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from kop_dedup import errors
from kop_dedup.protocol.topic_ids import by_id, topic_id
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.security.authorizer import DESCRIBE
from kop_dedup.transports.kafka import topology
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "find_coordinator", "metadata"]

log = logging.getLogger("kop_dedup.kafka")

_Topic = MetadataResponse.MetadataResponseTopic
_Partition = _Topic.MetadataResponsePartition
_COORDINATOR_KEY_TYPES = (0, 1)  # group, transaction
_ASK_EACH_UP_TO = 32  # more topics named in one request: the namespace is listed once


def _topic(
    name: str | None,
    error: errors.KafkaError | None,
    leaders: dict[int, int] | None = None,
    *,
    tid: uuid.UUID | None = None,
) -> Any:
    """A topic's answer; its id when it is answered (or ``tid``: an error by id)."""
    return _Topic(
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        name=name,
        topic_id=topic_id(name) if name and error is None else tid,
        is_internal=False,
        partitions=[
            _Partition(
                error_code=errors.NONE_ERRNO,
                partition_index=i,
                leader_id=leader,
                leader_epoch=0,
                replica_nodes=[leader],
                isr_nodes=[leader],
                offline_replicas=[],
            )
            for i, leader in sorted((leaders or {}).items())
        ],
        authorized_operations=None,
    )


async def _describe(session: Session, name: str, create: bool) -> Any:
    try:
        validate_topic(name)
    except errors.InvalidTopic as exc:
        return _topic(name, exc)
    s = session.settings
    try:
        count = await session.runtime.admin.partitions(
            name, create_with=s.kafka_default_partitions if create else None
        )
    except errors.KafkaError as exc:
        return _topic(name, exc)
    except Exception as exc:
        return _topic(name, translate(exc, f"describing topic {name}"))
    return _topic(name, None, topology.leaders(session, name, count))


def _answer(session: Session | None, version: int, topics: list[Any]) -> Any:
    listed = [] if session is None else topology.brokers(session)
    brokers = [
        MetadataResponse.MetadataResponseBroker(
            node_id=b.node_id, host=b.host, port=b.port, rack=None
        )
        for b in listed
    ]
    return MetadataResponse(
        version=version,
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=None if session is None else session.shared.node.cluster_id,
        controller_id=-1 if session is None else topology.controller(session),
        topics=topics,
        authorized_operations=None,
        error_code=errors.NONE_ERRNO,
    )


async def metadata(session: Session, request: Any, version: int) -> Any:
    """Metadata; a failure answers every topic asked for with its code and still names
    this node: librdkafka (2.10+) decommissions a broker missing from a Metadata answer,
    and a transactional producer whose group coordinator was decommissioned hangs in
    send_offsets_to_transaction (librdkafka #5511)."""
    try:
        return await _metadata(session, request, version)
    except errors.KafkaError as exc:
        error = exc
    except Exception as exc:
        error = translate(exc, "listing topics")
    topics = [] if request.topics is None else request.topics
    answer = _answer(session, version, [_topic(t.name, error) for t in topics])
    if version >= 13:
        answer.error_code = error.errno
    return answer


async def _metadata(session: Session, request: Any, version: int) -> Any:
    everything = request.topics is None or (version == 0 and not request.topics)
    unknown: list[uuid.UUID] | None = None  # asked by id: the ids no topic has
    if everything:
        names: list[str] = []
        for name in await session.runtime.admin.topics():
            try:
                validate_topic(name)
            except errors.InvalidTopic:
                continue  # a Pulsar topic Kafka cannot name: not a Kafka topic
            names.append(name)
        create = False
    else:
        names, unknown = await _named(session, request.topics)
        create = (
            unknown is None
            and session.settings.kafka_auto_create_topics
            and (version < 4 or bool(request.allow_auto_topic_creation))
        )
    hidden = await _not_describable(session, names)
    refused = _refused_by_id if unknown is not None else _refused
    first = [
        _topic(None, errors.UnknownTopicId("no topic has this id"), tid=i) for i in unknown or ()
    ]
    if everything:
        names = [n for n in names if n not in hidden]
    elif len(names) > _ASK_EACH_UP_TO or (
        create and len(names) > session.settings.kafka_max_auto_create_topics
    ):
        shown = [n for n in names if n not in hidden]
        many = dict(zip(shown, await _many(session, shown, create), strict=True))
        return _answer(
            session,
            version,
            first
            + [
                many[n]
                if n not in hidden
                else await refused(n, errors.TopicAuthorizationFailed(hidden[n]))
                for n in names
            ],
        )
    described = await asyncio.gather(
        *(
            _describe(session, n, create)
            if n not in hidden
            else refused(n, errors.TopicAuthorizationFailed(hidden[n]))
            for n in names
        )
    )
    if everything:  # a topic deleted between the listing and now is just gone
        described = [t for t in described if t.error_code != errors.UnknownTopicOrPartition.errno]
    return _answer(session, version, first + list(described))


async def _named(session: Session, topics: list[Any]) -> tuple[list[str], list[uuid.UUID] | None]:
    """The names asked, once each, and None; or, for a request naming any nonzero topic
    id (v12: librdkafka's and the Java consumer's KIP-848 assignment, which Kafka serves
    by id whatever the names), the topics of the known ids and the unknown ids."""
    ids = [i for t in topics if (i := getattr(t, "topic_id", None)) is not None and i.int]
    if not ids:
        return list(dict.fromkeys(str(t.name or "") for t in topics)), None
    known = by_id(await session.runtime.admin.topics())
    ids = list(dict.fromkeys(ids))
    return [known[i] for i in ids if i in known], [i for i in ids if i not in known]


async def _many(session: Session, names: list[str], create: bool) -> list[Any]:
    """Many topics named at once: the namespace is listed once, a topic not in it is
    answered 3 without a lookup, and at most ``KAFKA_MAX_AUTO_CREATE_TOPICS`` of them are
    created (the others are answered 3: a later request may create them)."""
    existing = set(await session.runtime.admin.topics())
    cap = session.settings.kafka_max_auto_create_topics if create else 0
    answers: list[Any] = []
    lookups: dict[int, tuple[str, bool]] = {}  # answer index -> (name, create)
    missing = 0
    for name in names:
        if name in existing:
            lookups[len(answers)] = (name, False)
            answers.append(None)
            continue
        try:
            validate_topic(name)
        except errors.InvalidTopic as exc:
            answers.append(_topic(name, exc))
            continue
        missing += 1
        if missing <= cap:
            lookups[len(answers)] = (name, True)
            answers.append(None)
            continue
        why = "past KOP_DEDUP_KAFKA_MAX_AUTO_CREATE_TOPICS" if create else "it does not exist"
        answers.append(_topic(name, errors.UnknownTopicOrPartition(why)))
    if create and missing > cap:
        log.info(
            "kafka metadata: %d missing topics named, %d created (KAFKA_MAX_AUTO_CREATE_TOPICS)",
            missing,
            cap,
            extra={"peer": session.peer, "client_id": session.client_id},
        )
    described = await asyncio.gather(*(_describe(session, n, c) for n, c in lookups.values()))
    for i, topic in zip(lookups, described, strict=True):
        answers[i] = topic
    return answers


async def _not_describable(session: Session, names: list[str]) -> dict[str, str]:
    """Of ``names``, those the caller's role may neither produce nor consume (nor create),
    with why: listed as 29 TOPIC_AUTHORIZATION_FAILED, or left out of a full listing."""
    who = session.identity
    if who.superuser:
        return {}
    allowed = await session.runtime.authorizer.may_each(who, DESCRIBE, names)
    return {
        n: f"role {who.role!r} has neither produce nor consume permission on topic {n!r}"
        for n in names
        if not allowed[n]
    }


async def _refused(name: str, error: errors.KafkaError) -> Any:
    return _topic(name, error)


async def _refused_by_id(name: str, error: errors.KafkaError) -> Any:
    """Asked by id: Kafka answers the id, not the name (an id is not sensitive)."""
    return _topic(None, error, tid=topic_id(name))


def _metadata_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    topics = [] if request is None or request.topics is None else request.topics
    answer = _answer(None, version, [_topic(t.name, error) for t in topics])
    if version >= 13:
        answer.error_code = error.errno
    return answer


# -- FindCoordinator ----------------------------------------------------------------------


def _coordinator(session: Session | None, key_type: int, key: str) -> tuple[Any, ...]:
    """(error, node id, host, port) for a key: its coordinator (:mod:`.topology`)."""
    if session is None:
        return errors.KafkaError(), -1, "", -1
    if key_type not in _COORDINATOR_KEY_TYPES:
        return errors.InvalidRequest(f"unknown coordinator key type {key_type}"), -1, "", -1
    broker = topology.coordinator_of(session, key_type, key)
    return None, broker.node_id, broker.host, broker.port


async def find_coordinator(session: Session, request: Any, version: int) -> Any:
    return _find_answer(session, request, version, None)


def _find_answer(
    session: Session | None, request: Any, version: int, forced: errors.KafkaError | None
) -> Any:
    key_type = 0 if version < 1 else request.key_type
    if version < 4:
        error, node_id, host, port = _coordinator(session, key_type, request.key)
        error = forced or error
        return FindCoordinatorResponse(
            version=version,
            throttle_time_ms=0,
            error_code=errors.NONE_ERRNO if error is None else error.errno,
            error_message=None if error is None else error.message,
            node_id=node_id,
            host=host,
            port=port,
        )
    coordinators = []
    for key in request.coordinator_keys:
        error, node_id, host, port = _coordinator(session, key_type, key)
        error = forced or error
        coordinators.append(
            FindCoordinatorResponse.Coordinator(
                key=key,
                node_id=node_id,
                host=host,
                port=port,
                error_code=errors.NONE_ERRNO if error is None else error.errno,
                error_message=None if error is None else error.message,
            )
        )
    return FindCoordinatorResponse(version=version, throttle_time_ms=0, coordinators=coordinators)


def _find_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return _find_answer(None, request, version, error)


APIS = (
    Api(
        key=3,
        name="Metadata",
        request=MetadataRequest,
        versions=(0, 12),
        handle=metadata,
        error_answer=_metadata_error,
    ),
    Api(
        key=10,
        name="FindCoordinator",
        request=FindCoordinatorRequest,
        versions=(0, 4),
        handle=find_coordinator,
        error_answer=_find_error,
    ),
)
