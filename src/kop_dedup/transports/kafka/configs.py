"""DescribeConfigs (v1-4), AlterConfigs (v0-2) and IncrementalAlterConfigs (v0-1).

Topic resources are the topic manager's
(:class:`~kop_dedup.coordination.topics.TopicManager`): every config of a Kafka 4.1
topic, the value that applies and its source (the topic's own, the sidecar's setting
behind a Kafka broker config, or Kafka's default), read-only where the sidecar does not
apply the config, documented with what it does on Pulsar; an alter of what it cannot
honour is INVALID_CONFIG naming the config and why, and changes nothing of that
resource. Broker resources (this node's id; ``""``: the cluster's dynamic defaults,
none) list the sidecar's settings that stand for Kafka broker configs, read-only:
altering one is INVALID_CONFIG naming the setting to change. Other resource types are
INVALID_REQUEST; a broker id not this node's is INVALID_REQUEST, as Kafka answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from kop_dedup import errors
from kop_dedup.protocol import topic_configs as tc
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.settings import Settings
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = [
    "APIS",
    "alter_configs",
    "broker_entries",
    "describe_configs",
    "incremental_alter_configs",
]

_TOPIC, _BROKER = 2, 4
_Result = DescribeConfigsResponse.DescribeConfigsResult
_Config = _Result.DescribeConfigsResourceResult
_Synonym = _Config.DescribeConfigsSynonym


def broker_entries(settings: Settings, node_id: int, advertised: str) -> list[tc.Entry]:
    """The sidecar's settings that stand for Kafka broker configs, as entries (read-only:
    set the ``KOP_DEDUP_`` variable named in each one's documentation)."""
    s = settings
    rows: list[tuple[str, object, str | None, tc.Type]] = [
        ("node.id", node_id, None, tc.Type.INT),
        ("broker.id", node_id, None, tc.Type.INT),
        ("advertised.listeners", f"PLAINTEXT://{advertised}", "kafka_advertised", tc.Type.LIST),
        ("auto.create.topics.enable", str(s.kafka_auto_create_topics).lower(),
         "kafka_auto_create_topics", tc.Type.BOOLEAN),
        ("num.partitions", s.kafka_default_partitions, "kafka_default_partitions", tc.Type.INT),
        ("log.retention.ms", s.kafka_log_retention_ms, "kafka_log_retention_ms", tc.Type.LONG),
        ("log.retention.bytes", s.kafka_log_retention_bytes, "kafka_log_retention_bytes",
         tc.Type.LONG),
        ("log.cleanup.policy", "delete", None, tc.Type.LIST),
        ("log.message.timestamp.type", "CreateTime", None, tc.Type.STRING),
        ("compression.type", "producer", None, tc.Type.STRING),
        ("message.max.bytes", s.max_batch_bytes, "max_batch_bytes", tc.Type.INT),
        ("socket.request.max.bytes", s.kafka_max_request_bytes, "kafka_max_request_bytes",
         tc.Type.INT),
        ("transaction.max.timeout.ms", s.max_transaction_timeout_ms,
         "max_transaction_timeout_ms", tc.Type.INT),
        ("transactional.id.expiration.ms", int(s.transactional_id_expiry_seconds * 1000),
         "transactional_id_expiry_seconds", tc.Type.INT),
        ("producer.id.expiration.ms", int(s.producer_epoch_expiry_seconds * 1000),
         "producer_epoch_expiry_seconds", tc.Type.INT),
        ("group.min.session.timeout.ms", s.kafka_group_min_session_timeout_ms,
         "kafka_group_min_session_timeout_ms", tc.Type.INT),
        ("offsets.retention.minutes", s.group_retention_ms // 60_000, "group_retention_ms",
         tc.Type.INT),
    ]  # fmt: skip
    out = []
    for name, value, field, type_ in rows:
        explicit = field is None or field in s.model_fields_set
        source = tc.Source.STATIC_BROKER if explicit else tc.Source.DEFAULT
        doc = "the sidecar's own" if field is None else f"KOP_DEDUP_{field.upper()}"
        synonyms = ((name, str(value), source),)
        out.append(tc.Entry(name, str(value), source, True, type_, synonyms, doc))  # noqa: FBT003
    return out


def _other_broker(session: Session, name: str) -> errors.KafkaError | None:
    node_id = session.shared.node.node_id
    if name in ("", str(node_id)):
        return None
    return errors.InvalidRequest(
        f"Unexpected broker id, expected {node_id} or empty string, but received {name}"
    )


async def _describe_topic(session: Session, name: str, keys: list[str] | None) -> list[tc.Entry]:
    try:
        validate_topic(name)
        return await session.runtime.topics.describe(name, keys)
    except errors.KafkaError:
        raise
    except Exception as exc:
        raise translate(exc, f"describing the configs of {name}") from exc


def _describe_broker(session: Session, name: str, keys: list[str] | None) -> list[tc.Entry]:
    error = _other_broker(session, name)
    if error is not None:
        raise error
    if name == "":
        return []  # no dynamic cluster defaults
    node = session.shared.node
    entries = broker_entries(session.settings, node.node_id, f"{node.host}:{node.port}")
    return [e for e in entries if keys is None or e.name in keys]


async def _describe_one(
    session: Session, resource: Any
) -> tuple[list[tc.Entry], errors.KafkaError | None]:
    name, keys = resource.resource_name, resource.configuration_keys
    try:
        if resource.resource_type == _TOPIC:
            return await _describe_topic(session, name, keys), None
        if resource.resource_type == _BROKER:
            return _describe_broker(session, name, keys), None
        raise errors.InvalidRequest(f"resource type {resource.resource_type} is not served")
    except errors.KafkaError as exc:
        return [], exc


def _config(entry: tc.Entry, version: int, synonyms: bool, documentation: bool) -> Any:
    return _Config(
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=int(entry.source),
        is_default=entry.source is tc.Source.DEFAULT,
        is_sensitive=False,
        synonyms=[_Synonym(name=n, value=v, source=int(s)) for n, v, s in entry.synonyms]
        if synonyms
        else [],
        config_type=int(entry.type),
        documentation=entry.doc if documentation and version >= 3 else None,
    )


async def describe_configs(session: Session, request: Any, version: int) -> Any:
    synonyms = bool(getattr(request, "include_synonyms", False))
    documentation = bool(getattr(request, "include_documentation", False))
    results = []
    for resource in request.resources:
        entries, error = await _describe_one(session, resource)
        results.append(
            _Result(
                error_code=errors.NONE_ERRNO if error is None else error.errno,
                error_message=None if error is None else error.message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=[_config(e, version, synonyms, documentation) for e in entries],
            )
        )
    return DescribeConfigsResponse(version=version, throttle_time_ms=0, results=results)


def _describe_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return DescribeConfigsResponse(
        version=version,
        throttle_time_ms=0,
        results=[
            _Result(
                error_code=error.errno,
                error_message=error.message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=[],
            )
            for r in request.resources
        ],
    )


# -- AlterConfigs and IncrementalAlterConfigs -----------------------------------------------


async def _alter_one(
    session: Session, resource: Any, incremental: bool, validate_only: bool
) -> errors.KafkaError | None:
    name = resource.resource_name
    if resource.resource_type == _BROKER:
        error = _other_broker(session, name)
        if error is not None:
            return error
        node = session.shared.node
        settings = {e.name: e.doc for e in broker_entries(session.settings, node.node_id, "")}
        first = resource.configs[0].name if resource.configs else ""
        where = settings.get(first)
        return errors.InvalidConfig(
            f"{first} is not a broker config the sidecar serves"
            if where is None
            else f"{first} cannot be changed at run time: it is the sidecar's setting "
            f"{where}; set it there and restart the sidecar"
        )
    if resource.resource_type != _TOPIC:
        return errors.InvalidRequest(f"resource type {resource.resource_type} is not served")
    if incremental:
        change = _incremental([(c.name, c.config_operation, c.value) for c in resource.configs])
    else:
        change = _replace([(c.name, c.value) for c in resource.configs])
    try:
        validate_topic(name)
        await session.runtime.topics.alter(name, change, validate_only=validate_only)
    except errors.KafkaError as exc:
        return exc
    except Exception as exc:
        return translate(exc, f"altering the configs of {name}")
    return None


Change = Callable[[Mapping[str, str], tc.Defaults], dict[str, str]]


def _incremental(ops: list[tuple[str, int, str | None]]) -> Change:
    def change(current: Mapping[str, str], defaults: tc.Defaults) -> dict[str, str]:
        return tc.incremental(current, ops, defaults)

    return change


def _replace(pairs: list[tuple[str, str | None]]) -> Change:
    def change(current: Mapping[str, str], defaults: tc.Defaults) -> dict[str, str]:
        return tc.replace(current, pairs, defaults)

    return change


async def _alter(session: Session, request: Any, version: int, incremental: bool) -> Any:
    response = IncrementalAlterConfigsResponse if incremental else AlterConfigsResponse
    out = []
    for resource in request.resources:
        error = await _alter_one(session, resource, incremental, bool(request.validate_only))
        out.append(_altered(response, resource, error))
    return response(version=version, throttle_time_ms=0, responses=out)


def _altered(response: Any, resource: Any, error: errors.KafkaError | None) -> Any:
    return response.AlterConfigsResourceResponse(
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        error_message=None if error is None else error.message,
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
    )


async def alter_configs(session: Session, request: Any, version: int) -> Any:
    return await _alter(session, request, version, incremental=False)


async def incremental_alter_configs(session: Session, request: Any, version: int) -> Any:
    return await _alter(session, request, version, incremental=True)


def _alter_error(response: Any) -> Any:
    def answer(request: Any, version: int, error: errors.KafkaError) -> Any:
        return response(
            version=version,
            throttle_time_ms=0,
            responses=[_altered(response, r, error) for r in request.resources],
        )

    return answer


APIS = (
    Api(
        key=32,
        name="DescribeConfigs",
        request=DescribeConfigsRequest,
        versions=(1, 4),
        handle=describe_configs,
        error_answer=_describe_error,
    ),
    Api(
        key=33,
        name="AlterConfigs",
        request=AlterConfigsRequest,
        versions=(0, 2),
        handle=alter_configs,
        error_answer=_alter_error(AlterConfigsResponse),
    ),
    Api(
        key=44,
        name="IncrementalAlterConfigs",
        request=IncrementalAlterConfigsRequest,
        versions=(0, 1),
        handle=incremental_alter_configs,
        error_answer=_alter_error(IncrementalAlterConfigsResponse),
    ),
)
