"""Check-backs on two sidecars against the real broker: a slow application's answer
never takes the transaction-log partition back from the sidecar that took it meanwhile
(the new owner asks again), and a batch of the epoch a timeout fenced, arriving while
the application is asked, is refused 47 and stays out of the committed transaction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kop_dedup.cluster.placement import TRANSACTION_LOG
from kop_dedup.coordination.partitions import partition_of
from kop_dedup.settings import Settings
from tests.check_back import CheckBackApp, serve_check_back
from tests.helpers import (
    batch,
    init_txn,
    log_writers,
    newcomer_owning,
    read_all,
    uniq,
    wait_until,
)
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"

SIDECAR = {
    "txn_sweep_interval_ms": 100,
    "check_back_interval_ms": 50,
    "check_back_timeout_ms": 60_000,  # the held answer comes within it
}


@pytest.fixture
def app() -> Iterator[tuple[CheckBackApp, str]]:
    a = CheckBackApp()
    with serve_check_back(a) as url:
        yield a, url


def produce(api: httpx.Client, tid: str, *batches: dict[str, Any]) -> list[int]:
    r = api.post("/v1/produce", json={"transactionalId": tid, "batches": list(batches)})
    assert r.status_code == 200, r.text
    return [a["errorCode"] for a in r.json()["results"]]


def described(api: httpx.Client, tid: str) -> dict[str, Any]:
    r = api.get(f"/v1/transactions/{tid}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def values(client: Any, topic: str, partition: int = 0) -> list[str]:
    return [m.data().decode() for m in read_all(client, f"{NS}/{topic}-partition-{partition}")]


@pytest.mark.parametrize("late_answer", ["COMMIT", "UNKNOWN"])
def test_a_slow_check_back_answer_never_takes_the_partition_back(
    pulsar, app, pulsar_reader_client, late_answer
):
    """A, alone in its cluster, asks the application about a timed-out transaction; the
    application takes its time; meanwhile B joins the cluster and is named the owner of
    the id's log partition: A hands it over and B, its new owner, asks the application
    itself. A's late answer is left to B: B keeps the partition, and B's decision
    commits."""
    checker, url = app
    count = Settings().txn_log_partitions
    tid = uniq("tx")
    p = partition_of(tid, count)
    topic = uniq("d")
    checker.hold(tid, late_answer)  # A's question: answered when the test says
    checker.script[tid] = ["COMMIT"]  # any later question (B's)
    ns = uniq("sys")
    with (
        ThreadSidecar(pulsar, system_namespace=ns, check_back_urls=url, **SIDECAR) as a,
        httpx.Client(base_url=a.url, timeout=60) as api_a,
    ):
        pid, epoch = init_txn(api_a, tid, transactionTimeoutMs=500, checkBackUrl=url)
        assert produce(api_a, tid, batch(topic, pid, 0, 2, epoch=epoch)) == [0]
        wait_until("A asking the application", lambda: checker.questions(tid))
        newcomer = newcomer_owning(a.runtime.cluster.me.node_id, TRANSACTION_LOG, count, p)
        with (
            ThreadSidecar(
                pulsar, cluster_of=a, node_id=newcomer, check_back_urls=url, **SIDECAR
            ) as b,
            httpx.Client(base_url=b.url, timeout=60) as api_b,
        ):
            wait_until("B to own the partition", lambda: b.runtime.transactions.state.owned(p))
            b_writer = b.runtime.transactions.state.parts._parts[p].writer.name
            assert log_writers(b, p) == [b_writer]
            wait_until(
                "B's decision applied", lambda: described(api_b, tid)["state"] == "CompleteCommit"
            )
            assert len(checker.questions(tid)) == 2  # A's (held), then B's own
            checker.release(tid)
            asking = a.runtime.transactions.checkbacks._asking
            wait_until("A's check-back to end", lambda: tid not in asking)
            assert log_writers(b, p) == [b_writer], "A's late answer took the partition back"
            assert b.runtime.transactions.state.owned(p)
            assert described(api_b, tid)["state"] == "CompleteCommit"
            assert described(api_a, tid)["state"] == "CompleteCommit"  # forwarded to B
    assert values(pulsar_reader_client, topic) == [f"{pid}:{epoch}:0", f"{pid}:{epoch}:1"]


def test_a_batch_of_the_fenced_epoch_during_a_check_back_is_refused_and_not_committed(
    pulsar, app, pulsar_reader_client
):
    """A transaction produced through two sidecars of one cluster, one partition each
    (the id's coordinator journals both), times out with a check-back URL: its producer
    is fenced at epoch + 1. While the application is asked, a batch of the fenced epoch
    arrives at each sidecar (the coordinator, and the other, which forwards it): both
    answer 47. The application answers COMMIT: each partition holds what was journaled
    before the fence, nothing else."""
    checker, url = app
    tid, topic = uniq("tx"), uniq("d")
    r = httpx.put(f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions", json=2)
    assert r.status_code == 204, r.text
    checker.hold(tid, "COMMIT")
    with (
        ThreadSidecar(pulsar, check_back_urls=url, **SIDECAR) as a,
        ThreadSidecar(pulsar, check_back_urls=url, **SIDECAR) as b,
        httpx.Client(base_url=a.url, timeout=60) as api_a,
        httpx.Client(base_url=b.url, timeout=60) as api_b,
    ):
        pid, epoch = init_txn(api_a, tid, transactionTimeoutMs=1500, checkBackUrl=url)
        assert produce(api_a, tid, batch(topic, pid, 0, 1, epoch=epoch, partition=0)) == [0]
        assert produce(api_b, tid, batch(topic, pid, 0, 1, epoch=epoch, partition=1)) == [0]
        asked = wait_until("the application asked", lambda: checker.questions(tid))
        assert asked[0]["recordCount"] == 2
        fenced = described(api_a, tid)
        assert (fenced["inDoubt"], fenced["producerEpoch"]) == (True, epoch + 1)
        for api, partition in ((api_a, 0), (api_b, 1)):
            late = batch(topic, pid, 1, 1, epoch=epoch, partition=partition, tag="late:")
            assert produce(api, tid, late) == [47]
        checker.release(tid)
        wait_until("the commit applied", lambda: described(api_a, tid)["state"] == "CompleteCommit")
        assert len(checker.questions(tid)) == 1
        for partition in (0, 1):
            stored = values(pulsar_reader_client, topic, partition)
            assert stored == [f"{pid}:{epoch}:0"], (partition, stored)
