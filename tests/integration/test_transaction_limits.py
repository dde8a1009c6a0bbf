"""A committed transaction is visible whole, or its batch is refused whole at produce:
what a copy writes into a data partition is sized at produce, and a batch whose copy
failed is never followed by the next one (real broker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import b64, delete_namespace, init_txn, read_all, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


@pytest.fixture(scope="module")
def limits_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(pulsar, txn_sweep_interval_ms=100, system_namespace=uniq("sys")) as sc:
        yield sc


def post(api: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = api.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def sized_batch(topic: str, pid: int, epoch: int, base: int, n: int, size: int) -> dict[str, Any]:
    """``n`` records of ``size`` bytes each (the value names its sequence)."""
    return {
        "topic": topic,
        "partition": 0,
        "producerId": pid,
        "producerEpoch": epoch,
        "baseSequence": base,
        "lastSequence": base + n - 1,
        "records": [{"value": b64(f"{base + i}:".encode().ljust(size, b"x"))} for i in range(n)],
    }


def state(api: httpx.Client, tid: str) -> str:
    return str(api.get(f"/v1/transactions/{tid}").json()["state"])


def visible(client: Any, topic: str) -> list[int]:
    """The sequences the visible records name, in topic order."""
    return [int(m.data().split(b":")[0]) for m in read_all(client, f"{NS}/{topic}-partition-0")]


def long_id(length: int) -> str:
    return uniq("tx").ljust(length, "x")


def test_a_commit_of_a_long_transactional_id_is_visible_whole_once(
    limits_sidecar, pulsar_reader_client
):
    """The issue's example: a 3,000-character transactionalId, a batch of 2,000 records
    of 100 bytes and one of 1 record to the same partition, commit. Each copied record
    used to carry the id: the first copy outgrew the broker's maxMessageSize, the second
    was stored, and the retry skipped the first (below the copy producer's high-water
    mark): CompleteCommit with 1 record of 2,001 visible."""
    tid, topic = long_id(3000), uniq("a")
    with httpx.Client(base_url=limits_sidecar.url, timeout=60) as api:
        pid, epoch = init_txn(api, tid)
        first = post(
            api,
            "/v1/produce",
            {"transactionalId": tid, "batches": [sized_batch(topic, pid, epoch, 0, 2000, 100)]},
        )["results"][0]
        if first["errorCode"] != 0:  # refused whole: the limit named, nothing visible
            assert first["errorCode"] == 10, first
            assert "5242880" in first["errorMessage"], first
            assert post(
                api,
                "/v1/end-txn",
                {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True},
            )["errorCode"] in {0, 48}
            assert visible(pulsar_reader_client, topic) == []
            return
        second = post(
            api,
            "/v1/produce",
            {"transactionalId": tid, "batches": [sized_batch(topic, pid, epoch, 2000, 1, 100)]},
        )["results"][0]
        assert second["errorCode"] == 0, second
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True}
        assert post(api, "/v1/end-txn", end)["errorCode"] == 0
        wait_until("the commit to complete", lambda: state(api, tid) == "CompleteCommit", 60)
    assert visible(pulsar_reader_client, topic) == list(range(2001))


def test_a_batch_whose_copy_could_not_be_stored_is_refused_at_produce_naming_the_limit(
    pulsar, pulsar_reader_client
):
    """The copy of a batch adds the transaction's markers to what the batch's own entry
    holds: a batch under the limit alone, but not with them, is refused with 10
    MESSAGE_TOO_LARGE before it is journaled, and the limit is in the message."""
    tid, topic = long_id(3000), uniq("a")
    limit = 64 * 1024
    with (
        ThreadSidecar(pulsar, pulsar_max_message_bytes=limit, max_batch_bytes=limit) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pid, epoch = init_txn(api, tid)
        # 150 records of 100 bytes: the batch's own entry is under 60 KB, its copy not
        big = sized_batch(topic, pid, epoch, 0, 150, 100)
        answer = post(api, "/v1/produce", {"transactionalId": tid, "batches": [big]})
        [result] = answer["results"]
        assert result["errorCode"] == 10, result
        assert str(limit) in result["errorMessage"], result
        # nothing was journaled: the same sequences in a smaller batch are the first
        small = sized_batch(topic, pid, epoch, 0, 20, 100)
        answer = post(api, "/v1/produce", {"transactionalId": tid, "batches": [small]})
        assert answer["results"][0]["errorCode"] == 0, answer
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True}
        assert post(api, "/v1/end-txn", end)["errorCode"] == 0
        wait_until("the commit to complete", lambda: state(api, tid) == "CompleteCommit", 60)
    assert visible(pulsar_reader_client, topic) == list(range(20))


def test_a_copy_that_failed_is_never_followed_by_the_next_batch(pulsar, pulsar_reader_client):
    """A sidecar told the broker takes 8 MiB entries (it takes 5 MiB): the copy of a
    6 MB batch is refused (by the client, which knows the broker's limit). The copy of
    the next batch of the same partition must never be sent after it (stored above a
    failed one, the copy producer's mark would pass the failed batch), and the
    transaction never completes with the first batch missing: nothing of it is
    visible, and it is retried."""
    namespace = uniq("kop-dedup-limits")
    tid, topic = uniq("tx"), uniq("a")
    try:
        with (
            ThreadSidecar(
                pulsar,
                system_namespace=namespace,
                pulsar_max_message_bytes=8 * 1024 * 1024,
                max_batch_bytes=4 * 1024 * 1024,
                txn_sweep_interval_ms=100,
            ) as sc,
            httpx.Client(base_url=sc.url, timeout=60) as api,
        ):
            pid, epoch = init_txn(api, tid)
            # 10,000 records of 400 bytes: a 4 MB journal entry, a 6 MB copy
            batches = [
                sized_batch(topic, pid, epoch, 0, 10_000, 400),
                sized_batch(topic, pid, epoch, 10_000, 1, 400),
            ]
            for b in batches:
                answer = post(api, "/v1/produce", {"transactionalId": tid, "batches": [b]})
                assert answer["results"][0]["errorCode"] == 0, answer
            end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch}
            assert post(api, "/v1/end-txn", {**end, "commit": True})["errorCode"] == 0

            def settled() -> bool:
                stats = api.get("/v1/stats").json()["transactions"]
                return stats.get("applyRetries", 0) >= 3 or state(api, tid) == "CompleteCommit"

            wait_until("the copy to be retried (or the commit to complete)", settled, 60)
            assert state(api, tid) == "PrepareCommit"  # never completed with records missing
            assert post(api, "/v1/end-txn", {**end, "commit": True})["errorCode"] == 51
    finally:
        delete_namespace(pulsar.admin_url, f"public/{namespace}")
    assert visible(pulsar_reader_client, topic) == []
