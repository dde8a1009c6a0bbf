"""How a commit is copied, against the real broker: from the local copy of the
journaled batches, through copy producers kept open; from the journal when the local
copy is gone (evicted, or the copy is finished by a sidecar that did not journal)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kop_dedup.coordination.transactions.copier import PROP_TXN_BATCH, Copier
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.coordination.transactions.requests import EndTxn, InitProducerId
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.protocol.transactions import TxnState
from kop_dedup.pulsar.entries import PROP_BARRIER
from kop_dedup.pulsar.wire import PROP_ENTRY_FORMAT, WHOLE_BATCH
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from tests.helpers import batch, init_txn, read_all, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


@pytest.fixture(scope="module")
def copies_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(pulsar, txn_sweep_interval_ms=100, system_namespace=uniq("sys")) as sc:
        yield sc


def post(api: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = api.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def commit_rounds(api: httpx.Client, tid: str, topics: list[str], rounds: int) -> tuple[int, int]:
    """``rounds`` committed transactions, each 2 batches of 2 records per topic."""
    pid, epoch = init_txn(api, tid)
    for r in range(rounds):
        batches = [batch(t, pid, 4 * r + 2 * i, 2, epoch=epoch) for t in topics for i in (0, 1)]
        results = post(api, "/v1/produce", {"transactionalId": tid, "batches": batches})["results"]
        assert [x["errorCode"] for x in results] == [0] * len(batches), results
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True}
        assert post(api, "/v1/end-txn", end)["errorCode"] == 0
        wait_until(
            "the commit to complete",
            lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
        )
    return pid, epoch


def txn_stats(api: httpx.Client) -> dict[str, Any]:
    stats: dict[str, Any] = api.get("/v1/stats").json()["transactions"]
    return stats


def visible(client: Any, topic: str) -> list[str]:
    return [m.data().decode() for m in read_all(client, f"{NS}/{topic}-partition-0")]


def test_commits_copy_from_the_local_copy_through_copy_producers_kept_open(
    copies_sidecar, pulsar_reader_client
):
    tid, topics = uniq("tx"), [uniq("a"), uniq("b")]
    with httpx.Client(base_url=copies_sidecar.url, timeout=60) as api:
        before = txn_stats(api)
        pid, epoch = commit_rounds(api, tid, topics, rounds=3)
        after = txn_stats(api)
    assert after["localCopy"]["hits"] - before["localCopy"]["hits"] == 3 * len(topics)
    assert after["localCopy"]["misses"] == before["localCopy"]["misses"]
    # one copy producer per data partition for the three transactions, not one each
    created = after["copyProducers"]["created"] - before["copyProducers"]["created"]
    assert created == len(topics)
    assert after["localCopy"]["transactions"] == 0  # complete: forgotten
    for t in topics:
        assert visible(pulsar_reader_client, t) == [f"{pid}:{epoch}:{i}" for i in range(12)]


@pytest.mark.parametrize("whole", [True, False], ids=["whole-batch-journal", "per-record-journal"])
def test_a_commit_whose_local_copy_was_evicted_reads_the_journal_and_lands_once(
    pulsar, pulsar_reader_client, whole
):
    tid, topics = uniq("tx"), [uniq("a"), uniq("b")]
    with (
        ThreadSidecar(pulsar, txn_local_copy_max_bytes=1, txn_journal_whole_batches=whole) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pid, epoch = commit_rounds(api, tid, topics, rounds=2)
        stats = txn_stats(api)
        system = f"persistent://{sc.settings.tenant}/{sc.settings.system_namespace}"
    assert stats["localCopy"]["evicted"] >= 2
    assert stats["localCopy"]["hits"] == 0
    assert stats["localCopy"]["misses"] == 2 * len(topics)
    for t in topics:
        assert visible(pulsar_reader_client, t) == [f"{pid}:{epoch}:{i}" for i in range(8)]
    stored = read_all(pulsar_reader_client, f"{system}/txn-journal.0.{topics[0]}-partition-0")
    journal = [m for m in stored if PROP_BARRIER not in m.properties()]
    # 2 rounds x 2 batches x 2 records: one message per batch, or one per record
    assert len(journal) == (4 if whole else 8)
    layouts = {m.properties().get(PROP_ENTRY_FORMAT) for m in journal}
    assert layouts == ({WHOLE_BATCH} if whole else {None})
    # no local copy: each decision wrote a barrier after the batches and counted up to it
    assert len(stored) - len(journal) == 2


def test_a_copy_cut_short_and_finished_from_the_journal_by_another_sidecar_lands_once(
    pulsar, pulsar_reader_client
):
    """The local copy and the journal give each batch the same index, hence the same
    sequence id: what the first copy stored comes back -1/-1 to the second."""
    tid, topic = uniq("tx"), uniq("a")
    settings = Settings(
        pulsar_service_url=pulsar.service_url,
        pulsar_admin_url=pulsar.admin_url,
        txn_apply_delay_ms=600_000,  # the runtime itself never applies it: the test does
    )
    lost: list[Any] = []

    async def scenario() -> tuple[int, int, int]:
        runtime = Runtime(settings)
        await runtime.start()
        await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        try:
            coordinator = runtime.transactions
            copier = coordinator._copier
            ids = await coordinator.init_producer_id(InitProducerId(tid))
            pid, epoch = ids.producer_id, ids.producer_epoch
            batches = [
                KafkaBatch(
                    topic,
                    0,
                    pid,
                    epoch,
                    2 * i,
                    2 * i + 1,
                    tuple(rec(f"{pid}:{epoch}:{2 * i + j}".encode()) for j in (0, 1)),
                )
                for i in range(3)
            ]
            answers = await coordinator.produce(tid, batches, time.monotonic() + 30)
            assert [a.error for a in answers] == [None, None, None], answers
            await coordinator.end(EndTxn(tid, pid, epoch, commit=True))
            txn = await coordinator.describe(tid)
            assert txn is not None
            assert txn.state is TxnState.PREPARE_COMMIT
            part = txn.partitions[0]
            assert part.journaler == copier.instance
            kept = await copier.batches(txn, part)
            assert copier.local.hits == 1
            assert part.batches == 3
            assert [b.base_sequence for b in kept] == [0, 2, 4]
            # the sidecar copies the first batch from memory, then goes away
            await copier.copy(txn, part, kept[:1])
            await copier.close()
            other = Copier(
                runtime.publisher.client,
                runtime.publisher,
                runtime.naming,
                copier._journal,
                prefix=settings.producer_name_prefix,
                on_state_lost=lambda *a: lost.append(a),
                local=LocalCopy(1 << 20),
                instance="another-sidecar",
            )
            try:
                copied = await other.copy(txn, part, await other.batches(txn, part))
            finally:
                await other.close()
            return pid, epoch, copied + 1000 * other.local.misses
        finally:
            await runtime.close()

    pid, epoch, outcome = asyncio.run(scenario())
    assert outcome == 1000 + 6  # read from the journal; 6 records in the transaction
    assert lost == []  # the broker remembered the copy's name
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0")
    assert [m.data().decode() for m in msgs] == [f"{pid}:{epoch}:{i}" for i in range(6)]
    # a batch's index on its first record
    assert [m.properties().get(PROP_TXN_BATCH) for m in msgs] == ["0", None, "1", None, "2", None]


def test_end_txn_waits_for_a_batch_of_its_transaction_still_in_flight(pulsar, pulsar_reader_client):
    """A batch waiting (here: for a sequence gap) when end-txn arrives is answered
    before the decision is taken: it is in the commit if it was stored, refused if not."""
    tid, topic = uniq("tx"), uniq("a")
    with (
        ThreadSidecar(pulsar, reorder_window_ms=5_000) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pid, epoch = init_txn(api, tid)
        first = post(
            api,
            "/v1/produce",
            {"transactionalId": tid, "batches": [batch(topic, pid, 0, 2, epoch=epoch)]},
        )
        assert first["results"][0]["errorCode"] == 0
        answered: dict[str, tuple[float, int]] = {}

        def produce_after_a_gap() -> None:
            with httpx.Client(base_url=sc.url, timeout=60) as other:
                r = post(
                    other,
                    "/v1/produce",
                    {"transactionalId": tid, "batches": [batch(topic, pid, 4, 2, epoch=epoch)]},
                )
                answered["produce"] = (time.monotonic(), r["results"][0]["errorCode"])

        waiting = threading.Thread(target=produce_after_a_gap)
        waiting.start()
        try:
            wait_until(
                "the batch after the gap to wait",
                lambda: (
                    "kop_dedup_waiting_batches 1.0" in api.get("/metrics").text
                    or "kop_dedup_waiting_batches 1\n" in api.get("/metrics").text
                ),
            )
            end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch}
            assert post(api, "/v1/end-txn", {**end, "commit": True})["errorCode"] == 0
            answered["end"] = (time.monotonic(), 0)
        finally:
            waiting.join()
        wait_until(
            "the commit to complete",
            lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
        )
    assert answered["produce"][0] <= answered["end"][0]
    assert answered["produce"][1] != 0  # never stored (the gap was never filled)
    assert visible(pulsar_reader_client, topic) == [f"{pid}:{epoch}:{i}" for i in range(2)]


def test_a_transaction_whose_first_batches_arrive_at_once_commits_each_once(
    copies_sidecar, pulsar_reader_client
):
    """Ten requests of one batch each, over two partitions, all in flight at once (as a
    Kafka producer pipelines them): the joins they share put both partitions in the
    transaction, and the commit copies every batch once, in sequence order."""
    tid, topics = uniq("tx"), [uniq("a"), uniq("b")]
    with httpx.Client(base_url=copies_sidecar.url, timeout=60) as api:
        pid, epoch = init_txn(api, tid)
    codes: list[int] = []

    def produce(i: int) -> None:
        one = batch(topics[i % 2], pid, 2 * (i // 2), 2, epoch=epoch)
        with httpx.Client(base_url=copies_sidecar.url, timeout=60) as api:
            r = post(api, "/v1/produce", {"transactionalId": tid, "batches": [one]})
            codes.append(r["results"][0]["errorCode"])

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [0] * 10
    with httpx.Client(base_url=copies_sidecar.url, timeout=60) as api:
        described = api.get(f"/v1/transactions/{tid}").json()
        assert sorted(p["topic"] for p in described["partitions"]) == topics, described
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True}
        assert post(api, "/v1/end-txn", end)["errorCode"] == 0
        wait_until(
            "the commit to complete",
            lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
        )
    for topic in topics:
        got = visible(pulsar_reader_client, topic)
        assert got == [f"{pid}:{epoch}:{s}" for s in range(10)], (topic, got)
