"""The transaction sweep works on the log partitions this sidecar owns and never takes
one: a sweep that found a transaction timed out in a partition another sidecar owns
since took the partition back, fencing the owner; two such sidecars ping-ponged until a
client's request gave up (the same hole the group sweeps had). Real broker, two
sidecars: the second joins and is named the partition's owner."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from kop_dedup.cluster.placement import TRANSACTION_LOG
from kop_dedup.coordination.partitions import partition_of
from kop_dedup.settings import Settings
from tests.helpers import batch, init_txn, log_writers, newcomer_owning, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def test_a_sweep_never_takes_back_a_partition_another_sidecar_took(pulsar: Any) -> None:
    count = Settings().txn_log_partitions
    timed_out = uniq("tx")
    p = partition_of(timed_out, count)
    with (
        ThreadSidecar(pulsar, txn_sweep_interval_ms=100, system_namespace=uniq("sys")) as a,
        httpx.Client(base_url=a.url, timeout=60) as api_a,
    ):
        # on A, alone in its cluster: a transaction that times out in 2 s
        pid, epoch = init_txn(api_a, timed_out, transactionTimeoutMs=2000)
        body = {"transactionalId": timed_out, "batches": [batch(uniq("d"), pid, 0, 1, epoch=epoch)]}
        assert api_a.post("/v1/produce", json=body).json()["results"][0]["errorCode"] == 0
        # B joins and is named the partition's owner: A hands it over
        newcomer = newcomer_owning(a.runtime.cluster.me.node_id, TRANSACTION_LOG, count, p)
        with (
            ThreadSidecar(
                pulsar, cluster_of=a, node_id=newcomer, txn_sweep_interval_ms=600_000
            ) as b,
            httpx.Client(base_url=b.url, timeout=60) as api_b,
        ):
            wait_until("B to own the partition", lambda: b.runtime.transactions.state.owned(p))
            b_writer = b.runtime.transactions.state.parts._parts[p].writer.name
            assert log_writers(b, p) == [b_writer]
            # A's sweep saw the transaction in what it last read; B (sweeping rarely) owns it
            time.sleep(3.5)
            assert log_writers(b, p) == [b_writer], "a sweep of A took the partition back from B"
            assert api_b.get(f"/v1/transactions/{timed_out}").json()["state"] == "Ongoing"
            # B, the owner, times it out at its own sweep
            b.call(b.runtime.transactions.sweep())
            assert api_b.get(f"/v1/transactions/{timed_out}").json()["state"] != "Ongoing"
            assert log_writers(b, p) == [b_writer]
