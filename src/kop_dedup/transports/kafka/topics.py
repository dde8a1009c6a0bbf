"""CreateTopics and DeleteTopics: partitioned topics of the Kafka namespace.

As Kafka answers, per topic: INVALID_TOPIC_EXCEPTION for a name Kafka (or the mapping
to Pulsar) refuses, TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS for a count below 1
(-1 takes ``KAFKA_DEFAULT_PARTITIONS``), INVALID_REQUEST for a name asked twice,
UNKNOWN_TOPIC_OR_PARTITION for deleting what is not there. Topic configs are stored
with the topic and applied to its Pulsar topic by the topic manager
(:class:`~kop_dedup.coordination.topics.TopicManager`: ``retention.ms``,
``retention.bytes``, ``cleanup.policy``; a config it cannot serve is INVALID_CONFIG),
and answered as Kafka does from v5 (every config, its value and source). The
replication factor is the namespace's business in Pulsar: accepted, answered as 1.
``validate_only`` checks without creating. Deleting a topic disconnects the producers
on it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)

from kop_dedup import errors
from kop_dedup.protocol import topic_configs as tc
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "create_topics", "delete_topics"]

_Created = CreateTopicsResponse.CreatableTopicResult
_CONFIGS_FROM = 5  # CreateTopics answers the topic's configs from v5
_CreatedConfig = _Created.CreatableTopicConfigs


def _created(
    name: str,
    error: errors.KafkaError | None,
    partitions: int = -1,
    configs: list[tc.Entry] | None = None,
) -> Any:
    return _Created(
        name=name,
        topic_id=None,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        error_message=None if error is None else error.message,
        topic_config_error_code=errors.NONE_ERRNO,
        num_partitions=partitions if error is None else -1,
        replication_factor=1 if error is None else -1,
        configs=[
            _CreatedConfig(
                name=e.name,
                value=e.value,
                read_only=e.read_only,
                config_source=int(e.source),
                is_sensitive=False,
            )
            for e in configs or []
        ],
    )


def _count(session: Session, topic: Any) -> int:
    """The partitions a CreatableTopic asks for; a Kafka error when it cannot be."""
    validate_topic(topic.name)
    count = int(topic.num_partitions)
    if topic.assignments:
        if count != -1:
            raise errors.InvalidRequest("both numPartitions and replica assignments given")
        count = len(topic.assignments)
    elif count == -1:
        count = session.settings.kafka_default_partitions
    if count < 1:
        raise errors.InvalidPartitions("number of partitions must be at least 1")
    return count


async def _create(session: Session, topic: Any, validate_only: bool, version: int) -> Any:
    name = topic.name
    manager = session.runtime.topics
    try:
        count = _count(session, topic)
        configs = [(c.name, c.value) for c in topic.configs or []]
        entries = await manager.create(name, count, configs, validate_only=validate_only)
    except errors.KafkaError as exc:
        return _created(name, exc)
    except Exception as exc:
        return _created(name, translate(exc, f"creating topic {name}"))
    return _created(name, None, count, entries if version >= _CONFIGS_FROM else [])


async def create_topics(session: Session, request: Any, version: int) -> Any:
    seen = Counter(t.name for t in request.topics)
    results = []
    for topic in request.topics:
        if seen[topic.name] > 1:
            results.append(_created(topic.name, errors.InvalidRequest("topic named twice")))
        else:
            validate = version >= 1 and bool(request.validate_only)
            results.append(await _create(session, topic, validate, version))
    return CreateTopicsResponse(version=version, throttle_time_ms=0, topics=results)


def _create_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return CreateTopicsResponse(
        version=version,
        throttle_time_ms=0,
        topics=[_created(t.name, error) for t in request.topics],
    )


# -- DeleteTopics -------------------------------------------------------------------------


def _names(request: Any, version: int) -> list[str | None]:
    return list(request.topic_names) if version < 6 else [t.name for t in request.topics]


def _deleted(name: str | None, error: errors.KafkaError | None) -> Any:
    return DeleteTopicsResponse.DeletableTopicResult(
        name=name,
        topic_id=None,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        error_message=None if error is None else error.message,
    )


async def _delete(session: Session, name: str | None) -> Any:
    if name is None:
        return _deleted(None, errors.UnknownTopicOrPartition("topic ids are not served"))
    try:
        validate_topic(name)
        full = session.runtime.naming.topic(name)
        kept = session.shared.readers
        if kept is not None:  # close this topic's readers first: none reconnects to it
            await kept.forget(full)
        await session.runtime.stable.forget(full)
        # its producers, the copies of commits into it too
        async with session.runtime.copier.deleting(full):
            await session.runtime.service.channels.forget_topic(full)
            await session.runtime.admin.delete_topic(name)
    except errors.InvalidTopic:
        return _deleted(name, errors.UnknownTopicOrPartition(f"topic {name!r} does not exist"))
    except errors.KafkaError as exc:
        return _deleted(name, exc)
    except Exception as exc:
        return _deleted(name, translate(exc, f"deleting topic {name}"))
    return _deleted(name, None)


async def delete_topics(session: Session, request: Any, version: int) -> Any:
    results = [await _delete(session, name) for name in _names(request, version)]
    return DeleteTopicsResponse(version=version, throttle_time_ms=0, responses=results)


def _delete_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return DeleteTopicsResponse(
        version=version,
        throttle_time_ms=0,
        responses=[_deleted(n, error) for n in _names(request, version)],
    )


APIS = (
    Api(
        key=19,
        name="CreateTopics",
        request=CreateTopicsRequest,
        versions=(0, 7),
        handle=create_topics,
        error_answer=_create_error,
    ),
    Api(
        key=20,
        name="DeleteTopics",
        request=DeleteTopicsRequest,
        versions=(0, 6),
        handle=delete_topics,
        error_answer=_delete_error,
    ),
)
