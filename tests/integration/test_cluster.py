"""Sidecars sharing one Pulsar form one Kafka cluster: the same Metadata and
FindCoordinator answers from every node, leaders and coordinators spread over them,
refusals (6, 16) for what another node owns, HTTP requests forwarded, and nothing taken
from a live owner.

Real broker, real sidecars (uvicorn on real sockets), real Kafka wire requests."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from kop_dedup_tools.topics import create_topic
from tests.helpers import batch, read_all, uniq, wait_until
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


def test_an_http_producer_alternating_nodes_is_answered_at_once_every_time(
    trio, pulsar, pulsar_reader_client
):
    """Each partition's batches go through each node in turn: a third reach the leader,
    the others are forwarded to it; every one is answered 0 at its first try and stored
    once, in order."""
    topic = uniq("alt")
    create_topic(pulsar.admin_url, topic, partitions=3)
    clients = [httpx.Client(base_url=n.url, timeout=60) for n in trio]
    before = sum(n.runtime.cluster.stats.forwarded for n in trio)
    try:
        pid = clients[0].post("/v1/init-producer-id", json={}).json()["producerId"]
        for n in range(90):
            body = {"batches": [batch(topic, pid, n // 3, 1, partition=n % 3)]}
            answer = clients[(n // 3) % 3].post("/v1/produce", json=body).json()
            assert answer["results"][0]["errorCode"] == 0, (n, answer)
    finally:
        for c in clients:
            c.close()
    assert sum(n.runtime.cluster.stats.forwarded for n in trio) - before == 60
    for p in range(3):
        ptopic = f"persistent://public/kafka/{topic}-partition-{p}"
        stored = [m.data().decode() for m in read_all(pulsar_reader_client, ptopic)]
        assert stored == [f"{pid}:0:{s}" for s in range(30)]


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


def test_the_cluster_endpoint_names_the_coordinator_of_a_key_as_findcoordinator_does(trio):
    """``?transactionalId=`` and ``?groupId=`` answer the node Kafka's FindCoordinator
    names, on every node alike; every node coordinates some keys."""
    keys = [uniq("k") for _ in range(40)]
    seen: dict[str, set[int]] = {"transactionalId": set(), "groupId": set()}
    for key in keys:
        kinds = {"transactionalId": 1, "groupId": 0}
        for kind, key_type in kinds.items():
            answers = {
                httpx.get(f"{n.url}/v1/cluster", params={kind: key}, timeout=30).json()[
                    "coordinators"
                ][kind]
                for n in trio
            }
            with WireClient(trio[0].kafka_bootstrap) as c:
                found = c.call(FindCoordinatorRequest(key=key, key_type=key_type), 2)
            assert found.error_code == 0, found
            assert answers == {found.node_id}, (kind, key, answers, found)
            seen[kind] |= answers
    assert seen == {"transactionalId": {1, 2, 3}, "groupId": {1, 2, 3}}


@pytest.fixture(scope="module")
def sidecars(pulsar: Any) -> Iterator[list[ThreadSidecar]]:
    """Two nodes of one cluster in sidecar mode: each Kafka listener is all its clients
    can reach."""
    ns = uniq("sys")
    nodes = [
        ThreadSidecar(
            pulsar, system_namespace=ns, node_id=i, cluster_mode="sidecar", cluster_refresh_ms=300
        ).start()
        for i in (1, 2)
    ]
    try:
        wait_until(
            "both nodes to list two members",
            lambda: all(len(n.runtime.cluster.members) == 2 for n in nodes),
        )
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_in_sidecar_mode_a_listener_is_a_one_node_cluster_that_forwards(sidecars, pulsar):
    """Through node 1's listener alone: Metadata names node 1 only; an idempotent
    producer's batches for partitions node 2 leads, a transaction node 2 coordinates and a
    consumer group node 2 coordinates all work (forwarded), every record once."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    one, two = sidecars
    topic = uniq("sc")
    create_topic(pulsar.admin_url, topic, partitions=4)
    brokers, leaders = _metadata(one, topic)
    assert [b[0] for b in brokers] == [1]
    assert set(leaders.values()) == {1}
    assert set(one.runtime.cluster.leaders(topic, 4).values()) != {one.runtime.cluster.me}
    producer = Producer({"bootstrap.servers": one.kafka_bootstrap, "enable.idempotence": True})
    for i in range(200):
        producer.produce(topic, value=str(i).encode(), partition=i % 4)
    assert producer.flush(60) == 0
    tid = next(
        t
        for t in (uniq("tid") for _ in range(1000))
        if one.runtime.cluster.txn_coordinator(t).node_id == 2
    )
    txp = Producer({"bootstrap.servers": one.kafka_bootstrap, "transactional.id": tid})
    txp.init_transactions(60)
    txp.begin_transaction()
    for i in range(200, 220):
        txp.produce(topic, value=str(i).encode(), partition=i % 4)
    txp.commit_transaction(60)
    group = next(
        g
        for g in (uniq("g") for _ in range(1000))
        if one.runtime.cluster.group_coordinator(g).node_id == 2
    )
    consumer = Consumer(
        {
            "bootstrap.servers": one.kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    seen: list[str] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 90
        while len(seen) < 220 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                seen.append(msg.value().decode())
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in range(4)], timeout=30)
    finally:
        consumer.close()
    assert sorted(seen, key=int) == [str(i) for i in range(220)]
    assert sum(tp.offset for tp in committed) == 220
    offsets = httpx.get(f"{two.url}/v1/groups/{group}/offsets", timeout=30).json()["offsets"]
    assert sum(o["offset"] for o in offsets) == 220  # the coordinator, node 2, holds them
    assert one.runtime.cluster.stats.forwarded > 0


def test_transactions_and_groups_of_real_clients_work_across_a_cluster(trio, pulsar):
    """librdkafka through one node's bootstrap: a transaction over partitions led by all
    three nodes (its batches reach each leader, which forwards them to the transaction's
    coordinator), then a read_committed group consumer: every record once."""
    from confluent_kafka import Consumer, Producer

    topic = uniq("ctx")
    create_topic(pulsar.admin_url, topic, partitions=6)
    _, leaders = _metadata(trio[0], topic)
    assert set(leaders.values()) == {1, 2, 3}
    tid = uniq("tid")
    txp = Producer({"bootstrap.servers": trio[0].kafka_bootstrap, "transactional.id": tid})
    txp.init_transactions(60)
    txp.begin_transaction()
    for i in range(120):
        txp.produce(topic, value=str(i).encode(), partition=i % 6)
    txp.commit_transaction(60)
    consumer = Consumer(
        {
            "bootstrap.servers": trio[1].kafka_bootstrap,
            "group.id": uniq("g"),
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    seen: list[str] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 90
        while len(seen) < 120 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                seen.append(msg.value().decode())
    finally:
        consumer.close()
    assert sorted(seen, key=int) == [str(i) for i in range(120)]
