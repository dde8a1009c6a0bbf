"""The local copy of journaled transactional batches (double journaling's "local data
copy"): what a commit copies from memory instead of reading the journal back.

A partition's entry is opened when this sidecar joins the partition to a transaction
(and names itself the partition's journaler in the transaction log); every batch the
journal then stores (answer 0, with its position) is kept in it. An entry is usable
only while it is *complete*: it holds every batch of the transaction that the journal
may hold. It stops being complete (:meth:`LocalCopy.spoil`) when a batch's answer
leaves that in doubt (a failure after the batch was handed to Pulsar may have stored
it; a duplicate this copy does not hold was stored earlier). An entry that is missing
(never opened here, evicted, or the sidecar restarted) reads as unknown, and the copy
reads the journal instead: batches are only ever added to an open entry, so a
partition evicted half-way cannot look complete later.

Memory is bounded in bytes (``KOP_DEDUP_TXN_LOCAL_COPY_MAX_BYTES``) and in transactions
(``KOP_DEDUP_TXN_LOCAL_COPY_MAX_TRANSACTIONS``): past either bound the least recently
used transactions are evicted whole. 0 bytes keeps nothing (every copy reads the
journal). An entry is dropped when this sidecar completes its transaction, and by the
coordinator's sweep once the log shows it complete elsewhere (:meth:`LocalCopy.kept`).

>>> from kop_dedup.protocol.records import KafkaBatch, rec
>>> local = LocalCopy(max_bytes=1 << 20)
>>> local.open("app", 1, ("orders", 0))
>>> local.add("app", 1, KafkaBatch("orders", 0, 7, 0, 0, 0, (rec(b"x"),)), (5, 0))
>>> [(p, b.base_sequence) for p, b in local.batches("app", 1, ("orders", 0)) or []]
[((5, 0), 0)]
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.pulsar.message_ids import EntryPosition

__all__ = ["LocalCopy"]

PartKey = tuple[str, int]
"""(topic, partition) of the data partition."""

_BATCH_OVERHEAD = 200
_RECORD_OVERHEAD = 100
"""Rough bytes a kept batch and record cost beyond their payload (objects, tuples)."""


def _cost(batch: KafkaBatch) -> int:
    return _BATCH_OVERHEAD + batch.size + _RECORD_OVERHEAD * len(batch.records)


@dataclass(slots=True)
class _Part:
    batches: list[tuple[EntryPosition, KafkaBatch]] = field(default_factory=list)
    complete: bool = True


@dataclass(slots=True)
class _Txn:
    parts: dict[PartKey, _Part] = field(default_factory=dict)
    size: int = 0
    opened: float = field(default_factory=time.monotonic)


class LocalCopy:
    """The batches this sidecar journaled, per transaction and data partition."""

    def __init__(self, max_bytes: int, max_transactions: int = 10_000) -> None:
        self.max_bytes = max_bytes
        self.max_transactions = max_transactions
        self.bytes = 0
        self.hits = 0
        """Copies served from memory."""
        self.misses = 0
        """Copies that had to read the journal (no complete local copy)."""
        self.evicted = 0
        """Transactions evicted under the bounds."""
        self._txns: OrderedDict[tuple[str, int], _Txn] = OrderedDict()

    def open(self, transactional_id: str, ordinal: int, part: PartKey) -> None:
        """This sidecar joined ``part`` to the transaction: keep its batches from now on."""
        if self.max_bytes <= 0:
            return
        txn = self._txns.setdefault((transactional_id, ordinal), _Txn())
        txn.parts.setdefault(part, _Part())
        self._txns.move_to_end((transactional_id, ordinal))
        self._bound()

    def add(
        self, transactional_id: str, ordinal: int, batch: KafkaBatch, position: EntryPosition
    ) -> None:
        """A batch the journal stored at ``position`` (ignored without an open, complete
        entry)."""
        txn = self._txns.get((transactional_id, ordinal))
        entry = None if txn is None else txn.parts.get((batch.topic, batch.partition))
        if txn is None or entry is None or not entry.complete:
            return
        cost = _cost(batch)
        entry.batches.append((position, batch))
        txn.size += cost
        self.bytes += cost
        self._txns.move_to_end((transactional_id, ordinal))
        self._bound()

    def _bound(self) -> None:
        while self._txns and (
            self.bytes > self.max_bytes or len(self._txns) > self.max_transactions
        ):
            _, victim = self._txns.popitem(last=False)
            self.bytes -= victim.size
            self.evicted += 1

    def holds(self, transactional_id: str, ordinal: int, batch: KafkaBatch) -> bool:
        """Whether a complete entry holds this batch (same sequences) already."""
        entry = self._entry(transactional_id, ordinal, (batch.topic, batch.partition))
        return entry is not None and any(
            b.base_sequence == batch.base_sequence and b.last_sequence == batch.last_sequence
            for _, b in entry.batches
        )

    def spoil(self, transactional_id: str, ordinal: int, part: PartKey) -> None:
        """The journal may hold a batch of this partition that the entry does not."""
        txn = self._txns.get((transactional_id, ordinal))
        entry = None if txn is None else txn.parts.get(part)
        if txn is None or entry is None:
            return
        freed = sum(_cost(b) for _, b in entry.batches)
        txn.size -= freed
        self.bytes -= freed
        entry.batches.clear()
        entry.complete = False

    def batches(
        self, transactional_id: str, ordinal: int, part: PartKey
    ) -> list[tuple[EntryPosition, KafkaBatch]] | None:
        """Every batch the journal holds for the transaction in ``part``, in journal
        order; None when this copy cannot say (read the journal)."""
        entry = self._entry(transactional_id, ordinal, part)
        if entry is None:
            return None
        return sorted(entry.batches, key=lambda pb: pb[0])

    def kept(self, older_than_s: float) -> list[tuple[str, int]]:
        """(transactional id, ordinal) of the transactions kept at least that long."""
        cutoff = time.monotonic() - older_than_s
        return [k for k, t in self._txns.items() if t.opened <= cutoff]

    def drop(self, transactional_id: str, ordinal: int) -> None:
        """The transaction is complete: forget its batches."""
        txn = self._txns.pop((transactional_id, ordinal), None)
        if txn is not None:
            self.bytes -= txn.size

    def _entry(self, transactional_id: str, ordinal: int, part: PartKey) -> _Part | None:
        txn = self._txns.get((transactional_id, ordinal))
        entry = None if txn is None else txn.parts.get(part)
        return entry if entry is not None and entry.complete else None

    def to_dict(self) -> dict[str, int]:
        return {
            "transactions": len(self._txns),
            "bytes": self.bytes,
            "maxBytes": self.max_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "evicted": self.evicted,
        }
