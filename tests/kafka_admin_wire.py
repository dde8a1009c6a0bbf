"""Kafka's admin APIs spoken with a bare wire client (:class:`WireClient`) to any target
(the reference broker or the sidecar's listener): each helper sends one request and
answers what a conformance scenario compares (codes, values), never names per run."""

from __future__ import annotations

import time
from typing import Any

from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import ListOffsetsRequest, OffsetForLeaderEpochRequest

from tests.kafka_wire import WireClient

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def create_topic(
    c: WireClient,
    name: str,
    partitions: int = 1,
    configs: dict[str, str] | None = None,
    *,
    validate_only: bool = False,
    version: int = 7,
) -> Any:
    """CreateTopics of one topic; its result (code, configs answered)."""
    topic = CreateTopicsRequest.CreatableTopic
    request = CreateTopicsRequest(
        topics=[
            topic(
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                assignments=[],
                configs=[
                    topic.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()
                ],
            )
        ],
        timeout_ms=30000,
        validate_only=validate_only,
    )
    return c.call(request, version).topics[0]


def describe_configs(
    c: WireClient,
    name: str,
    keys: list[str] | None = None,
    *,
    rtype: int = TOPIC,
    version: int = 4,
    wait: bool = True,
) -> Any:
    """DescribeConfigs of one resource (a topic just created: asked again while it is
    not known yet, Kafka's metadata being a moment behind its controller)."""
    r = DescribeConfigsRequest
    request = r(
        resources=[
            r.DescribeConfigsResource(
                resource_type=rtype, resource_name=name, configuration_keys=keys
            )
        ],
        include_synonyms=True,
        include_documentation=True,
    )
    deadline = time.monotonic() + (30 if wait else 0)
    while True:
        result = c.call(request, version).results[0]
        if result.error_code != 3 or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def configs_of(result: Any) -> dict[str, tuple[str | None, int]]:
    """name -> (value, source) of a DescribeConfigs result."""
    return {cf.name: (cf.value, cf.config_source) for cf in result.configs}


def incremental(
    c: WireClient, name: str, ops: list[tuple[str, int, str | None]], *, validate_only: bool = False
) -> int:
    r = IncrementalAlterConfigsRequest
    request = r(
        resources=[
            r.AlterConfigsResource(
                resource_type=TOPIC,
                resource_name=name,
                configs=[
                    r.AlterConfigsResource.AlterableConfig(name=n, config_operation=o, value=v)
                    for n, o, v in ops
                ],
            )
        ],
        validate_only=validate_only,
    )
    return c.call(request, 1).responses[0].error_code


def alter(c: WireClient, name: str, pairs: dict[str, str], *, rtype: int = TOPIC) -> int:
    r = AlterConfigsRequest
    request = r(
        resources=[
            r.AlterConfigsResource(
                resource_type=rtype,
                resource_name=name,
                configs=[
                    r.AlterConfigsResource.AlterableConfig(name=k, value=v)
                    for k, v in pairs.items()
                ],
            )
        ],
        validate_only=False,
    )
    return c.call(request, 2).responses[0].error_code


def create_partitions(
    c: WireClient, names: list[str], count: int, *, validate_only: bool = False
) -> list[int]:
    r = CreatePartitionsRequest
    request = r(
        topics=[r.CreatePartitionsTopic(name=n, count=count, assignments=None) for n in names],
        timeout_ms=30000,
        validate_only=validate_only,
    )
    return [t.error_code for t in c.call(request, 3).results]


def delete_records(
    c: WireClient, name: str, offsets: list[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """(partition, low watermark, code) per (partition, offset), by partition (Kafka
    answers them in no set order)."""
    r = DeleteRecordsRequest
    request = r(
        topics=[
            r.DeleteRecordsTopic(
                name=name,
                partitions=[
                    r.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=p, offset=o)
                    for p, o in offsets
                ],
            )
        ],
        timeout_ms=30000,
    )
    answer = c.call(request, 2).topics[0].partitions
    return sorted((p.partition_index, p.low_watermark, p.error_code) for p in answer)


def list_offset(
    c: WireClient, name: str, partition: int, timestamp: int, version: int
) -> tuple[int, int, int]:
    """(code, offset, timestamp) of one ListOffsets lookup."""
    r = ListOffsetsRequest
    extra = {"timeout_ms": 30000} if version >= 10 else {}
    request = r(
        replica_id=-1,
        isolation_level=1,
        topics=[
            r.ListOffsetsTopic(
                name=name,
                partitions=[
                    r.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
                    )
                ],
            )
        ],
        **extra,
    )
    p = c.call(request, version).topics[0].partitions[0]
    return p.error_code, p.offset, p.timestamp


def epoch_end(
    c: WireClient, name: str, partition: int, current: int, epoch: int
) -> tuple[int, int, int]:
    """(code, leader epoch, end offset) of one OffsetForLeaderEpoch lookup."""
    r = OffsetForLeaderEpochRequest
    request = r(
        replica_id=-1,
        topics=[
            r.OffsetForLeaderTopic(
                topic=name,
                partitions=[
                    r.OffsetForLeaderTopic.OffsetForLeaderPartition(
                        partition=partition, current_leader_epoch=current, leader_epoch=epoch
                    )
                ],
            )
        ],
    )
    p = c.call(request, 4).topics[0].partitions[0]
    return p.error_code, p.leader_epoch, p.end_offset


def list_groups(c: WireClient, states: list[str], types: list[str]) -> Any:
    return c.call(ListGroupsRequest(states_filter=states, types_filter=types), 5)


def list_transactions(
    c: WireClient,
    version: int,
    states: list[str] | None = None,
    producer_ids: list[int] | None = None,
    duration: int = -1,
    pattern: str | None = None,
) -> Any:
    extra: dict[str, Any] = {}
    if version >= 1:
        extra["duration_filter"] = duration
    if version >= 2:
        extra["transactional_id_pattern"] = pattern
    request = ListTransactionsRequest(
        state_filters=states or [], producer_id_filters=producer_ids or [], **extra
    )
    return c.call(request, version)


def describe_transactions(c: WireClient, ids: list[str]) -> list[Any]:
    return c.call(DescribeTransactionsRequest(transactional_ids=ids), 0).transaction_states


def describe_producers(c: WireClient, name: str, partitions: list[int]) -> list[Any]:
    r = DescribeProducersRequest
    request = r(topics=[r.TopicRequest(name=name, partition_indexes=partitions)])
    return c.call(request, 0).topics[0].partitions


def describe_cluster(
    c: WireClient, version: int, *, operations: bool = False, endpoint: int = 1
) -> Any:
    extra: dict[str, Any] = {}
    if version >= 1:
        extra["endpoint_type"] = endpoint
    if version >= 2:
        extra["include_fenced_brokers"] = False
    request = DescribeClusterRequest(include_cluster_authorized_operations=operations, **extra)
    return c.call(request, version)
