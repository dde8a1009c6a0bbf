"""The tools against the real broker: topic creation, the load and bench commands."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from kop_dedup_tools.bench.table import format_ratio
from kop_dedup_tools.topics import create_topic
from tests.helpers import uniq

pytestmark = pytest.mark.integration


def test_create_topic_makes_the_partitions_and_a_second_call_is_fine(pulsar, data_namespace):
    topic = uniq("tools")
    create_topic(pulsar.admin_url, topic, partitions=3)
    create_topic(pulsar.admin_url, topic, partitions=3)  # 409: already there
    r = httpx.get(
        f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions", timeout=30
    )
    assert r.json()["partitions"] == 3


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kop_dedup", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_load_command_delivers_and_verifies_every_record(pulsar, sidecar):
    topic = uniq("load")
    proc = run_cli(
        *("load", "--url", sidecar.url, "--topic", topic, "--partitions", "2"),
        *("--producers", "2", "--batches", "4", "--records", "3", "--verify", "--json"),
        *("--admin-url", pulsar.admin_url, "--service-url", pulsar.service_url),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["load"]["delivered_records"] == 2 * 2 * 4 * 3
    assert report["verify"]["read"] == 2 * 2 * 4 * 3
    assert report["verify"]["ok"], report["verify"]
    r = httpx.get(
        f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions", timeout=30
    )
    assert r.json()["partitions"] == 2  # created up front through --admin-url


def test_bench_smoke_writes_results_that_agree_and_keeps_the_sidecar_log(pulsar, tmp_path):
    """One tiny cell per mode: the command works end to end (never a timing assertion)."""
    proc = run_cli(
        *("bench", "--batch-sizes", "10", "--producers", "1", "--reps", "1"),
        *("--seconds", "0.5", "--out", str(tmp_path)),
        *("--service-url", pulsar.service_url, "--admin-url", pulsar.admin_url),
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "bench.json").read_text())
    assert results["broker"]["started"] is False  # the session's broker answered
    [row] = results["summary"]  # no half-load pair: the matrix has no 100-record cell
    assert row["workload"] == {"kind": "produce", "clients": 1, "size": 10, "rate": None}
    direct, sidecar = row["cells"]["direct"], row["cells"]["sidecar"]
    assert direct["records"] > 0
    assert sidecar["records"] > 0
    assert sidecar["cpu_us_per_record"] > 0  # the sidecar's CPU, sampled over the cell
    assert direct["sidecar_cpu_s"] is None
    printed = next(
        line for line in proc.stdout.splitlines() if line.startswith("| produce, batch 10,")
    )
    assert printed.endswith(f"| {format_ratio(row['ratio'])} |")
    assert (tmp_path / "bench.png").stat().st_size > 0
    [log] = tmp_path.glob("sidecar-*.log")
    assert "kop-dedup listening" in log.read_text()


def test_bench_transactions_smoke_commits_reads_back_and_compares(pulsar, tmp_path):
    """One short cell per mode: rounds commit, every committed record is read back from
    the data topic, and the summary compares the two (never a timing assertion)."""
    proc = run_cli(
        *("bench", "--transactions", "--producers", "1", "--reps", "1"),
        *("--seconds", "0.5", "--out", str(tmp_path)),
        *("--service-url", pulsar.service_url, "--admin-url", pulsar.admin_url),
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "transactions.json").read_text())
    [row] = results["summary"]
    txn, idem = row["cells"]["transactions"], row["cells"]["idempotent"]
    assert txn["extra"]["rounds"] >= 1
    assert idem["extra"]["rounds"] >= 1
    assert txn["records"] == txn["extra"]["rounds"] * 10 * 100
    assert txn["extra"]["unread_rounds"] == 0  # every committed round was read back
    assert idem["extra"]["unread_rounds"] == 0
    assert txn["extra"]["end_p50_ms"] is not None
    assert row["ratio"] == round(
        txn["records"] / txn["seconds"] / (idem["records"] / idem["seconds"]), 3
    )
    printed = next(line for line in proc.stdout.splitlines() if line.startswith("| txn rounds"))
    assert printed.endswith(f"| {format_ratio(row['ratio'])} |")


def test_bench_with_two_sidecars_spreads_the_producers_and_says_so(pulsar, tmp_path):
    proc = run_cli(
        *("bench", "--sidecars", "2", "--batch-sizes", "10", "--producers", "2"),
        *("--reps", "1", "--seconds", "0.5", "--out", str(tmp_path)),
        *("--service-url", pulsar.service_url, "--admin-url", pulsar.admin_url),
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "bench.json").read_text())
    assert results["setup"]["sidecars"] == 2
    assert results["summary"][0]["cells"]["sidecar"]["records"] > 0
    assert "2 sidecar processes" in proc.stdout
    logs = list(tmp_path.glob("sidecar-*.log"))
    assert len(logs) == 2
    assert all("kop-dedup listening" in log.read_text() for log in logs)


def test_bench_kafka_groups_smoke_drains_commits_and_copies_through_the_listener(pulsar, tmp_path):
    """A tiny topic read by a group of 2 through the listener and by direct consumers,
    then one copier's transactions: the command works end to end, every offset came once
    and the committed offsets agree (never a timing assertion; no real Kafka: its start
    alone would take longer than this whole test)."""
    proc = run_cli(
        *("bench", "--kafka", "--groups", "--members", "2", "--copiers", "1"),
        *("--reps", "1", "--prefill", "800", "--seconds", "1", "--out", str(tmp_path)),
        *("--service-url", pulsar.service_url, "--admin-url", pulsar.admin_url),
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "kafka-groups.json").read_text())
    assert results["setup"]["records"] == 800
    row, copied = results["summary"]
    direct, listener = row["cells"]["direct"], row["cells"]["listener"]
    assert row["workload"]["clients"] == 2
    assert "kafka" not in row["cells"]
    assert direct["records"] == listener["records"] == 800
    assert listener["extra"]["drained"]
    assert listener["extra"]["gaps"] == 0
    assert listener["extra"]["committed_ok"]  # the offsets read back are each partition's end
    printed = next(
        line for line in proc.stdout.splitlines() if line.startswith("| group consume, 2 members |")
    )
    assert f"| {format_ratio(row['ratio'])} | >= 0.5 " in printed
    assert printed.endswith(("met |", "MISSED |"))
    assert copied["workload"]["kind"] == "ctp"
    assert copied["cells"]["listener"]["extra"]["transactions"] >= 1
    assert copied["cells"]["listener"]["extra"]["committed_ok"]  # offsets committed with them
    assert (tmp_path / "kafka-groups.png").stat().st_size > 0


def test_bench_kafka_nodes_measures_a_cluster_of_each_size_whose_second_node_leads(
    pulsar, tmp_path
):
    """``--nodes 1 2``: the produce cells also run through a cluster of one and of two
    sidecars of their own (one partition per node), beside the listener's own cells; the
    two-node cells' clients reached both nodes (each led a partition)."""
    proc = run_cli(
        *("bench", "--kafka", "--kafka-measures", "produce", "--nodes", "1", "2"),
        *("--kafka-producers", "2", "--reps", "1", "--seconds", "0.5", "--out", str(tmp_path)),
        *("--service-url", pulsar.service_url, "--admin-url", pulsar.admin_url),
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "kafka.json").read_text())
    assert results["setup"]["nodes"] == [1, 2]
    [row] = [r for r in results["summary"] if r["workload"]["kind"] == "produce"]
    for side in ("listener", "1 node", "2 nodes"):
        assert row["cells"][side]["records"] > 0, (side, row["cells"])
    logs = [log.read_text() for log in tmp_path.glob("sidecar-*.log")]
    assert len(logs) == 3  # the listener's sidecar, then the cluster of one, grown to two
    assert sum("in a cluster of 2;" in log for log in logs) == 1  # the second joined the first
