"""``kop-dedup serve --nodes 2`` on one host: two node processes with consecutive ports
that form one cluster and serve, stopped together by one SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer

from kop_dedup_tools.sidecar import wait_ready
from kop_dedup_tools.topics import create_topic
from tests.helpers import uniq, wait_until

pytestmark = pytest.mark.integration


def consecutive_free_ports(n: int) -> int:
    """A port p with p..p+n-1 free on loopback right now."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        held = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return base
    raise AssertionError(f"no {n} consecutive free ports")


def test_serve_nodes_2_runs_a_two_node_cluster_stopped_by_one_sigterm(pulsar, tmp_path):
    http, kafka = consecutive_free_ports(2), consecutive_free_ports(2)
    env = {
        **os.environ,
        "KOP_DEDUP_PULSAR_SERVICE_URL": pulsar.service_url,
        "KOP_DEDUP_PULSAR_ADMIN_URL": pulsar.admin_url,
        "KOP_DEDUP_PORT": str(http),
        "KOP_DEDUP_KAFKA_LISTENER": f"127.0.0.1:{kafka}",
        "KOP_DEDUP_NODE_ID": "20",
        "KOP_DEDUP_SYSTEM_NAMESPACE": uniq("sys"),
        "KOP_DEDUP_SHUTDOWN_TIMEOUT_MS": "10000",
        "KOP_DEDUP_LOG_LEVEL": "WARNING",
    }
    log = (tmp_path / "serve-nodes.log").open("wb")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "kop_dedup", "serve", "--nodes", "2"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    urls = [f"http://127.0.0.1:{http + i}" for i in range(2)]
    try:
        for url in urls:
            wait_ready(url, timeout=120, proc=supervisor)
        wait_until(
            "both nodes to list both",
            lambda: all(
                [n["nodeId"] for n in httpx.get(f"{u}/v1/cluster", timeout=10).json()["nodes"]]
                == [20, 21]
                for u in urls
            ),
            timeout=60,
        )
        described = httpx.get(f"{urls[1]}/v1/cluster", timeout=10).json()
        assert described["nodeId"] == 21
        assert [n["kafka"] for n in described["nodes"]] == [
            f"127.0.0.1:{kafka}",
            f"127.0.0.1:{kafka + 1}",
        ]
        topic = uniq("nodes")
        create_topic(pulsar.admin_url, topic, partitions=4)
        leaders = httpx.get(f"{urls[0]}/v1/cluster", params={"topic": topic}, timeout=10).json()
        assert set(leaders["leaders"].values()) == {20, 21}
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{kafka}", "enable.idempotence": True})
        failed: list[str] = []
        for i in range(100):
            producer.produce(
                topic,
                str(i).encode(),
                partition=i % 4,
                on_delivery=lambda err, _m: failed.append(str(err)) if err else None,
            )
        assert producer.flush(60) == 0
        assert failed == []
        del producer  # no reconnecting to the nodes once they stop
        pgrep = ["pgrep", "-P", str(supervisor.pid)]
        found = subprocess.run(pgrep, check=False, capture_output=True, text=True)
        children = [int(p) for p in found.stdout.split()]
        assert len(children) == 2
        began = time.monotonic()
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
        stopped_s = time.monotonic() - began
        for pid in children:  # the nodes are gone too
            assert _gone(pid), pid
        print(f"\nserve --nodes 2 stopped in {stopped_s:.1f} s")
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
        log.close()


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
