"""An abort marker an operator sends for one partition (WriteTxnMarkers, what
``kafka-transactions abort`` sends to the partition's leader): what it does to the
transaction of its producer id, as pure data.

A transaction's records reach a data partition only when its commit is copied there, so
the one thing a partition can be held by is a commit decided whose copy has not
completed (it holds the partition's last stable offset). An abort marker for it:

- drops the partition from the commit when its copy there cannot complete as decided
  (``unresolved``: what ``kafka-transactions find-hanging`` reports): nothing more is
  copied there, and the rest of the commit completes;
- is refused with CONCURRENT_TRANSACTIONS (51) while the copy is still expected to
  complete (the coordinator finishes it), and for an Ongoing transaction that wrote to
  the partition (its producer or its timeout ends it; nothing of it is there yet);
- is INVALID_PRODUCER_EPOCH (47) for an epoch older than the transaction's, as Kafka
  answers a marker of a fenced epoch;
- does nothing otherwise (no transaction of that producer holds the partition: Kafka
  writes such a marker and nothing is aborted by it). A commit marker is never taken
  from outside: INVALID_TXN_STATE (48).

>>> from kop_dedup.protocol.transaction_state import Partition, Transaction, TxnState
>>> stuck = Transaction("app", 7, 0, 60_000, TxnState.PREPARE_COMMIT,
...                     partitions=(Partition("t", 0, None),), unresolved="2 of 3 batches")
>>> abort_marker(stuck, 7, 0, "t", 0).partitions[0].dropped
True
>>> abort_marker(stuck, 8, 0, "t", 0) is stuck
True
"""

from __future__ import annotations

from dataclasses import replace

from kop_dedup import errors
from kop_dedup.protocol.transaction_state import Transaction, TxnState

__all__ = ["abort_marker"]


def abort_marker(
    txn: Transaction, producer_id: int, producer_epoch: int, topic: str, partition: int
) -> Transaction:
    """``txn`` after an abort marker of (``producer_id``, ``producer_epoch``) for
    ``topic``-``partition`` (``txn`` itself: nothing to do); raises the marker's Kafka
    error (see the module docstring)."""
    if txn.producer_id != producer_id or producer_epoch > txn.producer_epoch:
        return txn  # no transaction of that producer id and epoch is known here
    if producer_epoch < txn.producer_epoch:
        raise errors.InvalidProducerEpoch(
            f"epoch {producer_epoch} of producer {producer_id} is older than its "
            f"transaction's ({txn.producer_epoch})"
        )
    part = txn.partition(topic, partition)
    if txn.state is TxnState.PREPARE_COMMIT and part is not None and not part.dropped:
        if not txn.stuck(part):
            raise errors.ConcurrentTransactions(
                f"transaction {txn.ordinal} of {txn.transactional_id!r} is being copied into "
                f"{topic}-{partition}: its coordinator completes it"
            )
        dropped = tuple(replace(p, dropped=True) if p is part else p for p in txn.partitions)
        return replace(txn, partitions=dropped)
    if txn.state is TxnState.ONGOING and part is not None:
        raise errors.ConcurrentTransactions(
            f"transaction {txn.ordinal} of {txn.transactional_id!r} is open: its producer or "
            "its timeout ends it"
        )
    return txn
