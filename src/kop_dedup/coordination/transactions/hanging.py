"""An operator's abort of a hanging transaction in one partition (WriteTxnMarkers, what
``kafka-transactions abort`` sends): found by its producer id, changed by the owner of
its transaction-log partition (:func:`kop_dedup.protocol.transaction_markers.abort_marker`
decides), and its commit applied again at once without the partition.

>>> tid = await holder(state, 7)
>>> await abort_partition(state, applier, tid, producer_id=7, producer_epoch=0, topic="t",
...                       partition=0)
"""

from __future__ import annotations

import logging

from kop_dedup import errors
from kop_dedup.coordination.transactions.applier import TransactionApplier
from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.protocol.transaction_markers import abort_marker
from kop_dedup.protocol.transactions import Transaction

__all__ = ["abort_partition", "holder"]

log = logging.getLogger(__name__)


async def holder(state: TransactionStateManager, producer_id: int) -> str | None:
    """The transactional id holding ``producer_id``, from the log caught up now (None:
    no transaction of that producer is known)."""
    await state.read_all()
    found = next((t for t in state if t.producer_id == producer_id), None)
    return None if found is None else found.transactional_id


async def abort_partition(
    state: TransactionStateManager,
    applier: TransactionApplier,
    tid: str,
    *,
    producer_id: int,
    producer_epoch: int,
    topic: str,
    partition: int,
) -> None:
    """Abort (``producer_id``, ``producer_epoch``)'s transaction (of ``tid``: see
    :func:`holder`) in ``topic``-``partition``; raises its Kafka error (NOT_COORDINATOR
    on a node that does not coordinate it)."""
    if not state.owned(state.partition_of(tid)):
        raise errors.NotCoordinator(f"transactional id {tid!r} is coordinated by another node")

    async def decide(current: Transaction | None) -> Transaction | None:
        if current is None:
            return None
        return abort_marker(current, producer_id, producer_epoch, topic, partition)

    before = state.get(tid)
    after = await state.change(tid, decide, take=False)
    if after is None or before is None or after.partitions == before.partitions:
        return
    log.warning(
        "transaction %d of %r: aborted in %s-%d by an operator (its copy could not "
        "complete: %s); nothing more is copied there, the rest of the commit completes",
        after.ordinal,
        tid,
        topic,
        partition,
        after.unresolved,
    )
    applier.wake(tid)
