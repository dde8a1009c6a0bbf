"""What a commit copies into each data partition: counted when it is decided, found
again, exactly as counted, when it is copied.

The decision records, per partition, how many batches the journal holds for the
transaction (:attr:`Partition.batches`) up to a real end entry
(:meth:`CopySource.decision_end`): from the local copy (:mod:`.local_copy`) when this
sidecar journaled every batch of the partition and kept them all (the end is the last
batch's receipt), else a journal barrier is written (its receipt is the end) and the
range up to it is read by position. A batch is counted once: batches are told apart by
producer id and base sequence, and the first in journal order is kept (a batch the
broker journaled twice, after losing its deduplication state, is one batch), the same
way when counting and when copying.

The copy (:meth:`CopySource.batches`) takes the local copy when it holds exactly that
many batches, else reads the journal by position to the decision's end; finding any
other number, it raises :class:`CopyUnresolved` and nothing is copied: a journal read
that came back short (its end guessed by a lookup, its ledgers trimmed by retention
while the decision waited) can never complete a commit in part. Decisions written
before the count (no ``batches``) are read to a barrier written when they are copied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.transactions.journal import PROP_TXN_ORDINAL, Journal
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import Partition, Transaction
from kop_dedup.pulsar.entries import RangeNotReached, read_batches
from kop_dedup.pulsar.message_ids import (
    EntryPosition,
    decode_entry_position,
    encode_entry_position,
)
from kop_dedup.pulsar.tables import PulsarClient
from kop_dedup.pulsar.wire import PROP_PRODUCER_ID

__all__ = ["CopySource", "CopyUnresolved", "distinct"]


def distinct(stored: Iterable[tuple[EntryPosition, KafkaBatch]]) -> list[KafkaBatch]:
    """The batches in journal (position) order, each once: a batch (producer id, base
    sequence) met again later is the same batch journaled twice, and is dropped.

    >>> from kop_dedup.protocol.records import rec
    >>> b = lambda seq: KafkaBatch("t", 0, 7, 0, seq, seq, (rec(b"x"),))
    >>> [x.base_sequence for x in distinct([((5, 2), b(1)), ((5, 0), b(0)), ((5, 1), b(0))])]
    [0, 1]
    """
    seen: set[tuple[int, int]] = set()
    out = []
    for _, batch in sorted(stored, key=lambda pb: pb[0]):
        key = (batch.producer_id, batch.base_sequence)
        if key not in seen:
            seen.add(key)
            out.append(batch)
    return out


class CopyUnresolved(errors.KafkaStorageError):
    """What a decision must copy cannot be found as it was counted (the journal holds
    another number of the transaction's batches, or cannot be read to the decision's
    end; the broker forgot the copy's name and the data partition holds part of it).
    Nothing is copied and the decision stays undone: retried, and reported.
    ``partitions``: the (topic, partition) keys it concerns, where known."""

    def __init__(self, message: str = "", partitions: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__(message)
        self.partitions = partitions


class CopySource:
    """Counts a partition's batches for a decision and finds them again for its copy."""

    def __init__(
        self,
        client: PulsarClient,
        journal: Journal,
        *,
        local: LocalCopy | None = None,
        instance: str = "",
    ) -> None:
        self._client, self._journal = client, journal
        self.local = local if local is not None else LocalCopy(0)
        self.instance = instance
        """This sidecar's name in ``Partition.journaler``: whose local copy counts."""

    def _picks(self, txn: Transaction) -> Callable[[Mapping[str, str]], bool]:
        """Whether a journaled or copied record is the transaction's: its producer id
        (one transactional id's alone) and ordinal."""
        pid, ordinal = str(txn.producer_id), str(txn.ordinal)
        return lambda p: p.get(PROP_PRODUCER_ID) == pid and p.get(PROP_TXN_ORDINAL) == ordinal

    def _kept(
        self, txn: Transaction, part: Partition, upto: EntryPosition | None = None
    ) -> list[tuple[EntryPosition, KafkaBatch]] | None:
        """The local copy's batches of the partition in its journal range, when this
        sidecar journaled every batch of it and kept them all; else None."""
        if not self.instance or part.journaler != self.instance:
            return None
        kept = self.local.batches(txn.transactional_id, txn.ordinal, part.key)
        if kept is None:
            return None
        after = None if part.journal_start is None else decode_entry_position(part.journal_start)
        return [
            (p, b) for p, b in kept if (after is None or p > after) and (upto is None or p <= upto)
        ]

    async def decision_end(self, txn: Transaction, part: Partition) -> tuple[str | None, int]:
        """What a commit decision records of ``part``: (journal end, batches). From the
        local copy's receipts when it holds every batch; else a barrier is written into
        the journal (its receipt is the end: every batch answered before lies before
        it) and the range up to it is read and counted."""
        kept = self._kept(txn, part)
        if kept is not None:
            end = max(p for p, _ in kept) if kept else None
            return (None if end is None else encode_entry_position(end)), len(distinct(kept))
        end = await self._journal.barrier(part.topic, part.partition)
        found = await self._read_journal(txn, part, end)
        return encode_entry_position(end), len(found)

    async def batches(self, txn: Transaction, part: Partition) -> list[KafkaBatch]:
        """The transaction's batches of ``part`` in journal order, each once: exactly the
        number the decision counted (from the local copy when it holds that many, else
        read from the journal to the decision's end); :class:`CopyUnresolved` when not."""
        if part.batches is None:  # a decision of an older version: count now
            end = await self._journal.barrier(part.topic, part.partition)
            return await self._read_journal(txn, part, end)
        if part.batches == 0:
            return []
        where = f"{part.topic}-{part.partition}"
        if part.journal_end is None:
            raise CopyUnresolved(
                f"transaction {txn.ordinal} of {txn.transactional_id!r}: the decision counts "
                f"{part.batches} batches in {where} but names no journal end"
            )
        upto = decode_entry_position(part.journal_end)
        kept = self._kept(txn, part, upto)
        if kept is not None and len(found := distinct(kept)) == part.batches:
            self.local.hits += 1
            return found
        self.local.misses += 1
        found = await self._read_journal(txn, part, upto)
        if len(found) != part.batches:
            raise CopyUnresolved(
                f"transaction {txn.ordinal} of {txn.transactional_id!r}: the journal of "
                f"{where} holds {len(found)} of its batches in ({part.journal_start}, "
                f"{part.journal_end}], the decision counted {part.batches}; nothing is "
                "copied (a journal trimmed by its retention cannot complete it)"
            )
        return found

    async def journaled_now(self, txn: Transaction, part: Partition) -> list[KafkaBatch]:
        """The transaction's batches of ``part`` journaled so far (a barrier now; each
        batch once): what a check-back shows the application."""
        return await self._read_journal(
            txn, part, await self._journal.barrier(part.topic, part.partition)
        )

    async def _read_journal(
        self, txn: Transaction, part: Partition, upto: EntryPosition
    ) -> list[KafkaBatch]:
        """The transaction's batches in the journal range ``(journal_start, upto]``, each
        once, read by position to ``upto``."""
        try:
            stored = await read_batches(
                self._client,
                self._journal.partition_topic(part.topic, part.partition),
                after=None
                if part.journal_start is None
                else decode_entry_position(part.journal_start),
                upto=upto,
                topic_name=part.topic,
                partition=part.partition,
                select=self._picks(txn),
            )
        except RangeNotReached as exc:
            what = (
                f"transaction {txn.ordinal} of {txn.transactional_id!r}: the journal of "
                f"{part.topic}-{part.partition} could not be read to {upto}"
            )
            if now_ms() - txn.started_ms > self._journal.retention_ms:
                raise CopyUnresolved(f"{what} (older than the journal's retention)") from exc
            raise errors.KafkaStorageError(f"{what}; retrying") from exc
        return distinct((s.position, s.batch) for s in stored)
