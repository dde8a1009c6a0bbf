"""The transaction sweep works on the log partitions this sidecar owns and never takes
one: a sweep that found a transaction timed out in a partition another sidecar has
taken since (this one learns it was fenced only at its next write) took the partition
back, fencing the sidecar the clients use; two such sidecars ping-pong until a client's
request gives up (the same hole the group sweeps had). Real broker, two sidecars."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from kop_dedup.coordination.partitions import partition_of
from kop_dedup.settings import Settings
from tests.helpers import batch, init_txn, log_writers, same_partition_ids, uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def test_a_sweep_never_takes_back_a_partition_another_sidecar_took(pulsar: Any) -> None:
    count = Settings().txn_log_partitions
    timed_out, other = same_partition_ids(count)
    p = partition_of(timed_out, count)
    with (
        ThreadSidecar(pulsar, txn_sweep_interval_ms=100) as a,
        ThreadSidecar(pulsar, txn_sweep_interval_ms=600_000) as b,
        httpx.Client(base_url=a.url, timeout=60) as api_a,
        httpx.Client(base_url=b.url, timeout=60) as api_b,
    ):
        # on A: a transaction that times out in 2 s (A owns the partition)
        pid, epoch = init_txn(api_a, timed_out, transactionTimeoutMs=2000)
        body = {"transactionalId": timed_out, "batches": [batch(uniq("d"), pid, 0, 1, epoch=epoch)]}
        assert api_a.post("/v1/produce", json=body).json()["results"][0]["errorCode"] == 0
        # a client of another id of the same partition goes to B: B takes it over
        init_txn(api_b, other)
        b_writer = b.runtime.transactions.state.parts._parts[p].writer.name
        assert b_writer in log_writers(b, p)
        # A's sweep sees the timeout in what it last read; B (sweeping rarely) owns it
        time.sleep(3.5)
        assert log_writers(b, p) == [b_writer], "a sweep of A took the partition back from B"
        assert api_b.get(f"/v1/transactions/{timed_out}").json()["state"] == "Ongoing"
        # B, the owner, times it out at its own sweep
        b.call(b.runtime.transactions.sweep())
        assert api_b.get(f"/v1/transactions/{timed_out}").json()["state"] != "Ongoing"
        assert log_writers(b, p) == [b_writer]
