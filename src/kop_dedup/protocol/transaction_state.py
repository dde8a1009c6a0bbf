"""The state of one transactional id, as pure data (Kafka's ``TransactionState`` and
the fields of ``TransactionMetadata``); the transitions are in
:mod:`kop_dedup.protocol.transactions`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "HISTORY",
    "SHARED",
    "Completed",
    "Offset",
    "Partition",
    "PartitionEnd",
    "Transaction",
    "TxnState",
]


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        """A decision is durable and being applied."""
        return self in _PREPARING

    @property
    def complete(self) -> bool:
        return self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def open(self) -> bool:
        """Ongoing or decided but not yet applied: listed by ``GET /v1/transactions``."""
        return self is TxnState.ONGOING or self.preparing

    @property
    def commits(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)


_PREPARING = frozenset(
    {TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE}
)


@dataclass(frozen=True, slots=True)
class Partition:
    """A data partition the transaction wrote to, and where its batches lie in the
    partition's journal: after ``journal_start`` (a position at or before the journal's
    last entry when the partition joined; None: the journal was empty) and, once
    decided, up to ``journal_end``. ``data_start`` is a position at or before the data
    partition's last entry at the decision: what a recovery counts lies after it.

    ``batches`` is what the decision must copy: how many of the transaction's batches
    the journal holds in ``(journal_start, journal_end]``, each batch counted once (by
    producer id and base sequence: a batch the broker journaled twice is one batch).
    ``journal_end`` is then a real entry of the journal (the last batch's receipt, or a
    barrier the decider wrote after it), never a position a broker lookup guessed.
    None: a decision written by a version before the count (its end may be a lookup's
    guess; see the copier).

    ``journaler`` says which sidecar journaled the partition's batches: the instance
    that joined it, or :data:`SHARED` once another one journaled a batch too (None:
    unknown, a record written before the field existed). Only the sole journaler may
    copy from its local copy of the batches; anyone else reads the journal.

    ``unresolved``: the copy there cannot complete as decided (see
    :attr:`Transaction.unresolved`). ``dropped``: nothing more is copied there (an
    operator aborted the partition's part of a commit whose copy could not complete:
    ``kafka-transactions abort``)."""

    topic: str
    partition: int
    journal_start: str | None
    journal_end: str | None = None
    data_start: str | None = None
    journaler: str | None = None
    batches: int | None = None
    dropped: bool = False
    unresolved: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition


@dataclass(frozen=True, slots=True)
class PartitionEnd:
    """What a commit decision records of one partition (see :class:`Partition`)."""

    journal_end: str | None
    data_start: str | None
    batches: int | None


SHARED = "*"
"""``Partition.journaler`` once more than one sidecar journaled the partition's batches."""


@dataclass(frozen=True, slots=True)
class Offset:
    """A consumer-group offset staged in the transaction (sendOffsetsToTransaction)."""

    group: str
    topic: str
    partition: int
    offset: int
    metadata: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return self.group, self.topic, self.partition


@dataclass(frozen=True, slots=True)
class Completed:
    """A complete transaction a token named: what a late request naming it is answered
    from."""

    token: str
    ordinal: int
    committed: bool


HISTORY = 16
"""Complete transactions with a token remembered per transactional id."""


@dataclass(frozen=True, slots=True)
class Transaction:
    """What the coordinator knows of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    ordinal: int = 0
    """The current (or last) transaction's number for this transactional id."""
    partitions: tuple[Partition, ...] = ()
    offsets: tuple[Offset, ...] = ()
    started_ms: int = 0
    """When the current transaction began (its timeout counts from there)."""
    updated_ms: int = 0
    check_back_url: str | None = None
    check_backs: int = 0
    """Times the application was asked about this (timed-out) transaction."""
    in_doubt: bool = False
    """Timed out with a check-back URL: the producer is fenced and the application is
    asked whether to commit."""
    version: int = 0
    """Bumped by the coordinator on every write: a reader keeps the highest."""
    last_producer_id: int = -1
    """The producer id before the last init (KIP-360: a retried init is recognised)."""
    last_producer_epoch: int = -1
    """The epoch the last init replaced when its caller named it, else -1 (KIP-360)."""
    token: str | None = None
    """The transaction token its first request bound (None: none was given)."""
    history: tuple[Completed, ...] = ()
    """Earlier transactions that had a token, oldest first (at most :data:`HISTORY`)."""
    unresolved: str | None = None
    """Why the decision's copy cannot complete (the journal no longer holds what the
    decision counted, or the broker forgot the copy's name and the data partition
    holds part of it): set by the sidecar applying it, which keeps retrying and never
    completes a commit in part; None once resolved or complete."""

    def partition(self, topic: str, partition: int) -> Partition | None:
        return next((p for p in self.partitions if p.key == (topic, partition)), None)

    def stuck(self, part: Partition) -> bool:
        """Whether the copy into ``part`` cannot complete as decided: the transaction is
        ``unresolved`` there (or anywhere, for a record that names no partition)."""
        if self.unresolved is None or part.dropped:
            return False
        return part.unresolved or not any(p.unresolved for p in self.partitions)
