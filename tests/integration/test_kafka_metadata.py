"""Metadata, ApiVersions and FindCoordinator through real Kafka clients."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

pytestmark = pytest.mark.integration


def _topic() -> str:
    return f"kw-{uuid.uuid4().hex[:10]}"


def test_librdkafka_learns_the_broker_and_an_auto_created_topic(sidecar, sidecar_kafka):
    topic = _topic()
    producer = Producer({"bootstrap.servers": sidecar_kafka})
    meta = producer.list_topics(topic, timeout=30)
    node = sidecar.runtime.cluster.me.node_id  # a one-node cluster: this node leads all
    assert list(meta.brokers) == [node]
    broker = meta.brokers[node]
    assert f"{broker.host}:{broker.port}" == sidecar_kafka
    assert meta.topics[topic].error is None
    assert sorted(meta.topics[topic].partitions) == [0]
    assert meta.topics[topic].partitions[0].leader == node


def test_a_topic_listing_shows_topics_of_the_kafka_namespace(sidecar_kafka):
    topic = _topic()
    admin = AdminClient({"bootstrap.servers": sidecar_kafka})
    Producer({"bootstrap.servers": sidecar_kafka}).list_topics(topic, timeout=30)
    assert topic in admin.list_topics(timeout=30).topics


def test_kafka_python_reads_partitions_of_a_topic(sidecar_kafka):
    from kafka import KafkaProducer

    topic = _topic()
    producer = KafkaProducer(bootstrap_servers=sidecar_kafka, request_timeout_ms=30000)
    try:
        assert producer.partitions_for(topic) == {0}
    finally:
        producer.close()


def test_an_invalid_topic_name_is_refused_with_invalid_topic(sidecar_kafka):
    producer = Producer({"bootstrap.servers": sidecar_kafka})
    meta = producer.list_topics("bad-partition-7", timeout=30)
    err = meta.topics["bad-partition-7"].error
    assert err is not None
    assert err.code() == 17


def test_kafka_requests_are_counted_in_metrics_by_api_and_error(sidecar, sidecar_kafka):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    def count(api: str, error: str) -> float:
        text = httpx.get(f"{sidecar.url}/metrics", timeout=30).text
        for family in text_string_to_metric_families(text):
            if family.name == "kop_dedup_kafka_requests":
                for sample in family.samples:
                    if sample.labels == {"api": api, "error": error}:
                        return sample.value
        return 0.0

    before = count("Metadata", "INVALID_TOPIC_EXCEPTION")
    Producer({"bootstrap.servers": sidecar_kafka}).list_topics("bad-partition-9", timeout=30)
    assert count("Metadata", "INVALID_TOPIC_EXCEPTION") >= before + 1
    assert count("ApiVersions", "NONE") >= 1
