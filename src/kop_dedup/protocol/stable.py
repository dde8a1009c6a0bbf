"""The last stable offset (LSO) of a data partition, as pure rules: where a
read_committed reader must stop so that it never reads past the first record of a
transaction that is not complete in that partition.

A committed transaction reaches a data partition as a *copy*, batch by batch, after
EndTxn was answered (:mod:`kop_dedup.coordination.transactions.copier`). Every copied
record says whose it is (producer id and the transaction's ordinal) and the first
record of each batch says how many records the transaction has in the partition and
the batch's index (:class:`CopyMark`). So a reader that reads a partition in order can
tell, from the data alone, whether a copy it met is whole in what it read:
:class:`StableTracker` counts each copy's records (each batch once, by its index) and
answers the LSO for what it has read: the first offset of the earliest copy not whole
yet, else the end of what it read. Plain records (no mark) are stable when read.

Two things the data cannot tell, the transaction log can (:func:`copy_settled`): a copy
whose beginning the reader did not see (it started inside it: its count cannot close,
and it may have begun before the reader's start, so it holds the LSO at the start),
and a copy whose count never closes (data written by a build that copied a batch
twice under two names, say). The reader asks the log about such a copy; once the log
says the transaction is complete, the copy is *settled*: it still holds the LSO until
the reader has read on to the end of what the partition held when the log said so
(:meth:`StableTracker.drained`), so the LSO never lands inside it.

A partition nobody reads in order (ListOffsets, a group's lag) gets a tracker of its
own that starts where the log says no copy in progress can have begun before
(:mod:`kop_dedup.coordination.transactions.stable`).

>>> t = StableTracker(start=0)
>>> t.feed(0, 2, None, (1, 0))                                  # plain records
>>> t.feed(2, 1, CopyMark(7, 1, CopyHead("app", 0, 2)), (1, 1))  # batch 0 of 2 records
>>> t.lso, t.end
(2, 3)
>>> t.feed(3, 1, CopyMark(7, 1, CopyHead("app", 1, 2)), (1, 2))  # batch 1: whole
>>> t.lso
4
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kop_dedup.protocol.transaction_state import Transaction, TxnState

__all__ = [
    "ASK_AFTER_S",
    "CopyHead",
    "CopyKey",
    "CopyMark",
    "EntryId",
    "OpenCopy",
    "StableTracker",
    "copy_settled",
]

EntryId = tuple[int, int]
"""A stored entry: (ledger, entry). A batch is one entry, stored whole or not at all."""
CopyKey = tuple[int, int]
"""A transaction: (producer id, ordinal)."""

ASK_AFTER_S = 1.0
"""A copy seen from its beginning is asked of the log once it has held the LSO this
long (one in progress completes by itself; one whose count never closes would hold
the partition for good)."""
_DONE_KEPT = 1024
"""Copies found whole that a tracker remembers, so that a batch stored again later (a
build before the one-identity copy could do that) does not open them again."""


@dataclass(frozen=True, slots=True)
class CopyHead:
    """What the first record of a copied batch says besides its transaction."""

    transactional_id: str | None
    batch: int
    """The batch's index among the transaction's batches in this partition."""
    records: int
    """The transaction's records in this partition."""


@dataclass(frozen=True, slots=True)
class CopyMark:
    """The copy a stored record (or the piece of an entry read) belongs to."""

    producer_id: int
    ordinal: int
    head: CopyHead | None = None
    """Present when the piece starts with its batch's first record."""

    @property
    def key(self) -> CopyKey:
        return self.producer_id, self.ordinal


@dataclass(slots=True)
class OpenCopy:
    """A copy met and not whole yet in what the reader read."""

    key: CopyKey
    first: int
    """The offset of its first record the reader saw."""
    since: float
    """When the reader first met it (the caller's clock)."""
    from_start: bool
    """The first record seen was its batch 0's: the reader saw it from its beginning."""
    transactional_id: str | None = None
    records: int | None = None
    """Its records in the partition, as its batches' first records say (the largest)."""
    seen: int = 0
    """Its records read, each batch counted once (only batches whose first record was
    read: a piece without it cannot be told from a second copy of the batch)."""
    settled: int | None = None
    """The log says it is complete: the tracker's read count when it said so."""
    asked: bool = False
    """The log was asked about it at least once."""
    _batches: dict[int, EntryId] = field(default_factory=dict)
    _entries: set[EntryId] = field(default_factory=set)

    @property
    def whole(self) -> bool:
        return self.records is not None and self.seen >= self.records

    def add(self, count: int, head: CopyHead | None, entry: EntryId) -> None:
        if head is None:
            if entry in self._entries:  # the rest of a batch whose first record was read
                self.seen += count
            return
        if head.transactional_id is not None:
            self.transactional_id = head.transactional_id
        self.records = head.records if self.records is None else max(self.records, head.records)
        if head.batch in self._batches:  # the same batch stored again: counted once
            return
        self._batches[head.batch] = entry
        self._entries.add(entry)
        self.seen += count


class StableTracker:
    """The LSO of what one reader of a partition has read, fed every piece it reads in
    offset order (see the module docstring)."""

    def __init__(self, start: int) -> None:
        self.start = start
        """Where the reader began: a copy met without its beginning may have begun
        before, so it holds the LSO here."""
        self.end = start
        """The offset after the last record fed."""
        self._open: dict[CopyKey, OpenCopy] = {}
        self._done: OrderedDict[CopyKey, None] = OrderedDict()
        self._reads = 0

    def feed(
        self, offset: int, count: int, mark: CopyMark | None, entry: EntryId, now: float = 0.0
    ) -> None:
        """A piece read: ``count`` records from ``offset``, all of one entry (``mark``:
        the copy they belong to, None for plain records)."""
        self.end = max(self.end, offset + count)
        if mark is None or mark.key in self._done:
            return
        copy = self._open.get(mark.key)
        if copy is None:
            head = mark.head
            copy = OpenCopy(mark.key, offset, now, head is not None and head.batch == 0)
            self._open[mark.key] = copy
        copy.add(count, mark.head, entry)
        if copy.whole:
            self._close(mark.key)

    def bound(self, copy: OpenCopy) -> int:
        """Where ``copy`` holds the LSO: its first record when the reader saw it from its
        beginning, else where the reader began."""
        return copy.first if copy.from_start else min(copy.first, self.start)

    @property
    def lso(self) -> int:
        """The last stable offset of what was read: records below it are stable."""
        return min((self.bound(c) for c in self._open.values()), default=self.end)

    @property
    def holding(self) -> bool:
        """Whether a copy holds the LSO below the end of what was read."""
        return bool(self._open)

    def open_copies(self) -> list[OpenCopy]:
        """The copies holding the LSO, the earliest first."""
        return sorted(self._open.values(), key=lambda c: (self.bound(c), c.first))

    def to_ask(self, now: float, after_s: float = ASK_AFTER_S) -> list[OpenCopy]:
        """The open copies to ask the log about, earliest first: those the reader did
        not see from their beginning, and those open for ``after_s`` or more (a copy
        in progress closes by itself); not those settled already."""
        return [
            c
            for c in self.open_copies()
            if c.settled is None and (not c.from_start or now - c.since >= after_s)
        ]

    def settle(self, key: CopyKey) -> None:
        """The log says the copy's transaction is complete: it no longer waits for its
        records, but holds the LSO until a read begun after now found the partition's
        end (:meth:`drained`)."""
        copy = self._open.get(key)
        if copy is not None and copy.settled is None:
            copy.settled = self._reads

    @property
    def settling(self) -> bool:
        """Whether a copy the log settled waits for a read that finds the end."""
        return any(c.settled is not None for c in self._open.values())

    def reading(self) -> int:
        """A read of the partition begins: its token for :meth:`drained`."""
        self._reads += 1
        return self._reads

    def drained(self, token: int) -> None:
        """The read of ``token`` found nothing more: every copy settled before it began
        is whole in what was read."""
        for key in [
            k for k, c in self._open.items() if c.settled is not None and c.settled < token
        ]:
            self._close(key)

    def _close(self, key: CopyKey) -> None:
        self._open.pop(key, None)
        self._done[key] = None
        self._done.move_to_end(key)
        if len(self._done) > _DONE_KEPT:
            self._done.popitem(last=False)


def copy_settled(txn: Transaction | None, producer_id: int, ordinal: int) -> bool:
    """Whether the copy of transaction (``producer_id``, ``ordinal``) is complete, given
    its transactional id's state as the log has it now (None: the id is unknown, so
    long expired): only a PrepareCommit of that very transaction is still copying. A
    transactional id holding another producer id has moved on (a new producer id is
    only handed out once the last transaction is complete)."""
    if txn is None or txn.producer_id != producer_id or txn.ordinal != ordinal:
        return txn is None or txn.producer_id != producer_id or txn.ordinal > ordinal
    return txn.state is not TxnState.PREPARE_COMMIT and txn.state is not TxnState.ONGOING
