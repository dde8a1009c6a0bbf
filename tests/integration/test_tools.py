"""The tools against the real broker: topic creation, the load and bench commands."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

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
    [row] = results["summary"]
    assert (row["batch_size"], row["producers"]) == (10, 1)
    assert row["direct"]["records"] > 0
    assert row["sidecar"]["records"] > 0
    printed = next(line for line in proc.stdout.splitlines() if line.split()[:2] == ["10", "1"])
    assert printed.split()[-1] == f"{row['ratio']:.2f}"
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
    txn, idem = row["transactions"], row["idempotent"]
    assert txn["rounds"] >= 1
    assert idem["rounds"] >= 1
    assert txn["records"] == txn["rounds"] * 10 * 100
    assert txn["unread_rounds"] == 0  # every committed round was read from the data topic
    assert idem["unread_rounds"] == 0
    assert txn["end_p50_ms"] is not None
    assert row["ratio"] == round(txn["records_per_s"] / idem["records_per_s"], 2)
    printed = next(line for line in proc.stdout.splitlines() if line.split("|")[0].strip() == "1")
    assert printed.split()[-1] == f"{row['ratio']:.2f}"


def test_bench_with_two_sidecars_spreads_the_producers_and_says_so(pulsar, tmp_path):
    proc = run_cli(
        *("bench", "--sidecars", "2", "--batch-sizes", "10", "--producers", "2"),
        *("--reps", "1", "--seconds", "0.5", "--out", str(tmp_path)),
        *("--service-url", pulsar.service_url, "--admin-url", pulsar.admin_url),
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "bench.json").read_text())
    assert results["sidecars"] == 2
    assert results["summary"][0]["sidecar"]["records"] > 0
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
    [row] = results["summary"]["consume"]
    direct, listener = row["direct"], row["listener"]
    assert (row["members"], row["kafka"]) == (2, None)
    assert direct["records"] == listener["records"] == 800
    assert listener["drained"]
    assert listener["gaps"] == 0
    assert listener["committed_ok"]  # the group's offsets read back are each partition's end
    printed = next(line for line in proc.stdout.splitlines() if line.split("|")[0].strip() == "2")
    assert f"{row['ratio']:.2f}" in printed
    assert printed.endswith(("met", "MISSED"))
    [copied] = results["summary"]["ctp"]
    assert copied["listener"]["transactions"] >= 1
    assert copied["listener"]["committed_ok"]  # offsets committed with the transactions
    assert (tmp_path / "kafka-groups.png").stat().st_size > 0
