"""Leaders and producer names across a change: a topic that grows keeps every leader
(Kafka never moves one when partitions are added), and a producer name left on a node
that does not lead its partition is handed to the leader at that node's next listing,
not after the idle reaper (``PRODUCER_IDLE_SECONDS``, 300 s).

Two real sidecars of one cluster (their own system namespace), a real broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka.protocol.admin import CreatePartitionsRequest
from kafka.protocol.metadata import MetadataRequest

from kop_dedup.cluster.peers import FORWARDED
from kop_dedup.cluster.placement import score
from kop_dedup_tools.topics import create_topic
from tests.cluster_nodes import RETRIABLE
from tests.helpers import batch, read_all, uniq, wait_until
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

REFRESH_MS = 300
ACCEPTED_WITHIN_S = 5.0
"""A few listings; the build before answered 6 for PRODUCER_IDLE_SECONDS."""


@pytest.fixture(scope="module")
def pair(pulsar: Any) -> Iterator[list[ThreadSidecar]]:
    """Two sidecars of one cluster, node ids 1 and 2."""
    ns = uniq("sys")
    nodes = [
        ThreadSidecar(pulsar, system_namespace=ns, node_id=i, cluster_refresh_ms=REFRESH_MS).start()
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


def _leaders(node: ThreadSidecar, topic: str) -> dict[int, int]:
    request = MetadataRequest[9](
        topics=[MetadataRequest[9].MetadataRequestTopic(name=topic)],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    with WireClient(node.kafka_bootstrap) as c:
        (t,) = c.call(request, 9).topics
    return {p.partition_index: p.leader_id for p in t.partitions}


def _leaders_of_grown(node: ThreadSidecar, topic: str, count: int) -> dict[int, int]:
    """The node's Metadata leaders once it answers ``count`` partitions (a node that did
    not grow the topic sees it within its partition-count cache)."""

    def grown() -> dict[int, int] | None:
        leaders = _leaders(node, topic)
        return leaders if len(leaders) == count else None

    return wait_until(f"node {node.runtime.cluster.me.node_id} to see {count} partitions", grown)


def _produce_until_accepted(url: str, body: dict[str, Any], within: float) -> tuple[float, list]:
    """Send ``body`` as a client retries a retriable answer; (seconds to the 0, codes seen
    before it). AssertionError with the last answer past ``within``."""
    t0, seen = time.monotonic(), []
    while True:
        answer = httpx.post(f"{url}/v1/produce", json=body, timeout=30).json()
        code = answer["results"][0]["errorCode"]
        if code == 0:
            return time.monotonic() - t0, seen
        seen.append(code)
        assert code in RETRIABLE, answer
        assert time.monotonic() - t0 < within, (f"not accepted within {within} s", answer)
        time.sleep(0.1)


def _same_first_choice_topic() -> str:
    """A topic whose partitions 0 and 1 both rank node 1 first: the bounded-load rule put
    partition 1 on node 2 while each node could hold one, and moved it to node 1 (which
    could hold two) once the topic had three partitions."""
    while True:
        topic = uniq("grow")
        firsts = {max((1, 2), key=lambda n: score(n, f"topic:{topic}/{i}")) for i in (0, 1)}
        if firsts == {1}:
            return topic


def test_a_topic_that_grows_keeps_its_leaders_and_its_producers_go_on_at_once(
    pair, pulsar, pulsar_reader_client
):
    topic = _same_first_choice_topic()
    create_topic(pulsar.admin_url, topic, partitions=2)
    pid = httpx.post(f"{pair[0].url}/v1/init-producer-id", json={}, timeout=30).json()
    pid = pid["producerId"]
    for seq in range(2):  # each node forwards to the leader, which opens the name
        body = {"batches": [batch(topic, pid, seq, 1, partition=1)]}
        _produce_until_accepted(pair[seq].url, body, ACCEPTED_WITHIN_S)
    before = _leaders(pair[0], topic)
    assert _leaders(pair[1], topic) == before

    grow = CreatePartitionsRequest(
        topics=[
            CreatePartitionsRequest.CreatePartitionsTopic(name=topic, count=3, assignments=None)
        ],
        timeout_ms=30000,
        validate_only=False,
    )
    with WireClient(pair[0].kafka_bootstrap) as c:
        assert c.call(grow, 1).results[0].error_code == 0
    after = [_leaders_of_grown(n, topic, 3) for n in pair]
    assert after[0] == after[1]
    assert {p: after[0][p] for p in before} == before  # no existing leader moved

    leader = next(n for n in pair if n.runtime.cluster.me.node_id == before[1])
    _took, refused = _produce_until_accepted(
        leader.url, {"batches": [batch(topic, pid, 2, 1, partition=1)]}, ACCEPTED_WITHIN_S
    )
    assert refused == [], refused  # the leader still holds the name: answered at once
    ptopic = f"persistent://public/kafka/{topic}-partition-1"
    stored = [m.data().decode() for m in read_all(pulsar_reader_client, ptopic, expect=3)]
    assert stored == [f"{pid}:0:{s}" for s in range(3)]


def test_a_producer_name_left_on_a_node_that_does_not_lead_is_handed_over_at_its_next_listing(
    pair, pulsar, pulsar_reader_client
):
    """Node 2 forwarded a batch to node 1 under a view of a moment before (simulated: a
    request marked forwarded is served where it lands), so node 1 holds the producer name
    of a partition node 2 leads, with the members unchanged. Node 2 accepts the producer's
    next batch within a few listings."""
    topic = uniq("left")
    create_topic(pulsar.admin_url, topic, partitions=2)
    theirs = next(p for p, n in _leaders(pair[0], topic).items() if n == 2)
    pid = httpx.post(f"{pair[1].url}/v1/init-producer-id", json={}, timeout=30).json()
    pid = pid["producerId"]
    answer = httpx.post(
        f"{pair[0].url}/v1/produce",
        json={"batches": [batch(topic, pid, 0, 1, partition=theirs)]},
        headers={FORWARDED: "2"},
        timeout=30,
    ).json()
    assert answer["results"][0]["errorCode"] == 0, answer
    ptopic = f"persistent://public/kafka/{topic}-partition-{theirs}"
    took, refused = _produce_until_accepted(
        pair[1].url, {"batches": [batch(topic, pid, 1, 1, partition=theirs)]}, ACCEPTED_WITHIN_S
    )
    print(f"\naccepted by the leader after {took:.2f} s; answered before: {refused}")
    stored = [m.data().decode() for m in read_all(pulsar_reader_client, ptopic, expect=2)]
    assert stored == [f"{pid}:0:0", f"{pid}:0:1"]


def test_librdkafkas_idempotent_producer_goes_on_through_create_partitions_without_a_failure(
    pair, pulsar, pulsar_reader_client
):
    """librdkafka's idempotent producer, bootstrapped to both nodes, writes partition 1
    every 20 ms while an AdminClient grows the topic from 2 to 3 partitions: no delivery
    fails or waits past the bound, and partition 1 holds every record once, in order
    (the build before moved its leader, and the new one answered 6 until the producer's
    delivery.timeout.ms)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = _same_first_choice_topic()
    bootstrap = ",".join(n.kafka_bootstrap for n in pair)
    create_topic(pulsar.admin_url, topic, partitions=2)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "delivery.timeout.ms": 15_000,
        }
    )
    delivered: list[str] = []
    failed: list[str] = []
    latencies: list[float] = []

    def send(n: int) -> None:
        sent = time.monotonic()

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                latencies.append(time.monotonic() - sent)
                delivered.append(msg.value().decode())

        producer.produce(topic, str(n).encode(), partition=1, on_delivery=done)
        producer.poll(0)

    n = 0
    for _ in range(50):  # a second before the growth
        send(n := n + 1)
        time.sleep(0.02)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    grown_at = time.monotonic()
    while time.monotonic() - grown_at < 8:  # past both nodes' partition caches (5 s)
        send(n := n + 1)
        time.sleep(0.02)
    assert producer.flush(30) == 0
    assert failed == [], failed[:3]
    assert max(latencies) < ACCEPTED_WITHIN_S, max(latencies)
    ptopic = f"persistent://public/kafka/{topic}-partition-1"
    stored = [m.data().decode() for m in read_all(pulsar_reader_client, ptopic, expect=n)]
    assert stored == [str(i) for i in range(1, n + 1)]
    assert sorted(delivered, key=int) == stored
