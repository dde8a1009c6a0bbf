"""Kafka-style transactions against the real broker: commit, abort, fencing, timeouts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kop_dedup.coordination.transactions.journal import PROP_TXN_ID, PROP_TXN_ORDINAL
from tests.check_back import CheckBackApp, serve_check_back
from tests.helpers import batch, init_txn, read_all, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


@pytest.fixture(scope="module")
def txn_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(
        pulsar,
        system_namespace=uniq("sys"),
        reorder_window_ms=1500,
        txn_sweep_interval_ms=100,
        coordinator_adopt_interval_ms=500,
    ) as sc:
        yield sc


@pytest.fixture
def tapi(txn_sidecar: ThreadSidecar) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=txn_sidecar.url, timeout=60) as client:
        yield client


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
    pid, epoch = init_txn(tapi, tid)
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
    wait_until("the commit to complete", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    assert values(pulsar_reader_client, a) == [f"{pid}:{epoch}:{i}" for i in range(3)]
    assert values(pulsar_reader_client, b) == [f"{pid}:{epoch}:{i}" for i in range(2)]
    msgs = read_all(pulsar_reader_client, f"{NS}/{a}-partition-0")
    # the ordinal on every copied record, the transactional id once per batch
    assert {m.properties()[PROP_TXN_ORDINAL] for m in msgs} == {"1"}
    assert [m.properties().get(PROP_TXN_ID) for m in msgs] == [tid, None, None]
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0  # the same decision again
    assert end(tapi, tid, pid, epoch, False)["errorCode"] == 48


def test_a_transaction_with_a_single_record_on_a_partition_commits(tapi, pulsar_reader_client):
    """One record is a whole partition's share: its copy producer still opens (the
    client refuses a batch container of one message)."""
    tid, a, b = uniq("tx"), uniq("a"), uniq("b")
    pid, epoch = init_txn(tapi, tid)
    answers = tproduce(
        tapi, tid, batch(a, pid, 0, 1, epoch=epoch), batch(b, pid, 0, 2, epoch=epoch)
    )
    assert [r["errorCode"] for r in answers] == [0, 0], answers
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    wait_until("the commit to complete", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    assert values(pulsar_reader_client, a) == [f"{pid}:{epoch}:0"]
    assert values(pulsar_reader_client, b) == [f"{pid}:{epoch}:{i}" for i in range(2)]


def test_a_batch_refused_for_a_missing_partition_does_not_join_the_transaction(
    tapi, pulsar_reader_client
):
    """A batch answered 3 (its partition does not exist) was never journaled: its
    partition is not in the transaction, which commits only what was journaled."""
    tid, a, b = uniq("tx"), uniq("a"), uniq("b")
    pid, epoch = init_txn(tapi, tid)
    answers = tproduce(
        tapi,
        tid,
        batch(a, pid, 0, 1, epoch=epoch),
        batch(b, pid, 0, 1, epoch=epoch, partition=1),  # b gets one partition
    )
    assert [r["errorCode"] for r in answers] == [0, 3], answers
    assert "partitions 0..0" in answers[1]["errorMessage"], answers
    assert [(p["topic"], p["partition"]) for p in state(tapi, tid)["partitions"]] == [(a, 0)]
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    wait_until("the commit to complete", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    assert [(p["topic"], p["partition"]) for p in state(tapi, tid)["partitions"]] == [(a, 0)]
    assert values(pulsar_reader_client, a) == [f"{pid}:{epoch}:0"]


def test_a_malformed_batch_refused_87_does_not_join_the_transaction(tapi, pulsar_reader_client):
    tid, a, b = uniq("tx"), uniq("a"), uniq("b")
    pid, epoch = init_txn(tapi, tid)
    bad = {**batch(b, pid, 0, 2, epoch=epoch), "lastSequence": 5}  # 2 records, not 6
    answers = tproduce(tapi, tid, batch(a, pid, 0, 1, epoch=epoch), bad)
    assert [r["errorCode"] for r in answers] == [0, 87], answers
    assert [(p["topic"], p["partition"]) for p in state(tapi, tid)["partitions"]] == [(a, 0)]
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    wait_until("the commit to complete", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    assert values(pulsar_reader_client, a) == [f"{pid}:{epoch}:0"]


def test_an_aborted_transaction_stays_invisible(tapi, pulsar_reader_client):
    tid, a = uniq("tx"), uniq("a")
    pid, epoch = init_txn(tapi, tid)
    assert [r["errorCode"] for r in tproduce(tapi, tid, batch(a, pid, 0, 3, epoch=epoch))] == [0]
    assert end(tapi, tid, pid, epoch, False)["errorCode"] == 0
    wait_until("the abort to complete", lambda: state(tapi, tid)["state"] == "CompleteAbort")
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 48
    # the next transaction continues the sequence and commits
    assert [r["errorCode"] for r in tproduce(tapi, tid, batch(a, pid, 3, 2, epoch=epoch))] == [0]
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    wait_until("the commit", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    assert values(pulsar_reader_client, a) == [f"{pid}:{epoch}:{i}" for i in (3, 4)]


def test_a_transaction_begun_while_the_last_one_completes_keeps_every_partition(
    tapi, pulsar_reader_client
):
    """The next transaction's first produce, sent right after end-txn's answer and retried
    on 51 at once, lands while the previous decision is being applied, often just as it
    completes: every partition of it must join the new transaction (a partition the
    previous one listed once was answered 0 and never copied)."""
    tid, a, b = uniq("tx"), uniq("a"), uniq("b")
    pid, epoch = init_txn(tapi, tid)
    rounds, n = 12, 2
    for r in range(rounds):
        batches = [batch(t, pid, r * n, n, epoch=epoch) for t in (a, b)]
        while True:
            codes = [x["errorCode"] for x in tproduce(tapi, tid, *batches)]
            if 51 not in codes:
                break
        assert set(codes) <= {0, 46}, codes  # 46: journaled by an earlier try
        assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    wait_until("the last commit", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    expected = [f"{pid}:{epoch}:{i}" for i in range(rounds * n)]
    assert values(pulsar_reader_client, a) == expected
    assert values(pulsar_reader_client, b) == expected


def offsets(api: httpx.Client, group: str, *, stable: bool = False) -> dict[tuple[str, int], Any]:
    r = api.get(f"/v1/groups/{group}/offsets", params={"requireStable": str(stable).lower()})
    assert r.status_code == 200, r.text
    return {(o["topic"], o["partition"]): o for o in r.json()["offsets"]}


def create_topic(pulsar: Any, topic: str, partitions: int) -> None:
    url = f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions"
    assert httpx.put(url, json=partitions).status_code in {204, 409}


def test_a_transaction_over_three_topics_and_two_partitions_commits_with_its_offsets(
    pulsar, tapi, pulsar_reader_client
):
    tid, group, source = uniq("tx"), uniq("g"), uniq("src")
    topics = [uniq("t") for _ in range(3)]
    for t in topics:
        create_topic(pulsar, t, 2)
    pid, epoch = init_txn(tapi, tid)
    batches = [batch(t, pid, 0, 2, epoch=epoch, partition=p) for t in topics for p in (0, 1)]
    assert [r["errorCode"] for r in tproduce(tapi, tid, *batches)] == [0] * 6
    commit_offsets = {
        "transactionalId": tid,
        "producerId": pid,
        "producerEpoch": epoch,
        "groupId": group,
        "offsets": [{"topic": source, "partition": 0, "offset": 42, "metadata": "m"}],
    }
    assert tapi.post("/v1/txn-offset-commit", json=commit_offsets).json()["errorCode"] == 0
    pending = offsets(tapi, group, stable=True)[(source, 0)]
    assert pending["errorCode"] == 88  # staged, not committed
    assert offsets(tapi, group)[(source, 0)]["offset"] == -1
    described = state(tapi, tid)
    assert described["groups"] == [group]
    assert {(p["topic"], p["partition"]) for p in described["partitions"]} == {
        (t, p) for t in topics for p in (0, 1)
    }
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 0
    wait_until("the commit", lambda: state(tapi, tid)["state"] == "CompleteCommit")
    committed = offsets(tapi, group, stable=True)[(source, 0)]
    assert (committed["offset"], committed["metadata"], committed["errorCode"]) == (42, "m", 0)
    for t in topics:
        for p in (0, 1):
            assert values(pulsar_reader_client, t, p) == [f"{pid}:{epoch}:0", f"{pid}:{epoch}:1"]


def test_a_zombie_is_fenced_on_produce_and_end_txn_and_its_open_transaction_is_aborted(
    tapi, pulsar_reader_client
):
    tid, a = uniq("tx"), uniq("a")
    pid, epoch = init_txn(tapi, tid)
    assert [r["errorCode"] for r in tproduce(tapi, tid, batch(a, pid, 0, 2, epoch=epoch))] == [0]
    # a new instance of the application: its init fences the open transaction first
    first = tapi.post("/v1/init-producer-id", json={"transactionalId": tid}).json()
    assert first["errorCode"] == 51, first
    new = wait_until(
        "init to succeed once the fenced transaction is aborted",
        lambda: (
            (r := tapi.post("/v1/init-producer-id", json={"transactionalId": tid}).json())[
                "errorCode"
            ]
            == 0
            and r
        ),
    )
    assert new["producerId"] == pid
    assert new["producerEpoch"] > epoch
    zombie = tproduce(tapi, tid, batch(a, pid, 2, 1, epoch=epoch))
    assert zombie[0]["errorCode"] == 47, zombie
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 90
    assert values(pulsar_reader_client, a) == []
    assert state(tapi, tid)["state"] == "CompleteAbort"


def test_a_batch_of_another_producer_id_is_invalid_producer_id_mapping(tapi):
    tid = uniq("tx")
    pid, epoch = init_txn(tapi, tid)
    answer = tproduce(tapi, tid, batch(uniq("a"), pid + 1, 0, 1, epoch=epoch))
    assert answer[0]["errorCode"] == 49, answer
    unknown = tproduce(tapi, uniq("never-initialised"), batch(uniq("a"), pid, 0, 1, epoch=epoch))
    assert unknown[0]["errorCode"] == 49


def test_a_transactional_batch_without_a_producer_id_is_invalid_producer_id_mapping(tapi):
    """Admission's producer check is the one a journaled batch gets: a non-idempotent
    batch (producer id -1) in a transactional request is 49, and joins nothing."""
    tid, topic = uniq("tx"), uniq("a")
    pid, epoch = init_txn(tapi, tid)
    plain = {**batch(topic, -1, 0, 2, epoch=-1), "baseSequence": -1, "lastSequence": -1}
    answer = tproduce(tapi, tid, plain)
    assert answer[0]["errorCode"] == 49, answer
    assert "init-producer-id" in answer[0]["errorMessage"], answer
    assert state(tapi, tid)["state"] == "Empty"
    # the transaction's own producer still produces into it
    assert tproduce(tapi, tid, batch(topic, pid, 0, 1, epoch=epoch))[0]["errorCode"] == 0
    assert end(tapi, tid, pid, epoch, False)["errorCode"] == 0


def test_end_txn_with_nothing_open_is_invalid_txn_state(tapi):
    tid = uniq("tx")
    pid, epoch = init_txn(tapi, tid)
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 48


def test_a_timeout_over_the_maximum_is_invalid_transaction_timeout(tapi):
    body = tapi.post(
        "/v1/init-producer-id",
        json={"transactionalId": uniq("tx"), "transactionTimeoutMs": 900_001},
    ).json()
    assert body["errorCode"] == 50


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(
    tapi, pulsar_reader_client
):
    tid, a = uniq("tx"), uniq("a")
    pid, epoch = init_txn(tapi, tid, transactionTimeoutMs=1000)
    assert [r["errorCode"] for r in tproduce(tapi, tid, batch(a, pid, 0, 2, epoch=epoch))] == [0]
    done = wait_until(
        "the timeout abort", lambda: (s := state(tapi, tid))["state"] == "CompleteAbort" and s
    )
    assert done["producerEpoch"] == epoch + 1
    assert tproduce(tapi, tid, batch(a, pid, 2, 1, epoch=epoch))[0]["errorCode"] == 47
    assert end(tapi, tid, pid, epoch, True)["errorCode"] == 90
    assert values(pulsar_reader_client, a) == []


def test_open_transactions_are_listed(tapi):
    tid = uniq("tx")
    pid, epoch = init_txn(tapi, tid)
    assert tproduce(tapi, tid, batch(uniq("a"), pid, 0, 1, epoch=epoch))[0]["errorCode"] == 0
    listed = {t["transactionalId"]: t for t in tapi.get("/v1/transactions").json()["transactions"]}
    assert listed[tid]["state"] == "Ongoing"
    assert listed[tid]["ageMs"] >= 0
    assert listed[tid]["timeoutMs"] == 60_000
    assert end(tapi, tid, pid, epoch, False)["errorCode"] == 0
    wait_until(
        "the transaction to leave the list",
        lambda: (
            tid
            not in {
                t["transactionalId"] for t in tapi.get("/v1/transactions").json()["transactions"]
            }
        ),
    )
    assert tapi.get(f"/v1/transactions/{uniq('nobody')}").status_code == 404


@pytest.fixture(scope="module")
def check_back(pulsar: Any) -> Iterator[tuple[CheckBackApp, str, ThreadSidecar]]:
    app = CheckBackApp()
    with (
        serve_check_back(app) as url,
        ThreadSidecar(
            pulsar,
            txn_sweep_interval_ms=100,
            check_back_interval_ms=50,
            check_back_max=3,
            check_back_urls=url,
        ) as sc,
    ):
        yield app, url, sc


@pytest.mark.parametrize(
    ("script", "final", "visible"),
    [
        (["COMMIT"], "CompleteCommit", True),
        (["ROLLBACK"], "CompleteAbort", False),
        (["UNKNOWN", "UNKNOWN", "UNKNOWN"], "CompleteAbort", False),
        (["UNKNOWN", "COMMIT"], "CompleteCommit", True),
    ],
    ids=["commit", "rollback", "unknown-until-the-limit", "unknown-then-commit"],
)
def test_a_timed_out_transaction_is_checked_back_with_the_application(
    check_back, pulsar_reader_client, script, final, visible
):
    app, url, sc = check_back
    tid, a = uniq("tx"), uniq("a")
    app.script[tid] = list(script)
    with httpx.Client(base_url=sc.url, timeout=30) as api:
        pid, epoch = init_txn(api, tid, transactionTimeoutMs=500, checkBackUrl=url)
        assert tproduce(api, tid, batch(a, pid, 0, 2, epoch=epoch))[0]["errorCode"] == 0
        done = wait_until(
            "the check-back decision", lambda: (s := state(api, tid))["state"] == final and s
        )
        assert tproduce(api, tid, batch(a, pid, 2, 1, epoch=epoch))[0]["errorCode"] == 47
    questions = [q for q in app.asked if q["transactionalId"] == tid]
    expected_asks = 3 if script == ["UNKNOWN"] * 3 else len(script)
    assert len(questions) == expected_asks
    assert done["checkBacks"] == expected_asks - (
        0 if final == "CompleteAbort" and len(script) == 3 else 1
    )
    assert questions[0]["producerId"] == pid
    assert questions[0]["producerEpoch"] == epoch
    assert questions[0]["recordCount"] == 2
    assert questions[0]["partitions"] == [{"topic": a, "partition": 0, "records": 2}]
    expected = [f"{pid}:{epoch}:0", f"{pid}:{epoch}:1"] if visible else []
    assert values(pulsar_reader_client, a) == expected
