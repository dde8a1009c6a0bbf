"""The audit reports consumer groups' offsets against the data it read: a real sidecar
and broker (entry index on), consumers pulling and committing over HTTP, Spark."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any

import httpx
import pytest

from kop_dedup_tools.topics import create_topic
from tests.helpers import batch, delete_namespace, new_pid, uniq
from tests.sidecar import ThreadSidecar

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    # PySpark 3.5's DataFrame.collect() leaves its row socket to the garbage collector
    # (see test_audit.py): only that leak is let through
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

SESSION_MS = 300_000  # no member misses its session while the audit runs


@pytest.fixture(scope="module")
def group_sidecar(pulsar):
    """A sidecar whose consumer-groups log is its own (a system namespace of its own):
    other sidecars sharing the broker cannot take its partitions over mid-test."""
    namespace = uniq("kop-dedup-audit-groups")
    with ThreadSidecar(pulsar, system_namespace=namespace) as sc:
        yield sc
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


def call(api: httpx.Client, path: str, **body: Any) -> dict[str, Any]:
    r = api.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def produce(api: httpx.Client, topic: str, partition: int, sizes: list[int]) -> None:
    """One batch (one Pulsar entry) per size."""
    pid, base = new_pid(api), 0
    batches = []
    for n in sizes:
        batches.append(batch(topic, pid, base, n, partition=partition))
        base += n
    r = api.post("/v1/produce", json={"batches": batches}).json()
    assert [b["errorCode"] for b in r["results"]] == [0] * len(batches), r


class Consumer:
    """A member that counts what it was delivered and what it committed, per partition,
    from the answers alone."""

    def __init__(self, api: httpx.Client, group: str, topic: str) -> None:
        self.api, self.group = api, group
        self.id = call(api, f"/v1/groups/{group}/members", topics=[topic])["memberId"]
        self.delivered: Counter[int] = Counter()
        self.committed: Counter[int] = Counter()

    def assignment(self) -> list[int]:
        answer = call(self.api, f"/v1/groups/{self.group}/members/{self.id}/heartbeat")
        return [p for a in answer["assignment"] for p in a["partitions"]]

    def pull(self, n: int) -> None:
        """Exactly ``n`` more records."""
        want = sum(self.delivered.values()) + n
        for _ in range(50):
            left = want - sum(self.delivered.values())
            if left == 0:
                return
            answer = call(
                self.api,
                f"/v1/groups/{self.group}/members/{self.id}/pull",
                maxRecords=left,
                waitMs=2000,
            )
            for record in answer["records"]:
                self.delivered[record["partition"]] += 1
        raise AssertionError(f"{self.id}: {n} records never came")

    def commit(self) -> None:
        call(self.api, f"/v1/groups/{self.group}/members/{self.id}/commit")
        self.committed = Counter(self.delivered)


@pytest.fixture(scope="module")
def audited(spark, pulsar, group_sidecar):
    """Two topics, a clustering group of two members (one partition each) and a
    broadcast group of two members, consuming part of them; more records written after
    the groups' offsets are read and before the data is; one audit of it all."""
    from kop_dedup.spark import audit as audit_module

    orders, events = uniq("grp-orders"), uniq("grp-events")
    create_topic(pulsar.admin_url, orders, partitions=2)
    create_topic(pulsar.admin_url, events, partitions=1)
    clustering, broadcast = uniq("payments"), uniq("watchers")
    with httpx.Client(base_url=group_sidecar.url, timeout=60) as api:
        produce(api, orders, 0, [4] * 5)  # 20 records in entries of 4
        produce(api, orders, 1, [3] * 3)  # 9 in entries of 3
        produce(api, events, 0, [5, 5])
        for group, mode in ((clustering, "clustering"), (broadcast, "broadcast")):
            r = api.put(
                f"/v1/groups/{group}",
                json={"mode": mode, "autoOffsetReset": "earliest", "sessionTimeoutMs": SESSION_MS},
            )
            assert r.status_code == 200, r.text

        first, second = Consumer(api, clustering, orders), Consumer(api, clustering, orders)
        by_partition = {p: c for c in (first, second) for p in c.assignment()}
        assert sorted(by_partition) == [0, 1]
        big, small = by_partition[0], by_partition[1]
        assert big is not small
        big.pull(8)
        big.commit()
        big.pull(5)  # inflight
        small.pull(4)
        small.commit()

        x, y = Consumer(api, broadcast, events), Consumer(api, broadcast, events)
        x.pull(6)
        y.pull(2)  # before x commits: y starts at the earliest, not at x's offset
        y.commit()
        x.commit()
        x.pull(3)

        later = {clustering: (orders, 1, [5]), broadcast: (events, 0, [1])}
        real_read_group = audit_module.read_group
        snapshots = {}

        def read_then_produce(url, group, topics, **kwargs):
            """The group's offsets, then records the data read will hold past their end."""
            started = time.monotonic()
            snapshot = real_read_group(url, group, topics, **kwargs)
            print(f"offsets of {group} read in {time.monotonic() - started:.2f}s")
            snapshots[group] = snapshot
            produce(api, *later[group])
            return snapshot

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(audit_module, "read_group", read_then_produce)
            started = time.monotonic()
            report = audit_module.audit(
                spark,
                [orders, events],
                service_url=pulsar.service_url,
                admin_url=pulsar.admin_url,
                progress=False,
                groups=[clustering, broadcast],
                group_url=group_sidecar.url,
            )
    print(f"audit with 2 groups: {time.monotonic() - started:.1f}s")
    print(report.render())
    rows = {
        (r["group"], r["topic"], r["partition"], r["member"], r["minimum"]): r
        for r in report.group_partitions
    }
    return {
        "report": report,
        "rows": rows,
        "snapshots": snapshots,
        "orders": orders,
        "events": events,
        "clustering": clustering,
        "broadcast": broadcast,
        "x": x.id,
        "y": y.id,
    }


COUNTS = ("committed", "pulled", "end", "consumed", "inflight", "ready", "lag", "later")


def counts(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in COUNTS)


def test_a_clustering_groups_committed_inflight_and_ready_records_are_counted_in_the_data(
    audited,
):
    report, rows = audited["report"], audited["rows"]
    group, orders = audited["clustering"], audited["orders"]
    assert report.ok
    assert report.group_mismatches == 0
    assert report.records == 20 + 9 + 5 + 10 + 1  # the later records are read too
    # partition 0: 8 pulled and committed, 5 more pulled, 7 never handed out
    assert counts(rows[group, orders, 0, None, False]) == (8, 13, 20, 8, 5, 7, 12, 0)
    # partition 1: 4 pulled and committed; 5 written after the offsets were read
    assert counts(rows[group, orders, 1, None, False]) == (4, 4, 9, 4, 0, 5, 5, 5)
    [meta] = [g for g in report.groups if g["group"] == group]
    assert (meta["mode"], meta["not_audited"]) == ("clustering", [])
    assert meta["source"].endswith(f"/v1/groups/{group}/lag")
    assert rows[group, orders, 0, None, False]["oldestInflightMs"] is not None


def test_a_broadcast_group_is_counted_per_member_and_at_the_groups_minimum(audited):
    report, rows = audited["report"], audited["rows"]
    group, events = audited["broadcast"], audited["events"]
    x, y = audited["x"], audited["y"]
    assert counts(rows[group, events, 0, x, False]) == (6, 9, 10, 6, 3, 1, 4, 1)
    assert counts(rows[group, events, 0, y, False]) == (2, 2, 10, 2, 0, 8, 8, 1)
    minimum = rows[group, events, 0, None, True]
    assert (minimum["committed"], minimum["consumed"], minimum["lag"]) == (2, 2, 8)
    assert (minimum["inflight"], minimum["ready"]) == (None, None)
    text = report.render()
    assert f"group {group} (broadcast" in text
    assert f"{events}-0 (group minimum)" in text
    assert "group mismatches    0" in text


def test_records_that_disagree_with_the_offsets_are_a_mismatch(spark, pulsar, audited):
    """The data is placed by position, not by arithmetic on offsets: a committed offset
    whose position says otherwise (as if the index and the data disagreed) is caught."""
    from kop_dedup.spark.audit import kafka_records, read_topics
    from kop_dedup.spark.groups import check_groups

    group, orders = audited["clustering"], audited["orders"]
    snapshot = audited["snapshots"][group]
    [p0] = [p for p in snapshot.partitions if p.partition == 0]
    # committed 8, but placed where offset 13 is: 5 records too many "consumed", 5 too
    # few inflight
    wrong = replace(p0, at={**p0.at, "committed": p0.at["pulled"]})
    records = kafka_records(
        read_topics(spark, [orders], service_url=pulsar.service_url, admin_url=pulsar.admin_url)
    )
    rows, mismatches = check_groups(records, [replace(snapshot, partitions=[wrong])])
    assert [(r["consumed"], r["inflight"]) for r in rows] == [(13, 0)]
    assert {(m["range"], m["offsets"], m["records"]) for m in mismatches} == {
        ("consumed", 8, 13),
        ("inflight", 5, 0),
        ("lag", 12, 7),
    }


def test_an_unknown_group_is_a_readable_error_before_any_spark_work(pulsar, group_sidecar):
    from kop_dedup.spark.groups import GroupReportError, read_group

    with pytest.raises(GroupReportError, match="404"):
        read_group(group_sidecar.url, uniq("nobody"), ["orders"], admin_url=pulsar.admin_url)
