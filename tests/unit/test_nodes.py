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


_FAKE_NODE = """
import os, signal, sys, time
told = []
signal.signal(signal.SIGTERM, lambda *_: told.append(1))
if os.environ["KOP_DEDUP_PORT"] == os.environ["FAIL_PORT"]:
    sys.exit(3)  # a node that fails at its start
while not told:
    time.sleep(0.01)
time.sleep(1.0)  # a graceful stop that takes a second
sys.exit(len(told) - 1)  # 0: told to stop once
"""


def _run_fake_nodes(fail_port: str, stop_after_s: float | None) -> tuple[int, float]:
    import os
    import signal
    import sys
    import threading
    import time

    running = threading.Event()

    def stop() -> None:  # the operator's one SIGTERM to the supervisor (never to pytest)
        if running.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(stop_after_s or 0.0, stop)
    running.set()
    if stop_after_s is not None:
        timer.start()
    began = time.monotonic()
    try:
        status = run_nodes(
            2,
            Settings(port=18800, shutdown_timeout_ms=4000),
            graceful_seconds=1,
            environ={**os.environ, "FAIL_PORT": fail_port},
            command=[sys.executable, "-c", _FAKE_NODE],
        )
    finally:
        running.clear()
        timer.cancel()
    return status, time.monotonic() - began


def test_one_stop_reaches_each_node_once_and_a_clean_stop_exits_0():
    """The supervisor passed the stop on in its handler and again once its loop saw it: a
    node that had finished its graceful stop (its handlers back to the default) died of
    the second SIGTERM, and the supervisor exited 1 (a CI failure of
    test_serve_nodes_2_runs_a_two_node_cluster_stopped_by_one_sigterm)."""
    status, _ = _run_fake_nodes("none", stop_after_s=1.0)
    assert status == 0


def test_a_node_that_fails_at_its_start_stops_the_others_at_once():
    """It stopped nobody: the others ran out the whole stop budget and were killed."""
    status, took = _run_fake_nodes("18801", stop_after_s=None)
    assert status == 3
    assert took < 4.0  # one graceful second, not the budget (4 s + the margin)
