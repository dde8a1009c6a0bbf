"""Sidecars sharing one Pulsar form one Kafka cluster: the same Metadata and
FindCoordinator answers from every node, leaders and coordinators spread over them,
refusals (6, 16) for what another node owns, HTTP requests forwarded, and nothing taken
from a live owner.

Real broker, real sidecars (uvicorn on real sockets), real Kafka wire requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from kop_dedup_tools.topics import create_topic
from tests.helpers import batch, uniq, wait_until
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trio(pulsar: Any) -> Iterator[list[ThreadSidecar]]:
    """Three sidecars of one cluster (their own system namespace), each with its own
    Kafka listener, node ids 1, 2, 3."""
    ns = uniq("sys")
    nodes = [
        ThreadSidecar(pulsar, system_namespace=ns, node_id=i, cluster_refresh_ms=300).start()
        for i in (1, 2, 3)
    ]
    try:
        wait_until(
            "every node to list three members",
            lambda: all(len(n.runtime.cluster.members) == 3 for n in nodes),
        )
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _metadata(node: ThreadSidecar, topic: str) -> tuple[list[tuple[int, str, int]], dict[int, int]]:
    with WireClient(node.kafka_bootstrap) as c:
        request = MetadataRequest[9](
            topics=[MetadataRequest[9].MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        answer = c.call(request, 9)
    brokers = sorted((b.node_id, b.host, b.port) for b in answer.brokers)
    (t,) = answer.topics
    return brokers, {p.partition_index: p.leader_id for p in t.partitions}


def _coordinator(node: ThreadSidecar, key_type: int, key: str) -> int:
    with WireClient(node.kafka_bootstrap) as c:
        answer = c.call(FindCoordinatorRequest[2](key=key, key_type=key_type), 2)
    assert answer.error_code == 0, answer
    return int(answer.node_id)


def test_every_node_answers_the_same_metadata_with_leaders_spread_evenly(trio, pulsar):
    topic = uniq("ct")
    create_topic(pulsar.admin_url, topic, partitions=12)
    answers = [_metadata(n, topic) for n in trio]
    assert answers[0] == answers[1] == answers[2]
    brokers, leaders = answers[0]
    assert [b[0] for b in brokers] == [1, 2, 3]
    assert {(b[1], b[2]) for b in brokers} == {
        (n.runtime.cluster.me.host, n.runtime.cluster.me.port) for n in trio
    }
    assert sorted(Counter(leaders.values()).values()) == [4, 4, 4]


def test_find_coordinator_names_the_same_node_for_every_key_from_every_node(trio):
    groups = [uniq("g") for _ in range(200)]
    tids = [uniq("tid") for _ in range(200)]
    for key_type, keys in ((0, groups), (1, tids)):
        seen = [[_coordinator(n, key_type, k) for k in keys] for n in trio]
        assert seen[0] == seen[1] == seen[2]
        assert set(seen[0]) == {1, 2, 3}  # spread over the nodes


def test_the_state_partitions_are_split_and_each_has_one_owner(trio):
    for log in ("__transaction_state", "__consumer_offsets"):
        owned = [set(n.runtime.cluster.owned_partitions()[log]) for n in trio]
        assert set().union(*owned) == set(range(8))
        assert sum(len(o) for o in owned) == 8  # nobody owns one twice
        assert all(o for o in owned)


def test_an_http_producer_alternating_nodes_is_answered_at_once_every_time(trio, pulsar):
    topic = uniq("alt")
    create_topic(pulsar.admin_url, topic, partitions=3)
    clients = [httpx.Client(base_url=n.url, timeout=60) for n in trio]
    try:
        pid = clients[0].post("/v1/init-producer-id", json={}).json()["producerId"]
        for n in range(90):
            body = {"batches": [batch(topic, pid, n // 3, 1, partition=n % 3)]}
            answer = clients[n % 3].post("/v1/produce", json=body).json()
            assert answer["results"][0]["errorCode"] == 0, (n, answer)
    finally:
        for c in clients:
            c.close()
    forwarded = sum(n.runtime.cluster.stats.forwarded for n in trio)
    assert forwarded >= 45  # about two thirds of them reached a node that did not lead


def test_a_kafka_request_for_a_partition_another_node_leads_is_answered_not_leader(trio, pulsar):
    from kafka.protocol.consumer import ListOffsetsRequest

    topic = uniq("nl")
    create_topic(pulsar.admin_url, topic, partitions=3)
    _, leaders = _metadata(trio[0], topic)
    for partition, leader in leaders.items():
        other = next(n for n in trio if n.runtime.cluster.me.node_id != leader)
        req = ListOffsetsRequest[5](
            replica_id=-1,
            isolation_level=0,
            topics=[
                ListOffsetsRequest[5].ListOffsetsTopic(
                    name=topic,
                    partitions=[
                        ListOffsetsRequest[5].ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=partition, current_leader_epoch=-1, timestamp=-1
                        )
                    ],
                )
            ],
        )
        with WireClient(other.kafka_bootstrap) as c:
            answer = c.call(req, 5)
        assert answer.topics[0].partitions[0].error_code == 6
        owner = next(n for n in trio if n.runtime.cluster.me.node_id == leader)
        with WireClient(owner.kafka_bootstrap) as c:
            answer = c.call(req, 5)
        assert answer.topics[0].partitions[0].error_code == 0


def test_the_cluster_endpoint_shows_the_nodes_and_who_owns_what(trio):
    described = httpx.get(f"{trio[1].url}/v1/cluster", timeout=30).json()
    assert described["nodeId"] == 2
    assert [n["nodeId"] for n in described["nodes"]] == [1, 2, 3]
    owners = described["stateOwners"]["__transaction_state"]
    assert sorted(Counter(owners.values()).values()) == [2, 3, 3]
    assert described["owned"]["__transaction_state"] == sorted(
        int(p) for p, n in owners.items() if n == 2
    )
