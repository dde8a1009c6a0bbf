"""Applying a commit: copy a transaction's journaled batches into a data partition,
idempotently under Pulsar's deduplication.

The copy of a transaction's ``i``-th batch in a partition is published through the
producer ``<prefix>-txn-<producerId>-<epoch>`` with the sequence id
``ordinal * 2**32 + i + 1``: deterministic, and growing across the transactions of
a producer id and epoch (their ordinals grow), so a copy replayed after a crash comes
back -1/-1 and the broker's high-water mark for the name says how far a copy got. The
name is per producer id and epoch, not per transaction, because the broker remembers at
most ``brokerDeduplicationMaxNumberOfProducers`` names per topic.

Each copied record keeps the original's properties (producer id, epoch, sequence, key,
headers, timestamp) and gains the transaction's ordinal, which with its producer id
names the transaction; the first record of each batch also carries the transactional
id, the batch's index, the transaction's record count in this partition and its
partition count (what the audit checks a transaction against; once per batch, since a
batch entry is stored whole or not at all). :func:`copy_overhead` is what a copy adds
to a batch's entry: the produce path refuses a batch whose copy could not be stored.

**Every batch verified.** A batch counts as copied only when this copy stored it (a
receipt) or the data partition shows it (read after the decision's data start): the
copy producer's high-water mark, or a -1/-1 receipt, says only that *some* later batch
of the name was stored, and a batch that failed (the broker refused its entry) can sit
below a later one that did not. Such a batch is copied again through a repair producer
of its own (``<prefix>-txn-<pid>-<epoch>-r<ordinal>``, sequence id = index + 1, one
batch at a time), so :meth:`Copier.copy` returns only once every batch of the
partition is in it.

Copy producers stay open between transactions (closed after ``idle_s`` unused, when
this sidecar loses the log partition of the transactional id that used them, or when
a send fails: the next copy then reconnects and takes the broker's high-water mark
again). While open, the producer's high-water mark is kept from the receipts.

The batches come from the local copy (:mod:`.local_copy`) when this sidecar was the
partition's sole journaler and still holds all of them; otherwise from the journal,
read over the range the decision names. Both give the same batches in the same
(journal) order, so a copy begun from memory and finished by a recovery from the
journal gives every batch the same sequence id.

When the broker no longer remembers the name (it forgets a name 360 minutes after it
disconnects), a recovery compares what the data partition already holds after the
decision (the markers) before copying again, and raises the alarm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.coordination.transactions.journal import (
    NUMBER_BYTES,
    PROP_TXN_ID,
    PROP_TXN_ORDINAL,
    PROP_TXN_PARTITIONS,
    PROP_TXN_RECORDS,
    PROPERTY_BYTES,
    Journal,
)
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import Partition, Transaction
from kop_dedup.pulsar.entries import StoredBatch, read_batches
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.message_ids import decode_entry_position
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.producers import BatchReceipt, Publisher, PulsarProducer
from kop_dedup.pulsar.tables import PulsarClient
from kop_dedup.pulsar.wire import PROP_PRODUCER_ID

__all__ = ["PROP_TXN_BATCH", "Copier", "copy_overhead"]

log = logging.getLogger(__name__)

_RECHECK_S = 1.0
"""Before a batch found missing is copied again, the look is made once more after this."""

PROP_TXN_BATCH = "kafka.txn.batch"
"""On the first record of a copied batch: the batch's index among the transaction's in
this partition."""

_ORDINAL_SHIFT = 1 << 32
_MAX_QUEUE = 100_000
_BUSY_WAIT_S = 0.2

CopyStateLost = Callable[[Transaction, Partition, int], None]
"""(transaction, partition, batches already there): the broker forgot the copy's name."""


def copy_sequence_id(ordinal: int, index: int) -> int:
    """The Pulsar sequence id of the copy of a transaction's ``index``-th batch."""
    return ordinal * _ORDINAL_SHIFT + index + 1


def copy_overhead(transactional_id: str, records: int) -> int:
    """Bytes the copy of a batch of ``records`` records adds to what the batch's own
    entry holds (:func:`kop_dedup.pulsar.wire.entry_size_bound`): the ordinal on every
    record, the transaction's facts on the first."""
    per_record = len(PROP_TXN_ORDINAL) + NUMBER_BYTES + PROPERTY_BYTES
    head = len(PROP_TXN_ID) + len(transactional_id.encode()) + PROPERTY_BYTES
    head += sum(
        len(k) + NUMBER_BYTES + PROPERTY_BYTES
        for k in (PROP_TXN_BATCH, PROP_TXN_RECORDS, PROP_TXN_PARTITIONS)
    )
    return records * per_record + head


async def _outcome(future: asyncio.Future[BatchReceipt]) -> BatchReceipt | BaseException:
    try:
        return await future
    except Exception as exc:
        return exc


class CopyIncomplete(errors.KafkaStorageError):
    """A batch of the copy is not in the data partition yet (copied again next time)."""


@dataclass(slots=True)
class _Pooled:
    producer: PulsarProducer
    last: int
    """The broker's high-water mark for the name: at connection, then every receipt."""
    owner: int
    """The log partition of the transactional id that used it last."""
    last_used: float = field(default_factory=time.monotonic)


class Copier:
    def __init__(
        self,
        client: PulsarClient,
        publisher: Publisher,
        naming: Naming,
        journal: Journal,
        *,
        prefix: str,
        on_state_lost: CopyStateLost,
        local: LocalCopy | None = None,
        instance: str = "",
        idle_s: float = 10.0,
    ) -> None:
        self._client, self._publisher, self._naming = client, publisher, naming
        self._journal, self._prefix = journal, prefix
        self._on_state_lost = on_state_lost
        self.local = local if local is not None else LocalCopy(0)
        self.instance = instance
        """This sidecar's name in ``Partition.journaler``: whose local copy counts."""
        self._idle_s = idle_s
        self._pool: dict[tuple[str, str], _Pooled] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.created = 0
        """Copy producers created (reused ones are not counted again)."""

    def _picks(self, txn: Transaction) -> Callable[[Mapping[str, str]], bool]:
        """Whether a journaled or copied record is the transaction's: its producer id
        (one transactional id's alone) and ordinal."""
        pid, ordinal = str(txn.producer_id), str(txn.ordinal)
        return lambda p: p.get(PROP_PRODUCER_ID) == pid and p.get(PROP_TXN_ORDINAL) == ordinal

    async def journaled(self, txn: Transaction, part: Partition) -> list[StoredBatch]:
        """The transaction's batches in the partition's journal, in order."""
        if part.journal_end is None:
            return []
        return await read_batches(
            self._client,
            self._journal.partition_topic(part.topic, part.partition),
            after=None if part.journal_start is None else decode_entry_position(part.journal_start),
            upto=decode_entry_position(part.journal_end),
            topic_name=part.topic,
            partition=part.partition,
            select=self._picks(txn),
        )

    async def batches(self, txn: Transaction, part: Partition) -> list[KafkaBatch]:
        """The transaction's batches of one partition, in journal order: from the local
        copy when it holds them all, else read from the journal."""
        if part.journal_end is None:
            return []
        if self.instance and part.journaler == self.instance:
            kept = self.local.batches(txn.transactional_id, txn.ordinal, part.key)
            if kept is not None:
                self.local.hits += 1
                after = (
                    None
                    if part.journal_start is None
                    else decode_entry_position(part.journal_start)
                )
                upto = decode_entry_position(part.journal_end)
                return [b for p, b in kept if (after is None or p > after) and p <= upto]
        self.local.misses += 1
        return [s.batch for s in await self.journaled(txn, part)]

    async def copy(
        self,
        txn: Transaction,
        part: Partition,
        *,
        recovering: bool,
        owner: int = -1,
        batches: list[KafkaBatch] | None = None,
    ) -> int:
        """Copy the transaction's batches of one partition; return its record count.
        Raises (a Kafka error) when Pulsar fails: calling again is safe. ``owner``: the
        log partition of the transactional id (its copy producers close when this
        sidecar loses it); ``batches``: what :meth:`batches` answered, when known."""
        if batches is None:
            batches = await self.batches(txn, part)
        total = sum(len(b.records) for b in batches)
        if not batches:
            return 0
        ptopic = self._naming.partition_topic(part.topic, part.partition)
        head = batches[0]
        name = f"{self._prefix}-txn-{head.producer_id}-{head.producer_epoch}"
        key = (ptopic, name)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            try:
                pooled = self._pool.get(key)
                if pooled is None:
                    producer = await self._create(ptopic, name, _MAX_QUEUE)
                    self.created += 1
                    pooled = _Pooled(producer, producer.last_sequence_id(), owner)
                    self._pool[key] = pooled
                pooled.owner = owner
                await self._send(txn, part, batches, total, pooled, recovering=recovering)
            except Exception as exc:
                # a failed send may leave a gap behind later ones: reconnect next time
                # and take the broker's high-water mark again
                await self._discard(key)
                raise translate(
                    exc, f"copying transaction {txn.ordinal} of {txn.transactional_id!r}"
                ) from exc
            finally:
                if (pooled := self._pool.get(key)) is not None:
                    pooled.last_used = time.monotonic()
        return total

    async def _send(
        self,
        txn: Transaction,
        part: Partition,
        batches: list[KafkaBatch],
        total: int,
        pooled: _Pooled,
        *,
        recovering: bool,
    ) -> None:
        producer, last = pooled.producer, pooled.last
        present: set[int] = set()
        if recovering and last < 0:
            present = await self._already_copied(txn, part)
            if present:
                self._on_state_lost(txn, part, len(present))
        finished, unsure, highest = await self._send_all(
            txn, batches, total, producer, last, present
        )
        stored = [r for _, r in finished if isinstance(r, BatchReceipt) and not r.duplicate]
        unsure.update(i for i, r in finished if isinstance(r, BatchReceipt) and r.duplicate)
        if stored:
            last_receipt = max(stored, key=lambda r: (r.ledger_id, r.entry_id))
            self._journal.note(producer.topic, (last_receipt.ledger_id, last_receipt.entry_id))
        failure = next((r for _, r in finished if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure
        pooled.last = max(pooled.last, highest)
        if unsure:
            await self._verify(txn, part, batches, total, unsure)

    async def _send_all(
        self,
        txn: Transaction,
        batches: list[KafkaBatch],
        total: int,
        producer: PulsarProducer,
        last: int,
        present: set[int],
    ) -> tuple[list[tuple[int, BatchReceipt | BaseException]], set[int], int]:
        """Send the batches above the mark (nothing more after a failure): (each sent
        batch's outcome, the batches at or below the mark, the highest sequence id sent)."""
        pending: list[tuple[int, asyncio.Future[BatchReceipt]]] = []
        finished: list[tuple[int, BatchReceipt | BaseException]] = []
        below: set[int] = set()
        highest = last
        for index, batch in enumerate(batches):
            sequence_id = copy_sequence_id(txn.ordinal, index)
            if index in present:
                continue
            if sequence_id <= last:
                below.add(index)
                continue
            while pending and producer.room < len(batch.records):
                waited, future = pending.pop(0)
                finished.append((waited, await _outcome(future)))
            if any(isinstance(r, BaseException) for _, r in finished):
                break
            future = producer.send_batch(batch, sequence_id, *self._markers(txn, index, total))
            pending.append((index, future))
            highest = sequence_id
        results = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
        finished.extend(zip((i for i, _ in pending), results, strict=True))
        return finished, below, highest

    @staticmethod
    def _markers(txn: Transaction, index: int, total: int) -> tuple[dict[str, str], dict[str, str]]:
        """(on every record, on the batch's first record) of a copied batch."""
        head = {
            PROP_TXN_ID: txn.transactional_id,
            PROP_TXN_BATCH: str(index),
            PROP_TXN_RECORDS: str(total),
            PROP_TXN_PARTITIONS: str(len(txn.partitions)),
        }
        return {PROP_TXN_ORDINAL: str(txn.ordinal)}, head

    async def _verify(
        self,
        txn: Transaction,
        part: Partition,
        batches: list[KafkaBatch],
        total: int,
        unsure: set[int],
    ) -> None:
        """Make sure the batches this send did not store are in the data partition;
        copy the missing ones again through the repair producer (see the module
        docstring). Raises :class:`CopyIncomplete` when one is still missing."""
        missing = sorted(unsure - await self._already_copied(txn, part))
        if missing:  # once more, later: a copy still being stored, a read cut short
            await asyncio.sleep(_RECHECK_S)
            missing = sorted(set(missing) - await self._already_copied(txn, part))
        if not missing:
            return
        head = batches[0]
        name = f"{self._prefix}-txn-{head.producer_id}-{head.producer_epoch}-r{txn.ordinal}"
        ptopic = self._naming.partition_topic(part.topic, part.partition)
        log.error(
            "transaction %d of %r: batches %s of %d of its copy into %s-%d are missing after "
            "%s (a copy failed below a later one stored; not stored: %s); copying them "
            "again through %s",
            txn.ordinal,
            txn.transactional_id,
            missing,
            len(batches),
            part.topic,
            part.partition,
            part.data_start,
            sorted(unsure),
            name,
        )
        producer = await self._create(ptopic, name, _MAX_QUEUE)
        again = False
        try:
            for index in missing:  # one at a time: a failure leaves nothing stored after it
                batch = batches[index]
                receipt = await producer.send_batch(
                    batch, index + 1, *self._markers(txn, index, total)
                )
                again = again or receipt.duplicate
        finally:
            await producer.close()
        if again and set(missing) - await self._already_copied(txn, part):
            raise CopyIncomplete(
                f"batches of transaction {txn.ordinal} of {txn.transactional_id!r} are not "
                f"in {part.topic}-{part.partition} yet; copying them again"
            )

    async def _create(self, ptopic: str, name: str, capacity: int) -> PulsarProducer:
        """The copy producer; a name still held elsewhere (a copy by a previous owner
        still running) is waited for: both copy the same, the broker keeps one."""
        delay = _BUSY_WAIT_S
        for _ in range(100):
            try:
                return await self._publisher.create(ptopic, name, capacity=capacity)
            except Exception as exc:
                error = translate(exc, f"creating the copy producer {name}")
                if not error.retriable:
                    raise error from exc
                log.info("copy producer %s on %s: %s; retrying", name, ptopic, error.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        return await self._publisher.create(ptopic, name, capacity=capacity)

    # -- the pool of open copy producers ----------------------------------------------------

    def open_producers(self) -> int:
        return len(self._pool)

    async def reap(self) -> None:
        """Close copy producers unused for ``idle_s``, and forget the locks of names no
        copy holds (one whose producer was discarded while its copy held the lock)."""
        cutoff = time.monotonic() - self._idle_s
        for key in [k for k, p in self._pool.items() if p.last_used < cutoff]:
            if not self._locks[key].locked():
                await self._discard(key)
        for key in [k for k, lock in self._locks.items() if k not in self._pool]:
            if not self._locks[key].locked():
                del self._locks[key]

    async def release(self, owner: int) -> None:
        """This sidecar lost log partition ``owner``: close its idle copy producers now,
        so the new owner can create them (the broker allows one producer per name)."""
        for key in [k for k, p in self._pool.items() if p.owner == owner]:
            if not self._locks[key].locked():
                await self._discard(key)

    async def close(self) -> None:
        for key in list(self._pool):
            await self._discard(key)

    async def _discard(self, key: tuple[str, str]) -> None:
        pooled = self._pool.pop(key, None)
        lock = self._locks.get(key)
        if lock is not None and not lock.locked():
            del self._locks[key]
        if pooled is not None:
            await pooled.producer.close()

    async def _already_copied(self, txn: Transaction, part: Partition) -> set[int]:
        """Indexes of this transaction's batches already in the data partition (read after
        the position it had at the decision)."""
        end = await self._journal.data_end(part.topic, part.partition)
        if end is None:
            return set()
        copies = await read_batches(
            self._client,
            self._naming.partition_topic(part.topic, part.partition),
            after=None if part.data_start is None else decode_entry_position(part.data_start),
            upto=decode_entry_position(end),
            topic_name=part.topic,
            partition=part.partition,
            select=self._picks(txn),
        )
        return {int(c.properties.get(PROP_TXN_BATCH, -1)) for c in copies}
