"""Kafka-style transactions against the real broker: commit, abort, fencing, timeouts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from kop_dedup.coordination.transactions.journal import PROP_TXN_ID, PROP_TXN_ORDINAL
from tests.helpers import batch, read_all, uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


def poll(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def txn_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(
        pulsar, reorder_window_ms=1500, txn_sweep_interval_ms=100, coordinator_adopt_interval_ms=500
    ) as sc:
        yield sc


@pytest.fixture
def tapi(txn_sidecar: ThreadSidecar) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=txn_sidecar.url, timeout=60) as client:
        yield client


def init(api: httpx.Client, tid: str, **extra: Any) -> tuple[int, int]:
    body = api.post("/v1/init-producer-id", json={"transactionalId": tid, **extra}).json()
    assert body["errorCode"] == 0, body
    return body["producerId"], body["producerEpoch"]


def tproduce(api: httpx.Client, tid: str, *batches: dict[str, Any]) -> list[dict[str, Any]]:
    r = api.post("/v1/produce", json={"transactionalId": tid, "batches": list(batches)})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def end(api: httpx.Client, tid: str, pid: int, epoch: int, commit: bool) -> dict[str, Any]:
    r = api.post(
        "/v1/end-txn",
        json={"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": commit},
    )
    assert r.status_code == 200, r.text
    return r.json()


def state(api: httpx.Client, tid: str) -> dict[str, Any]:
    r = api.get(f"/v1/transactions/{tid}")
    assert r.status_code == 200, r.text
    return r.json()


def values(client: Any, topic: str, partition: int = 0) -> list[str]:
    return [m.data().decode() for m in read_all(client, f"{NS}/{topic}-partition-{partition}")]


def test_a_committed_transaction_across_topics_becomes_visible_whole(tapi, pulsar_reader_client):
    tid, a, b = uniq("tx"), uniq("a"), uniq("b")
    pid, epoch = init(tapi, tid)
    answers = tproduce(
        tapi,
        tid,
        batch(a, pid, 0, 3, epoch=epoch),
        batch(b, pid, 0, 2, epoch=epoch),
    )
    assert [r["errorCode"] for r in answers] == [0, 0], answers
    assert values(pulsar_reader_client, a) == []  # journaled, not visible
    assert state(tapi, tid)["state"] == "Ongoing"
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    poll("the commit to complete", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    assert values(pulsar_reader_client, a) == [f"{pid}:{epoch}:{i}" for i in range(3)]
    assert values(pulsar_reader_client, b) == [f"{pid}:{epoch}:{i}" for i in range(2)]
    msgs = read_all(pulsar_reader_client, f"{NS}/{a}-partition-0")
    assert {m.properties()[PROP_TXN_ID] for m in msgs} == {tid}
    assert {m.properties()[PROP_TXN_ORDINAL] for m in msgs} == {"1"}
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0  # the same decision again
    assert end(tapi, tid, pid, epoch, False)["errorCode"] == 48


def test_an_aborted_transaction_stays_invisible(tapi, pulsar_reader_client):
    tid, a = uniq("tx"), uniq("a")
    pid, epoch = init(tapi, tid)
    assert [r["errorCode"] for r in tproduce(tapi, tid, batch(a, pid, 0, 3, epoch=epoch))] == [0]
    assert end(tapi, tid, pid, epoch, False)["errorCode"] == 0
    poll("the abort to complete", lambda: state(tapi, tid)["state"] == "CompleteAbort")
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 48
    # the next transaction continues the sequence and commits
    assert [r["errorCode"] for r in tproduce(tapi, tid, batch(a, pid, 3, 2, epoch=epoch))] == [0]
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    poll("the commit", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    assert values(pulsar_reader_client, a) == [f"{pid}:{epoch}:{i}" for i in (3, 4)]
