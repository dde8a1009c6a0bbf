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
headers, timestamp) and gains the transaction's markers: its id and ordinal, the
batch's index in it, the transaction's record count in this partition and its
partition count, which is what the audit checks a transaction against.

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

from kop_dedup.coordination.transactions.journal import (
    PROP_TXN_ID,
    PROP_TXN_ORDINAL,
    PROP_TXN_PARTITIONS,
    PROP_TXN_RECORDS,
    Journal,
)
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import Partition, Transaction
from kop_dedup.pulsar.entries import StoredBatch, decode_position, read_batches
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.producers import BatchReceipt, Publisher, PulsarProducer
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["PROP_TXN_BATCH", "Copier"]

log = logging.getLogger(__name__)

PROP_TXN_BATCH = "kafka.txn.batch"
"""On a copied record: the index of its batch among the transaction's in this partition."""

_ORDINAL_SHIFT = 1 << 32
_MAX_QUEUE = 100_000
_BUSY_WAIT_S = 0.2

CopyStateLost = Callable[[Transaction, Partition, int], None]
"""(transaction, partition, batches already there): the broker forgot the copy's name."""


def copy_sequence_id(ordinal: int, index: int) -> int:
    """The Pulsar sequence id of the copy of a transaction's ``index``-th batch."""
    return ordinal * _ORDINAL_SHIFT + index + 1


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
        tid, ordinal = txn.transactional_id, str(txn.ordinal)
        return lambda p: p.get(PROP_TXN_ID) == tid and p.get(PROP_TXN_ORDINAL) == ordinal

    async def journaled(self, txn: Transaction, part: Partition) -> list[StoredBatch]:
        """The transaction's batches in the partition's journal, in order."""
        if part.journal_end is None:
            return []
        return await read_batches(
            self._client,
            self._journal.partition_topic(part.topic, part.partition),
            after=None if part.journal_start is None else decode_position(part.journal_start),
            upto=decode_position(part.journal_end),
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
                after = None if part.journal_start is None else decode_position(part.journal_start)
                upto = decode_position(part.journal_end)
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
        extra = {
            PROP_TXN_ID: txn.transactional_id,
            PROP_TXN_ORDINAL: str(txn.ordinal),
            PROP_TXN_RECORDS: str(total),
            PROP_TXN_PARTITIONS: str(len(txn.partitions)),
        }
        pending: list[asyncio.Future[BatchReceipt]] = []
        receipts: list[BatchReceipt] = []
        highest = last
        for index, batch in enumerate(batches):
            sequence_id = copy_sequence_id(txn.ordinal, index)
            if sequence_id <= last or index in present:
                continue
            while pending and producer.room < len(batch.records):
                receipts.append(await pending.pop(0))
            batch_extra = {**extra, PROP_TXN_BATCH: str(index)}
            pending.append(producer.send_batch(batch, sequence_id, batch_extra))
            highest = sequence_id
        receipts.extend(await asyncio.gather(*pending))
        pooled.last = max(pooled.last, highest)
        stored = [r for r in receipts if not r.duplicate]
        if stored:
            last_receipt = max(stored, key=lambda r: (r.ledger_id, r.entry_id))
            self._journal.note(producer.topic, (last_receipt.ledger_id, last_receipt.entry_id))

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
        """Close copy producers unused for ``idle_s``."""
        cutoff = time.monotonic() - self._idle_s
        for key in [k for k, p in self._pool.items() if p.last_used < cutoff]:
            if not self._locks[key].locked():
                await self._discard(key)

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
            after=None if part.data_start is None else decode_position(part.data_start),
            upto=decode_position(end),
            topic_name=part.topic,
            partition=part.partition,
            select=self._picks(txn),
        )
        return {int(c.properties.get(PROP_TXN_BATCH, -1)) for c in copies}
