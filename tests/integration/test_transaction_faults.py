"""Transactions through crashes: a decision is applied exactly once whoever applies it.

The coordinator is a sidecar process that delays applying a decision
(``txn_apply_delay_ms``), so a test can kill or pause it between the durable
decision and the copy; another sidecar of its cluster (or the restarted one) must
finish it. Each test has its own cluster (system namespace); the coordinator's node id
is chosen so that placement names it the owner of the transactional id's partition.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from kop_dedup.cluster.placement import TRANSACTION_LOG
from kop_dedup.coordination.partitions import partition_of
from tests.helpers import batch, newcomer_owning, read_all, uniq, wait_until
from tests.sidecar import ProcessSidecar, ThreadSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]

NS = "persistent://public/kafka"
FAST = {"txn_sweep_interval_ms": 100}
LOUD = {**FAST, "log_level": "INFO"}  # a process sidecar's log says what it did


def call(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def init(url: str, tid: str) -> tuple[int, int]:
    body = call(url, "/v1/init-producer-id", {"transactionalId": tid})
    assert body["errorCode"] == 0, body
    return body["producerId"], body["producerEpoch"]


def end(url: str, tid: str, pid: int, epoch: int, commit: bool = True) -> dict[str, Any]:
    return call(
        url,
        "/v1/end-txn",
        {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": commit},
    )


def described(url: str, tid: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/transactions/{tid}", timeout=30).json()


def journal_a_transaction(url: str, tid: str, topics: list[str]) -> tuple[int, int]:
    pid, epoch = init(url, tid)
    batches = [batch(t, pid, 0, 5, epoch=epoch) for t in topics]
    answers = call(url, "/v1/produce", {"transactionalId": tid, "batches": batches})["results"]
    assert [a["errorCode"] for a in answers] == [0] * len(topics), answers
    return pid, epoch


def visible_once(client: Any, topics: list[str], pid: int, epoch: int) -> None:
    for t in topics:
        values = [m.data().decode() for m in read_all(client, f"{NS}/{t}-partition-0")]
        assert values == [f"{pid}:{epoch}:{i}" for i in range(5)], (t, values)


def coordinator_beside(
    pulsar: Any, tmp_path: Any, other: ThreadSidecar, tid: str, **settings: Any
) -> ProcessSidecar:
    """A sidecar process joining ``other``'s cluster as the coordinator of ``tid``."""
    count = other.settings.txn_log_partitions
    node = newcomer_owning(
        other.runtime.cluster.me.node_id, TRANSACTION_LOG, count, partition_of(tid, count)
    )
    sc = ProcessSidecar(
        pulsar,
        tmp_path,
        node_id=node,
        system_namespace=other.settings.system_namespace,
        **settings,
    ).start()
    wait_until(
        "the new sidecar to coordinate the transactional id",
        lambda: (
            other.runtime.cluster.txn_coordinator(tid) is not None
            and other.runtime.cluster.txn_coordinator(tid).node_id == node
        ),  # type: ignore[union-attr]
        timeout=60,
    )
    return sc


def test_a_coordinator_killed_after_the_decision_has_its_commit_finished_by_another(
    pulsar, tmp_path, pulsar_reader_client
):
    tid, topics = uniq("tx"), [uniq("a"), uniq("b")]
    with ThreadSidecar(pulsar, system_namespace=uniq("sys"), **FAST) as other:
        coordinator = coordinator_beside(
            pulsar, tmp_path, other, tid, txn_apply_delay_ms=60_000, **LOUD
        )
        try:
            pid, epoch = journal_a_transaction(coordinator.url, tid, topics)
            assert end(coordinator.url, tid, pid, epoch)["errorCode"] == 0  # decided, durable
            assert described(other.url, tid)["state"] == "PrepareCommit"
            coordinator.kill()  # before it copied anything (its apply waits a minute)
            wait_until(
                "another sidecar to finish the commit",
                lambda: described(other.url, tid)["state"] == "CompleteCommit",
                timeout=60,
            )
        finally:
            coordinator.stop()
        visible_once(pulsar_reader_client, topics, pid, epoch)


def test_a_restarted_coordinator_finishes_its_own_decision(pulsar, tmp_path, pulsar_reader_client):
    tid, topics = uniq("tx"), [uniq("a")]
    coordinator = ProcessSidecar(
        pulsar, tmp_path, system_namespace=uniq("sys"), txn_apply_delay_ms=60_000, **LOUD
    ).start()
    try:
        pid, epoch = journal_a_transaction(coordinator.url, tid, topics)
        assert end(coordinator.url, tid, pid, epoch)["errorCode"] == 0
        coordinator.kill()
        coordinator.env["KOP_DEDUP_TXN_APPLY_DELAY_MS"] = "0"
        coordinator.start()
        wait_until(
            "the restarted sidecar to finish the commit",
            lambda: described(coordinator.url, tid)["state"] == "CompleteCommit",
            timeout=60,
        )
    finally:
        coordinator.stop()
    visible_once(pulsar_reader_client, topics, pid, epoch)


def test_a_broker_killed_mid_commit_leaves_the_commit_whole_once_it_is_back(
    pulsar_control, tmp_path, pulsar_reader_client
):
    tid, topics = uniq("tx"), [uniq("a"), uniq("b")]
    with ProcessSidecar(pulsar_control, tmp_path, txn_apply_delay_ms=1_500, **LOUD) as sc:
        pid, epoch = journal_a_transaction(sc.url, tid, topics)
        assert end(sc.url, tid, pid, epoch)["errorCode"] == 0
        pulsar_control.kill()
        try:
            time.sleep(2)  # the apply starts while the broker is down, and fails
        finally:
            pulsar_control.start()
        wait_until(
            "the commit to complete after the broker came back",
            lambda: described(sc.url, tid).get("state") == "CompleteCommit",
            timeout=120,
        )
    visible_once(pulsar_reader_client, topics, pid, epoch)


def test_a_paused_old_coordinator_that_resumes_applies_nothing_twice(
    pulsar, tmp_path, pulsar_reader_client
):
    tid, topics = uniq("tx"), [uniq("a"), uniq("b")]
    with ThreadSidecar(pulsar, system_namespace=uniq("sys"), **FAST) as new:
        old = coordinator_beside(pulsar, tmp_path, new, tid, txn_apply_delay_ms=4_000, **LOUD)
        try:
            pid, epoch = journal_a_transaction(old.url, tid, topics)
            assert end(old.url, tid, pid, epoch)["errorCode"] == 0
            assert old.proc is not None
            os.kill(old.proc.pid, signal.SIGSTOP)
            try:
                # the broker's keep-alive drops the paused one (about 10 s on the test
                # broker); the cluster then names the other the coordinator, which loads
                # the log partition (fencing the paused one's writer) and applies the
                # decision
                old_node = old.env["KOP_DEDUP_NODE_ID"]
                wait_until(
                    "the cluster to drop the paused coordinator",
                    lambda: (
                        str(new.runtime.cluster.txn_coordinator(tid).node_id)  # type: ignore[union-attr]
                        != old_node
                    ),
                    timeout=90,
                )
                again = end(new.url, tid, pid, epoch)
                assert again["errorCode"] in {0, 51}, again
                wait_until(
                    "the new coordinator to finish the commit",
                    lambda: described(new.url, tid)["state"] == "CompleteCommit",
                    timeout=60,
                )
            finally:
                os.kill(old.proc.pid, signal.SIGCONT)
            # the old one wakes up with its apply due: it finds its log writer fenced
            # (it says so) and gives the partition up; its copy is a duplicate the
            # broker drops
            wait_until(
                "the old coordinator to find itself fenced",
                lambda: "moved to another sidecar" in old.log_path.read_text(),
                timeout=60,
            )
            assert described(new.url, tid)["state"] == "CompleteCommit"
            assert end(new.url, tid, pid, epoch)["errorCode"] == 0
            # back in the cluster it is named the coordinator again: it loads the log
            # partition again (never answering from what it read before the pause)
            wait_until(
                "the old coordinator to answer from the log again",
                lambda: described(old.url, tid)["state"] == "CompleteCommit",
                timeout=60,
            )
            assert end(old.url, tid, pid, epoch)["errorCode"] == 0
        finally:
            old.stop()
    visible_once(pulsar_reader_client, topics, pid, epoch)
