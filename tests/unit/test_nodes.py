"""``serve --nodes N``: the settings each node of a host gets (pure)."""

from __future__ import annotations

import pytest

from kop_dedup.nodes import node_env, run_nodes
from kop_dedup.settings import Settings


def test_each_node_gets_its_ports_its_id_and_its_addresses_shifted_by_its_index():
    base = Settings(
        host="0.0.0.0",
        port=8090,
        kafka_listener="0.0.0.0:9092",
        kafka_advertised="kafka-0.example:19092",
        peer_url="http://10.0.0.7:8090/",
        node_id=10,
        pulsar_service_url="pulsar://broker:6650",
        pulsar_admin_url="http://broker:8080",
    )
    envs = [node_env(base, i) for i in range(3)]
    assert [e["KOP_DEDUP_PORT"] for e in envs] == ["8090", "8091", "8092"]
    assert [e["KOP_DEDUP_KAFKA_LISTENER"] for e in envs] == [
        "0.0.0.0:9092",
        "0.0.0.0:9093",
        "0.0.0.0:9094",
    ]
    assert [e["KOP_DEDUP_KAFKA_ADVERTISED"] for e in envs] == [
        "kafka-0.example:19092",
        "kafka-0.example:19093",
        "kafka-0.example:19094",
    ]
    assert [e["KOP_DEDUP_PEER_URL"] for e in envs] == [
        "http://10.0.0.7:8090/",
        "http://10.0.0.7:8091/",
        "http://10.0.0.7:8092/",
    ]
    assert [e["KOP_DEDUP_NODE_ID"] for e in envs] == ["10", "11", "12"]
    assert {e["KOP_DEDUP_PULSAR_SERVICE_URL"] for e in envs} == {"pulsar://broker:6650"}


def test_what_is_not_set_stays_derived_per_node():
    """No node id, advertised address or peer URL: each node derives its own from its
    shifted addresses; a free Kafka port (0) stays free; IPv6 keeps its brackets."""
    envs = [node_env(Settings(port=8090, kafka_listener="[::1]:0"), i) for i in range(2)]
    for env in envs:
        assert "KOP_DEDUP_NODE_ID" not in env
        assert "KOP_DEDUP_KAFKA_ADVERTISED" not in env
        assert "KOP_DEDUP_PEER_URL" not in env
        assert env["KOP_DEDUP_KAFKA_LISTENER"] == "[::1]:0"
    off = node_env(Settings(kafka_listener=""), 1)
    assert "KOP_DEDUP_KAFKA_LISTENER" not in off


def test_several_nodes_need_a_base_http_port():
    with pytest.raises(ValueError, match="base HTTP port"):
        run_nodes(2, Settings(port=0), graceful_seconds=1, environ={})
