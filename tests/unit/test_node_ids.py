"""The node id a node without KOP_DEDUP_NODE_ID derives from its addresses (pure)."""

from __future__ import annotations

from kop_dedup.cluster.members import default_node_id
from kop_dedup.settings import Settings


def test_per_pod_sidecars_on_the_same_loopback_listener_get_different_ids():
    """Sidecar mode: every pod's Kafka listener advertises 127.0.0.1:9092; the peer URL
    (the pod's IP) tells them apart. From the Kafka address alone they all had one id,
    and every pod after the first was refused at start (NodeIdInUse)."""
    pods = [f"http://10.1.{i // 250}.{i % 250 + 1}:8090" for i in range(600)]
    ids = {default_node_id("127.0.0.1", 9092, url) for url in pods}
    assert len(ids) == len(pods)
    assert all(0 <= i <= 2**31 - 2 for i in ids)  # a valid KOP_DEDUP_NODE_ID / Kafka id


def test_the_derived_id_is_stable_while_the_addresses_are():
    settings = Settings(host="0.0.0.0", port=8090, kafka_advertised="kop-0.kop:9092")
    peer = settings.peer("kop-0.kop")
    assert default_node_id("kop-0.kop", 9092, peer) == default_node_id("kop-0.kop", 9092, peer)
    assert default_node_id("kop-0.kop", 9092, peer) != default_node_id("kop-1.kop", 9092, peer)
