"""``kafka-transactions find-hanging`` and ``abort`` (KIP-664, Kafka 4.1's own tool run
from its jars) against the sidecar's listener.

A hanging transaction, here: a commit decided whose copy cannot complete as the
decision counted it (the journal holds another number of its batches), so it stays
PrepareCommit, holds the partition's last stable offset, and is reported
``unresolved``: the coordinator no longer expects to finish it by itself. The test
makes one by having the decision count one batch more than was journaled (as a journal
trimmed by its retention would look)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from kop_dedup.protocol.transactions import Partition, Transaction
from tests.helpers import uniq
from tests.integration.kafka_consume import create, produce
from tests.integration.kafka_txn import transactional_producer
from tests.kafka_cli import TRANSACTIONS, run_tools
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def count_one_too_many(sc: ThreadSidecar, topic: str) -> None:
    """Decisions of the sidecar count one batch more in ``topic`` than was journaled."""
    copier = sc.runtime.copier
    counted = copier.decision_end

    async def one_too_many(txn: Transaction, part: Partition) -> tuple[str | None, int]:
        end, n = await counted(txn, part)
        return end, n + 1 if part.topic == topic else n

    copier.decision_end = one_too_many


def wait_unresolved(api: httpx.Client, tid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = api.get(f"/v1/transactions/{tid}").json()
        if body.get("unresolved") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_find_hanging_names_a_commit_whose_copy_cannot_complete(pulsar: Any, tmp_path: Any) -> None:
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        b = sc.kafka_bootstrap
        stuck, fine = create(b, stem="stuck"), create(b, stem="fine")
        produce(b, stuck, [(0, None, b"before-0"), (0, None, b"before-1")])
        count_one_too_many(sc, stuck)
        tid = uniq("tx-hanging")
        producer = transactional_producer(b, tid)
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(3):
            producer.produce(stuck, value=f"s{i}".encode(), partition=0)
        producer.commit_transaction(30)
        body = wait_unresolved(api, tid)
        assert body["state"] == "PrepareCommit", body
        assert body["unresolved"], body
        pid, epoch = body["producerId"], body["producerEpoch"]
        s = ("--bootstrap-server", b)
        hanging, described, unknown, elsewhere = run_tools(
            [
                (TRANSACTIONS, [*s, "find-hanging", "--topic", stuck, "--max-transaction-timeout", "0"]),
                (TRANSACTIONS, [*s, "describe-producers", "--topic", stuck, "--partition", "0"]),
                (TRANSACTIONS, [*s, "abort", "--topic", stuck, "--partition", "0", "--start-offset", "7"]),
                (TRANSACTIONS, [*s, "find-hanging", "--topic", fine, "--max-transaction-timeout", "0"]),
            ],
            tmp_path,
        )  # fmt: skip
        producer.flush(5)
    assert hanging.exit == 0, (hanging.text, hanging.error_text)
    rows = [line.split() for line in hanging.lines[1:]]
    # Topic Partition ProducerId ProducerEpoch CoordinatorEpoch StartOffset LastTimestamp ...
    assert [r[:4] + r[5:6] for r in rows] == [[stuck, "0", str(pid), str(epoch), "2"]], hanging.text
    assert described.exit == 0, described.error_text
    assert any(line.split()[:2] == [str(pid), str(epoch)] and line.split()[-1] == "2"
               for line in described.lines[1:]), described.text  # fmt: skip
    assert unknown.exit == 1
    assert (
        f"Could not find any open transactions starting at offset 7 on partition {stuck}-0"
        in unknown.error_text + unknown.text
    ), (unknown.text, unknown.error_text)
    assert elsewhere.exit == 0, elsewhere.error_text
    assert elsewhere.lines[1:] == (), elsewhere.text
