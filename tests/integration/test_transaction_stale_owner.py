"""A transaction coordinator that another node took the log partition from, and that has
not noticed yet (paused past the broker's keep-alive, its next listing still to come),
answers nothing final from what it last read: a decision that writes nothing (a retried
EndTxn, an EndTxn its stale view refuses) is given only from a view proved current,
else NOT_COORDINATOR (16), and the client asks the new owner.

Real broker: two state managers on one log topic stand for two nodes; :func:`take` is
the cluster naming one of them the partition's owner (with no hand-off wait: a takeover
from a live owner, as when a paused node's view of the members is stale)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.transactions import Transaction, TxnState
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming

pytestmark = pytest.mark.integration

TID = "stale-owner-tid"
PID = 4242


async def _nothing(_p: int, _orphan: bool) -> None:
    return None


async def _managers(pulsar: Any, topic: str) -> list[tuple[Any, PulsarAdmin, Any]]:
    out = []
    for _ in range(2):
        client = pulsar_async.Client(
            pulsar.service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error)
        )
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        settings = TxnSettings(log_partitions=1, handoff_wait_s=0)
        manager = TransactionStateManager(client, admin, topic, settings, _nothing, lambda _p: None)
        if not out:  # creates the topic
            await manager.start()
        out.append((client, admin, manager))
    return out


async def take(manager: TransactionStateManager) -> None:
    """The cluster names ``manager``'s node the owner of partition 0: it loads it,
    fencing a previous owner at once."""
    manager.parts.assign(set())
    manager.parts.assign({0})
    assert await manager.parts.loaded(30), "the partition did not load"


def _setting(txn: Transaction) -> Any:
    async def decide(_current: Transaction | None) -> Transaction:
        return txn

    return decide


def _end(commit: bool) -> Any:
    """The coordinator's EndTxn decision (``TransactionCoordinator._end``) for a producer
    at epoch 0, up to the prepare (the test never gets that far)."""

    async def decide(current: Transaction | None) -> Transaction:
        txn = tx.known(current, TID)
        if tx.check_end(txn, PID, 0, commit) is tx.EndCheck.DONE:
            return txn
        raise AssertionError(f"the decision would be taken on {txn.state}")

    return decide


@pytest.mark.parametrize("commit", [True, False])
def test_a_fenced_coordinator_answers_end_txn_from_a_current_view_or_not_coordinator(
    pulsar, commit
):
    """Node A commits transaction 1 of the id. Node B takes the log partition (A is
    paused: it has not noticed) and begins transaction 2. The client's EndTxn of
    transaction 2 reaches A: from its view (transaction 1 CompleteCommit) A answered 0
    to a commit (transaction 2 then timed out at B and was aborted: a committed
    transaction lost) and 48 to an abort (fatal to the producer), writing nothing. It
    must answer NOT_COORDINATOR, and give the partition up."""
    topic = f"persistent://public/default/stale-txn-owner-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        nodes = await _managers(pulsar, topic)
        (_, _, a), (_, _, b) = nodes
        try:
            await take(a)
            now = now_ms()
            txn = tx.init(
                None, TID, timeout_ms=60_000, check_back_url=None, now_ms=now, new_producer_id=PID
            )
            txn = tx.begin(txn, PID, 0, now_ms=now)
            txn = tx.complete(tx.prepare(txn, True, {}, now_ms=now), now_ms=now)
            await a.change(TID, _setting(txn))
            done = await a.change(TID, _end(commit=True))  # a retry, A the owner: 0
            assert done.state is TxnState.COMPLETE_COMMIT
            await take(b)
            second = await b.change(TID, _setting(tx.begin(txn, PID, 0, now_ms=now_ms())))
            assert (second.ordinal, second.state) == (2, TxnState.ONGOING)
            assert a.parts.owned(0), "A noticed the takeover (the test needs it not to)"
            try:
                answer = await a.change(TID, _end(commit))
            except errors.KafkaError as exc:
                answer = exc
            assert isinstance(answer, errors.NotCoordinator), (
                f"the fenced node answered {answer!r} from its stale view"
            )
            assert not a.parts.owned(0), "A still takes itself for the owner"
            assert (await b.read(TID)) == second, "B's transaction changed"
        finally:
            for client, admin, manager in nodes:
                await manager.close()
                await admin.close()
                await client.close()

    asyncio.run(scenario())
