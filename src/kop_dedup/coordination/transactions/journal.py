"""Journal topics: where transactional batches wait for the decision.

One journal per data partition, in the sidecar's system namespace (deduplication on):
``txn-journal.<partition>.<topic>``, a partitioned topic of one partition (created
explicitly, whatever the cluster's auto-creation type). Its batches are written
through the idempotent produce path with the producer's own name
(``<prefix>-<producerId>-<epoch>``) and sequences, so a retried transactional batch is
a duplicate like any other. An entry is one message holding the whole batch
(:func:`kop_dedup.pulsar.wire.encode_whole`: only the sidecar reads a journal) and
carries the transaction's id and ordinal, which is how a copy picks a transaction's
batches out of a journal shared by every transactional producer of that partition.
Journals written before that (one message per record) are still read.

A decision that holds no local copy of a partition's batches ends their range with a
**barrier** (:meth:`Journal.barrier`): an empty message this sidecar writes into the
journal through a producer of its own (``<prefix>-barrier-<instance>``). Its receipt is
a real entry after every batch stored before it (the broker appends a topic's entries
in the order it takes them), so a read by position up to it sees every batch the client
was answered for; a broker's lookup of a topic's end can answer an entry no read can
reach (entry -1 of a ledger still empty, or nothing at all), and is only ever used as a
lower bound (a range's start). Barriers carry no producer id or transaction: no read
takes one for a batch.

A journal keeps its records ``journal_retention_minutes`` (a topic-level policy), which
must outlive the longest transaction timeout plus a recovery: a decision whose batches
the journal no longer holds is reported, never completed in part (see the copier).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.bounded import BoundedMap
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.entries import PROP_BARRIER
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.message_ids import (
    EntryPosition,
    decode_entry_position,
    encode_entry_position,
)
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.producers import Publisher, PulsarProducer

__all__ = [
    "NUMBER_BYTES",
    "PROPERTY_BYTES",
    "PROP_TXN_ID",
    "PROP_TXN_ORDINAL",
    "PROP_TXN_PARTITIONS",
    "PROP_TXN_RECORDS",
    "Journal",
    "journal_overhead",
]

log = logging.getLogger(__name__)

_RECENT_S = 30.0
"""How old a position seen in a receipt may be to serve as a lower bound of a topic's end."""

PROP_TXN_ID = "kafka.txn.id"
"""The transactional id: on a journal entry, and on the first record of a copied batch."""
PROP_TXN_ORDINAL = "kafka.txn.ordinal"
"""The transaction's number for its transactional id, on every journaled and copied
record: with the record's producer id (``kafka.producer.id``, one transactional id's
alone) it names the transaction for good."""
PROP_TXN_RECORDS = "kafka.txn.records"
"""On the first record of a copied batch: the transaction's records in this partition
(the audit counts them)."""
PROP_TXN_PARTITIONS = "kafka.txn.partitions"
"""On the first record of a copied batch: how many partitions the transaction wrote to."""

_BARRIER_QUEUE = 1_000


@dataclass(slots=True)
class _Barrier:
    producer: PulsarProducer
    last_used: float = field(default_factory=time.monotonic)


PROPERTY_BYTES = 16
"""What one Pulsar message property costs besides its key and value (protobuf framing)."""
NUMBER_BYTES = 20
"""The longest decimal text of a property holding a number."""


def journal_overhead(transactional_id: str, records: int, *, whole: bool) -> int:
    """Bytes a journal entry of ``records`` records adds to what the batch's own entry
    holds (:func:`kop_dedup.pulsar.wire.entry_size_bound`): the transaction's id and
    ordinal, once for a whole-batch entry, else on every record."""
    per = (
        len(PROP_TXN_ID)
        + len(transactional_id.encode())
        + len(PROP_TXN_ORDINAL)
        + NUMBER_BYTES
        + 2 * PROPERTY_BYTES
    )
    return per if whole else per * records


class Journal:
    def __init__(
        self,
        admin: PulsarAdmin,
        naming: Naming,
        system_namespace: str,
        *,
        publisher: Publisher,
        retention_minutes: int,
        remembered: int = 10_000,
        instance: str = "",
    ) -> None:
        self._admin, self._naming, self._publisher = admin, naming, publisher
        self._instance = instance
        self._barriers: dict[str, _Barrier] = {}
        self._barrier_locks: dict[str, asyncio.Lock] = {}
        self._base = f"persistent://{system_namespace}"
        self._retention = retention_minutes
        self._ready: BoundedMap[tuple[str, int], None] = BoundedMap(remembered)
        """Journals created (with their retention) by this sidecar, the latest ``remembered``."""
        self._seen: BoundedMap[str, tuple[EntryPosition, float]] = BoundedMap(remembered)
        """The last position a receipt showed per topic, and when (the latest ``remembered``)."""

    @property
    def retention_ms(self) -> int:
        """How long a journal keeps its records: older ones may be gone."""
        return self._retention * 60_000

    def topic(self, topic: str, partition: int) -> str:
        """The journal's partitioned topic for a Kafka topic and partition."""
        return f"{self._base}/txn-journal.{partition}.{topic}"

    def partition_topic(self, topic: str, partition: int) -> str:
        return f"{self.topic(topic, partition)}-partition-0"

    async def ensure(self, topic: str, partition: int) -> None:
        """Create the journal (once per sidecar and partition) with its retention."""
        if (topic, partition) in self._ready:
            return
        journal = self.topic(topic, partition)
        await self._admin.ensure_partitioned_topic(journal, 1)
        try:
            await self._admin.set_topic_retention(journal, self._retention)
        except AdminError as exc:  # topic-level policies off: the namespace's retention holds
            log.warning("could not set the retention of %s: %s", journal, exc)
        self._ready[topic, partition] = None

    def note(self, ptopic: str, position: EntryPosition) -> None:
        """A receipt: ``ptopic`` (a journal or data partition topic) holds ``position``."""
        seen = self._seen.get(ptopic)
        if seen is None or position >= seen[0]:
            self._seen[ptopic] = (position, time.monotonic())

    async def recent_end(self, topic: str, partition: int) -> str | None:
        """A position at or before the journal's end now: the last one a receipt showed
        within ``_RECENT_S``, else the admin API's. Whatever is journaled from now on lies
        after it (a lower bound is all a range's start needs; an older one only makes a
        journal read longer)."""
        return await self._recent(self.partition_topic(topic, partition))

    async def recent_data_end(self, topic: str, partition: int) -> str | None:
        """The same for the data partition (where copies look for an earlier copy)."""
        return await self._recent(self._naming.partition_topic(topic, partition))

    async def _recent(self, ptopic: str) -> str | None:
        seen = self._seen.get(ptopic)
        if seen is not None and time.monotonic() - seen[1] < _RECENT_S:
            return encode_entry_position(seen[0])
        end = await self._last(ptopic)
        if end is not None:
            self.note(ptopic, decode_entry_position(end))
        return end

    async def data_last_entry(self, topic: str, partition: int) -> EntryPosition | None:
        """The data partition's last entry now, when the broker names a real one: the
        last message's, or (its current ledger still empty, as after a reload) the last
        entry of the latest ledger that holds any. None: it names none (no ledger, or no
        entry in any: no end a read could reach)."""
        ptopic = self._naming.partition_topic(topic, partition)
        end = await self._last(ptopic)
        if end is None:
            return None
        position = decode_entry_position(end)
        if position[1] >= 0:
            return position
        held = [(ledger, n) for ledger, n in await self._admin.ledgers(ptopic) if n > 0]
        return (held[-1][0], held[-1][1] - 1) if held else None

    async def data_holds_nothing(self, topic: str, partition: int) -> bool:
        """Whether the broker's own count says the data partition holds no entry at all
        (every ledger of it empty, or none)."""
        ptopic = self._naming.partition_topic(topic, partition)
        return all(n == 0 for _, n in await self._admin.ledgers(ptopic))

    async def data_partition_exists(self, topic: str, partition: int) -> bool:
        """Whether the data partition exists now (Pulsar's admin, asked afresh)."""
        return await self._admin.partition_exists(topic, partition)

    async def _last(self, ptopic: str) -> str | None:
        try:
            position = await self._admin.last_position(ptopic)
        except AdminError as exc:
            if exc.status == 404:
                return None
            raise
        return None if position is None else encode_entry_position(position)

    # -- barriers ---------------------------------------------------------------------------

    async def barrier(self, topic: str, partition: int) -> EntryPosition:
        """Write a barrier into the partition's journal and answer its position (a real
        entry, from its receipt): every batch stored in the journal before this call
        lies before it (the broker appends a topic's entries in the order it takes
        them). A failure raises (retriable: nothing depends on a barrier that failed)."""
        ptopic = self.partition_topic(topic, partition)
        lock = self._barrier_locks.setdefault(ptopic, asyncio.Lock())
        async with lock:  # one creation per journal; sends through it need no turn
            pooled = self._barriers.get(ptopic)
            if pooled is None:
                # one name per sidecar instance (the broker keeps a name's state for
                # hours: a name per creation would pile up in each journal's dedup state)
                name = f"{self._naming.producer_prefix}-barrier-{self._instance or 'x'}"
                producer = await self._publisher.create(ptopic, name, capacity=_BARRIER_QUEUE)
                pooled = self._barriers[ptopic] = _Barrier(producer)
        pooled.last_used = time.monotonic()
        try:
            receipt = await pooled.producer.send_marker({PROP_BARRIER: self._instance})
        except Exception as exc:
            if self._barriers.get(ptopic) is pooled:
                del self._barriers[ptopic]
            await pooled.producer.close()
            raise translate(exc, f"writing a barrier into {ptopic}") from exc
        if receipt.duplicate:  # the client numbers a barrier producer's sends on from its mark
            raise errors.KafkaStorageError(f"a barrier into {ptopic} was taken for a duplicate")
        position = (receipt.ledger_id, receipt.entry_id)
        self.note(ptopic, position)
        return position

    async def reap(self, idle_s: float) -> None:
        """Close the barrier producers unused for ``idle_s``."""
        cutoff = time.monotonic() - idle_s
        for ptopic in [t for t, b in self._barriers.items() if b.last_used < cutoff]:
            lock = self._barrier_locks.get(ptopic)
            if lock is not None and lock.locked():
                continue
            pooled = self._barriers.pop(ptopic)
            self._barrier_locks.pop(ptopic, None)
            await pooled.producer.close()

    def barrier_producers(self) -> int:
        return len(self._barriers)

    async def close(self) -> None:
        barriers, self._barriers = self._barriers, {}
        for pooled in barriers.values():
            await pooled.producer.close()
