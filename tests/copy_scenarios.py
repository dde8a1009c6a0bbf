"""In-process scenarios of a transaction's copy against the real broker (for
tests/integration/test_transaction_copy_identity.py): a sidecar's runtime run around a
scenario, transactions journaled and decided but not applied, the copier of a sidecar
that takes over, and what a data partition stores."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kop_dedup.coordination.transactions.copier import PROP_TXN_BATCH, Copier
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.coordination.transactions.requests import EndTxn, InitProducerId
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.protocol.transactions import Partition, Transaction, TxnState
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from tests.helpers import read_all

__all__ = [
    "NS",
    "another",
    "batches_of",
    "decide",
    "decide_without_local_copy",
    "run",
    "stored",
    "values",
]

NS = "persistent://public/kafka"


def run(settings: Settings, scenario: Callable[[Runtime], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        runtime = Runtime(settings)
        await runtime.start()
        await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        try:
            return await scenario(runtime)
        finally:
            await runtime.close()

    return asyncio.run(main())


def batches_of(topic: str, pid: int, epoch: int, sizes: list[int]) -> list[KafkaBatch]:
    """Batches of ``sizes`` records into partition 0, values ``pid:epoch:sequence``."""
    out, seq = [], 0
    for n in sizes:
        records = tuple(rec(f"{pid}:{epoch}:{seq + j}".encode()) for j in range(n))
        out.append(KafkaBatch(topic, 0, pid, epoch, seq, seq + n - 1, records))
        seq += n
    return out


async def decide(
    runtime: Runtime,
    tid: str,
    batches: Callable[[int, int], list[KafkaBatch]],
    between: Callable[[int, int], Awaitable[None]] | None = None,
) -> tuple[Transaction, Partition]:
    """Journal the batches as one transaction, then commit it (decided, not applied)."""
    coordinator = runtime.transactions
    ids = await coordinator.init_producer_id(InitProducerId(tid))
    pid, epoch = ids.producer_id, ids.producer_epoch
    for batch in batches(pid, epoch):
        [answer] = await coordinator.produce(tid, [batch], time.monotonic() + 30)
        assert answer.error is None, answer
        if between is not None:
            await between(pid, epoch)
    await coordinator.end(EndTxn(tid, pid, epoch, commit=True))
    txn = await coordinator.describe(tid)
    assert txn is not None
    assert txn.state is TxnState.PREPARE_COMMIT
    return txn, txn.partitions[0]


def another(runtime: Runtime, *, lost: list[Any] | None = None, **kw: Any) -> Copier:
    """The copier of a sidecar that did not journal the transaction (a takeover)."""
    mine = runtime.transactions._copier
    return Copier(
        runtime.publisher.client,
        runtime.publisher,
        runtime.naming,
        mine._journal,
        prefix=kw.pop("prefix", runtime.settings.producer_name_prefix),
        on_state_lost=lambda *a: (lost if lost is not None else []).append(a),
        local=LocalCopy(1 << 20),
        instance="another-sidecar",
        **kw,
    )


def stored(client: Any, topic: str) -> list[tuple[str, str | None]]:
    """(value, batch index on a batch's first record) of each record, in topic order."""
    return [
        (m.data().decode(), m.properties().get(PROP_TXN_BATCH))
        for m in read_all(client, f"{NS}/{topic}-partition-0")
    ]


def values(pid: int, epoch: int, n: int) -> list[str]:
    return [f"{pid}:{epoch}:{i}" for i in range(n)]


async def decide_without_local_copy(
    runtime: Runtime, tid: str, topic: str, ptopic: str, before_end: Callable[[], None]
) -> Transaction:
    """Journal 3 batches, drop the local copy (as if another sidecar had journaled),
    unload the journal (its ledger rolls), call ``before_end``, then commit."""
    coordinator = runtime.transactions
    ids = await coordinator.init_producer_id(InitProducerId(tid))
    pid, epoch = ids.producer_id, ids.producer_epoch
    answers = await coordinator.produce(
        tid, batches_of(topic, pid, epoch, [1, 2, 2]), time.monotonic() + 30
    )
    assert [a.error for a in answers] == [None, None, None]
    txn = await coordinator.describe(tid)
    assert txn is not None
    coordinator._copier.local.drop(tid, txn.ordinal)
    await runtime.admin.unload(ptopic)
    before_end()
    await coordinator.end(EndTxn(tid, pid, epoch, commit=True))
    decided = await coordinator.describe(tid)
    assert decided is not None
    return decided
