"""Stats and metrics as a scraper and an operator see them: real socket, real broker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kop_dedup.observability.stats import INVALID_TOPIC, OTHER_TOPICS, OUTCOMES
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from tests.helpers import batch, new_pid, uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

HOSTILE = 'bad"} 1\nfake_metric{x="'
OUR_FAMILIES = {
    "kop_dedup_batches",
    "kop_dedup_records",
    "kop_dedup_dedup_state_lost",
    "kop_dedup_batch_latency_seconds",
    "kop_dedup_open_producers",
    "kop_dedup_channels",
    "kop_dedup_held_producers",
    "kop_dedup_waiting_batches",
    "kop_dedup_inflight_request_bytes",
    "kop_dedup_requests_waiting_for_memory",
    "kop_dedup_open_transactions_owned",
    "kop_dedup_txn_completed",
    "kop_dedup_txn_timeouts",
    "kop_dedup_txn_fenced",
    "kop_dedup_txn_check_backs",
    "kop_dedup_txn_copy_state_lost",
    "kop_dedup_txn_copy_partitions_dropped",
    "kop_dedup_txn_copy_unresolved",
    "kop_dedup_txn_apply_retries",
    "kop_dedup_group_pulls_in_flight",
    "kop_dedup_group_end_offset",
    "kop_dedup_group_committed_offset",
    "kop_dedup_group_ready_records",
    "kop_dedup_group_inflight_records",
    "kop_dedup_group_lag_records",
    "kop_dedup_group_oldest_inflight_seconds",
    "kop_dedup_group_rows_not_shown",
    "kop_dedup_kafka_requests",
    "kop_dedup_kafka_connections_closed",
    "kop_dedup_kafka_connections_opened",
    "kop_dedup_kafka_connections",
    "kop_dedup_cluster_nodes",
    "kop_dedup_cluster_ownership_moves",
    "kop_dedup_cluster_forwarded",
    "kop_dedup_cluster_refused",
    "kop_dedup_http_request_bytes_in_flight",
    "kop_dedup_http_requests_refused_busy",
    "kop_dedup_kafka_queued_request_bytes",
    "kop_dedup_kafka_requests_waiting_for_room",
}


def produce(api: httpx.Client, batches: list[dict[str, Any]]) -> list[int]:
    r = api.post("/v1/produce", json={"batches": batches, "timeoutMs": 60_000})
    assert r.status_code == 200, r.text
    return [res["errorCode"] for res in r.json()["results"]]


def scrape(api: httpx.Client) -> dict[str, Any]:
    r = api.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def create_topic(pulsar: Any, topic: str) -> None:
    r = httpx.put(
        f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions",
        json=1,
        timeout=30,
    )
    assert r.status_code in {204, 409}, r.text


def test_hostile_and_hundreds_of_topic_names_leave_metrics_parseable_and_bounded(
    pulsar, data_namespace
):
    """Issue 10 item 5: a topic name is validated before it becomes a label, label values
    are escaped, and distinct names beyond KOP_DEDUP_STATS_MAX_TOPICS share one label.
    Auto-creation is off so the hundreds of names cost the broker a lookup, not a topic."""
    cap, many = 20, 600  # thirty times the cap; each name costs the broker a lookup
    real = [uniq("real") for _ in range(3)]
    for topic in real:
        create_topic(pulsar, topic)
    with (
        ThreadSidecar(pulsar, auto_create_topics=False, stats_max_topics=cap) as sc,
        httpx.Client(base_url=sc.url, timeout=120) as api,
    ):
        pid = new_pid(api)
        assert produce(api, [batch(HOSTILE, pid, 0, 1)]) == [17]
        assert produce(api, [batch(t, pid, 0, 2) for t in real]) == [0, 0, 0]
        names = [uniq("many") for _ in range(many)]
        for i in range(0, many, 1000):
            chunk = names[i : i + 1000]
            assert set(produce(api, [batch(t, pid, 0, 1) for t in chunk])) == {3}
        families = scrape(api)

        assert set(families) == OUR_FAMILIES
        batches = families["kop_dedup_batches"].samples
        labels = {s.labels["topic"] for s in batches}
        assert set(real) <= labels
        assert {INVALID_TOPIC, OTHER_TOPICS} <= labels
        assert len(labels) == cap + 2
        assert len(batches) == (cap + 2) * len(OUTCOMES)
        count = {(s.labels["topic"], s.labels["outcome"]): s.value for s in batches}
        assert count[INVALID_TOPIC, "invalid"] == 1
        assert sum(count[t, "accepted"] for t in real) == 3
        # every batch is counted once, by name or under ~other
        assert sum(v for (_, o), v in count.items() if o == "invalid") == 1 + many

        totals = api.get("/v1/stats").json()
        assert (totals["topics"], totals["maxTopics"]) == (cap, cap)
        other = api.get(f"/v1/stats/topics/{OTHER_TOPICS}").json()
        assert other["sidecar"]["batches"]["invalid"] == many - (cap - len(real))
        hostile = api.get("/v1/stats/topics/bad%22%7D%201%0Afake_metric%7Bx%3D%22")
        assert hostile.status_code == 404
        assert "not a valid Kafka topic name" in hostile.json()["error"]


def test_producer_counters_are_bounded_and_evictions_reported(pulsar):
    """Issue 10 item 6: per-producer counters keep the most recently used ids."""
    topic = uniq("lru")
    with (
        ThreadSidecar(pulsar, stats_max_producers=2) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pids = [new_pid(api) for _ in range(3)]
        for pid in pids:
            assert produce(api, [batch(topic, pid, 0, 1)]) == [0]
        totals = api.get("/v1/stats").json()
        assert (totals["producers"], totals["maxProducers"], totals["producersEvicted"]) == (
            2,
            2,
            1,
        )
        for pid in pids[1:]:
            kept = api.get(f"/v1/stats/producers/{pid}").json()
            assert kept["sidecar"]["batches"]["accepted"] == 1
        # its counters are gone (404 unless the epoch registry has a record of it)
        evicted = api.get(f"/v1/stats/producers/{pids[0]}")
        assert evicted.status_code == 404 or evicted.json()["sidecar"] is None, evicted.text


def poll(fetch: Any, until: Any, timeout: float = 30.0) -> Any:
    """fetch() until until(value) holds or the deadline passes; the last value."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not until(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = fetch()
    return value


def test_topic_stats_report_effective_dedup_and_where_it_comes_from(pulsar):
    """Issue 10 item 11: a namespace with dedup on and no topic policy reads
    enabled/namespace (it read null); a topic-level override off reads false/topic."""
    topic = uniq("dedupsrc")
    policy = f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/deduplicationEnabled"
    with (
        ThreadSidecar(pulsar, dedup_policy_ttl_seconds=0.2) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pid = new_pid(api)
        assert produce(api, [batch(topic, pid, 0, 1)]) == [0]
        broker = api.get(f"/v1/stats/topics/{topic}").json()["broker"]
        assert (broker["deduplicationEnabled"], broker["deduplicationSource"]) == (
            True,
            "namespace",
        )
        r = httpx.post(policy, json=False, timeout=30)
        assert r.status_code == 204, r.text
        try:
            broker = poll(
                lambda: api.get(f"/v1/stats/topics/{topic}").json()["broker"],
                lambda b: b.get("deduplicationSource") == "topic",
            )
            assert (broker["deduplicationEnabled"], broker["deduplicationSource"]) == (
                False,
                "topic",
            )
        finally:
            httpx.delete(policy, timeout=30)


def test_a_namespace_without_policy_reads_the_broker_default(pulsar):
    """The third level, straight from the admin client: a namespace with no dedup policy
    has what brokerDeduplicationEnabled says (true on the test broker)."""
    namespace = uniq("nopolicy")
    r = httpx.put(f"{pulsar.admin_url}/admin/v2/namespaces/public/{namespace}", timeout=30)
    assert r.status_code == 204, r.text
    broker_conf = httpx.get(
        f"{pulsar.admin_url}/admin/v2/brokers/configuration/runtime", timeout=30
    ).json()
    expected = broker_conf["brokerDeduplicationEnabled"] == "true"

    async def main() -> tuple[bool, str]:
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", namespace, "kop"))
        try:
            await admin.create_topic("t", 1)
            return await admin.effective_deduplication("t")
        finally:
            await admin.close()

    try:
        assert asyncio.run(main()) == (expected, "broker")
    finally:
        httpx.delete(
            f"{pulsar.admin_url}/admin/v2/persistent/public/{namespace}/t/partitions",
            params={"force": "true"},
            timeout=30,
        )
        httpx.delete(f"{pulsar.admin_url}/admin/v2/namespaces/public/{namespace}", timeout=30)


def test_a_producer_that_only_used_epoch_0_reports_highest_epoch_0(api):
    """Issue 10 item 11: highestEpoch read null for a producer at epoch 0."""
    topic, pid = uniq("epoch0"), new_pid(api)
    assert produce(api, [batch(topic, pid, 0, 2)]) == [0]
    assert produce(api, [batch(topic, pid, 0, 2)]) == [46]
    p = api.get(f"/v1/stats/producers/{pid}").json()
    assert p["highestEpoch"] == 0
    assert p["highestEpochSource"] in {"registry", "batches"}
    assert p["sidecar"]["batches"]["accepted"] == 1
