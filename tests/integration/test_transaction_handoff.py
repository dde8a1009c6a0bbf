"""A transaction-log partition handed to a new owner after its owner died: whatever the
new owner's load went through, InitProducerId there bumps the epoch the dead owner
handed out (Kafka's coordinator loads the log before it answers: two producers holding
one producer id and epoch would never fence each other).

The load that matters is one cut short: right after a node dies, the survivors list
the members on every forward that fails as well as on their timer; a listing begun
before the death can be published after one begun after it, so a survivor's view moves
the partition to it, away (its load cancelled mid-read), and back. Seen once in the
SIGKILL failover test (tests/integration/test_cluster_faults.py) under load 15-24: the
survivor answered a new producer id at epoch 0 for an id the dead node had initialised.

Real broker: two state managers on one log topic stand for two nodes (as in
tests/integration/test_transaction_stale_owner.py); the dead node's client is closed,
so the broker drops its writer as it does a SIGKILLed node's; the moment the load is
cut short is held by :class:`tests.held_reads.HeldRead`."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.clock import now_ms
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.transactions import Transaction
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from tests.held_reads import HeldRead

pytestmark = pytest.mark.integration

TID = "handoff-tid"


async def _nothing(_p: int, _orphan: bool) -> None:
    return None


def _init(new_producer_id: int) -> Any:
    """The coordinator's InitProducerId decision (``TransactionCoordinator.init_producer_id``
    for an id with nothing open): a new producer id at epoch 0 for an unknown id, else the
    next epoch."""

    async def decide(current: Transaction | None) -> Transaction:
        return tx.init(
            current,
            TID,
            timeout_ms=60_000,
            check_back_url=None,
            now_ms=now_ms(),
            new_producer_id=None if current is not None else new_producer_id,
        )

    return decide


async def _cancelled(manager: TransactionStateManager) -> None:
    """Once the manager's load of partition 0 has ended (its release cancelled it)."""
    loading = manager.parts._parts[0].acquiring
    deadline = asyncio.get_running_loop().time() + 30
    while loading is not None and not loading.done():
        assert asyncio.get_running_loop().time() < deadline, "the load was not cancelled"
        await asyncio.sleep(0.01)


def test_a_load_cut_short_then_taken_again_bumps_the_dead_owners_epoch(pulsar, monkeypatch):
    """Node A owns the partition and initialises the id (producer 7, epoch 0), then dies.
    Node B loads the partition; while its reader holds A's record the load is cancelled
    (B's view moved the partition away), then B is given it again. B's InitProducerId
    must answer producer 7 at epoch 1; before, B's view lacked the id and answered a new
    producer id at epoch 0, which A's producer also held."""
    topic = f"persistent://public/default/txn-handoff-{uuid.uuid4().hex[:8]}"
    held = HeldRead(monkeypatch, key=TID)

    async def scenario() -> None:
        clients, admins, managers = [], [], []
        for _ in range(2):
            clients.append(
                pulsar_async.Client(
                    pulsar.service_url,
                    logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error),
                )
            )
            admins.append(PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop")))
            settings = TxnSettings(log_partitions=1, handoff_wait_s=5)
            managers.append(
                TransactionStateManager(
                    clients[-1], admins[-1], topic, settings, _nothing, lambda _p: None
                )
            )
        a, b = managers
        try:
            await a.start()
            a.parts.assign({0})
            assert await a.parts.loaded(30), "A did not load the partition"
            first = await a.change(TID, _init(7))
            assert (first.producer_id, first.producer_epoch) == (7, 0)
            await clients[0].close()  # A dies: the broker drops its writer

            b.parts.assign({0})
            await held.taken()  # B's load has A's record in its reader's hands
            b.parts.assign(set())  # and B's view moves the partition away mid-load
            await _cancelled(b)
            held.release()
            b.parts.assign({0})
            assert await b.parts.loaded(30), "B did not load the partition again"
            second = await b.change(TID, _init(8))
            assert (second.producer_id, second.producer_epoch) == (7, 1), (first, second)
        finally:
            held.release()
            for manager in managers:
                await manager.close()
            for admin in admins:
                await admin.close()
            for client in clients[1:]:
                await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 90))
