"""Applying a commit: copy a transaction's journaled batches into a data partition,
each batch under one identity, complete when every batch has a receipt.

**One identity per batch.** The copy of the ``i``-th batch of transaction ``N`` into
partition ``P`` is published, whoever sends it and however often (this sidecar, another
after a takeover, a retry after a broker restart), through the producer
``<prefix>-txn-<producerId>-<epoch>`` on ``P`` with the sequence id
:func:`copy_sequence_id` ``(N, i)``. The broker's deduplication is per producer name, so
a second copy of a stored batch comes back -1/-1 and nothing lands twice. The name is per
producer id and epoch, not per transaction (the broker remembers at most
``brokerDeduplicationMaxNumberOfProducers`` names per topic); the sequence ids grow across
a name's transactions (their ordinals grow).

**No gap below the broker's mark, so -1/-1 means stored.** The broker answers -1/-1 only
for a sequence id at or below ``highestSequencedPersisted`` of the name (a sequence
above it but at or below ``highestSequencedPushed`` gets an error instead:
apache/pulsar ``MessageDeduplication.isDuplicate`` and
``PersistentTopic.publishMessage``). So a batch answered -1/-1 was stored if no batch of
the name can be missing below a stored one. That holds because:

- every attempt sends *all* of the transaction's batches for ``P``, in index order,
  through one producer, and sends nothing after a send it knows failed (a refusal
  inside the client, such as a too-large entry, is seen before the next batch goes:
  the copier also checks the size bound the produce path checked, and refuses loudly);
- copy producers have **no send timeout**: the C++ client then never fails a pending
  send on its own (pulsar-client-cpp ``ProducerImpl::startSendTimeoutTimer`` arms the
  timer only for a timeout above 0). On a broken connection it reconnects and
  re-sends every pending message, in order (``ProducerImpl::handleCreateProducer``
  -> ``resendMessages``); a send error from the broker, "cannot determine whether the
  message is a duplicate yet" (``MessageDupUnknownException``) included, closes the
  connection, which does the same (``ClientConnection::handleSendError``; only a
  checksum error fails a single message). Pending sends fail only all at once, when
  the producer is closed, fenced, its topic terminated or its backlog quota exceeded
  (``failPendingMessages``), and a copy that sees any failure closes its producer;
- the broker stores a topic's entries in the order it takes them and never stores one
  after a failed one: a failed BookKeeper write makes the managed ledger re-send the
  pending writes, in order, on a new ledger, or fail them all
  (``OpAddEntry.handleAddFailure``); ``PersistentTopic.addFailed`` fences the topic,
  disconnects its producers (which re-send) and resets ``highestSequencedPushed`` to
  what was persisted;
- one copy at a time per producer name on this sidecar (a lock), in increasing
  ordinals (one decision at a time per transactional id, each complete before the
  next begins), and the broker lets one producer hold a name at a time: a copy never
  sends an older sequence id while newer ones are in flight (the C++ client matches a
  receipt against the head of its queue only).

So the copy of ``P`` is complete when every batch has a receipt, stored or -1/-1: no
read decides it. A failure closes the copy producer (failing what is pending) and raises;
the next attempt creates the producer again and sends everything again. Releasing a
log partition (:meth:`Copier.release`) or closing closes its copy producers even while
a copy holds them: that copy fails, and its apply loop finds the log partition gone.

**What to copy is counted by the decision** (:mod:`.copy_source`): per partition, how
many batches the journal holds for the transaction, each batch once, up to a real end
entry. The copy is given exactly that many batches, or nothing is copied
(:class:`~.copy_source.CopyUnresolved`, retried and reported): a commit is never
completed in part.

**The broker forgetting the name** (360 minutes after its last disconnect,
``brokerDeduplicationProducerInactivityTimeoutMinutes``; or at once, on a topic reload,
for a name past the snapshot's cap ``brokerDeduplicationMaxNumberOfProducers``): a copy
producer whose name the broker has no state for (its mark is -1) could store a batch a
second time (a name the broker knows has a mark at or above every copy stored under it:
a mark below the transaction's first sequence id then means none of its copies is
stored). So whenever the mark is -1 the copier counts what the data partition holds of
the transaction after the decision's data start, by position to its last entry (the
name is held by this copier then: nothing more is stored under it meanwhile): none of
it, for a decision younger than the inactivity limit, is a name never used (the copy
goes on); every batch is a complete copy (the alarm raised, nothing stored again); some
of them, or none for an older decision, raise the alarm (``on_state_lost``) and leave the
decision undone.

**A data topic deleted since the decision** is dropped from the copy, as Kafka drops
the markers of a deleted partition: before a copy producer is created the partition is
checked (:mod:`.deleted`), and :class:`~.deleted.PartitionGone` is raised when it no
longer exists (the applier drops the partition and completes the rest).

Each copied record keeps the original's properties (producer id, epoch, sequence, key,
headers, timestamp) and gains the transaction's ordinal; the first record of each batch
also carries the transactional id, the batch's index, the transaction's record count in
this partition and its partition count (what the audit checks a transaction against).
:func:`copy_overhead` is what a copy adds to a batch's entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.transactions.copy_source import CopySource, CopyUnresolved
from kop_dedup.coordination.transactions.deleted import TopicDeletions
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
from kop_dedup.pulsar.message_ids import (
    decode_entry_position,
)
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.producers import BatchReceipt, Publisher, PulsarProducer
from kop_dedup.pulsar.tables import PulsarClient
from kop_dedup.pulsar.wire import entry_size_bound

__all__ = ["PROP_TXN_BATCH", "Copier", "copy_overhead", "copy_sequence_id"]

log = logging.getLogger(__name__)

PROP_TXN_BATCH = "kafka.txn.batch"
"""On the first record of a copied batch: the batch's index among the transaction's in
this partition."""

_ORDINAL_SHIFT = 1 << 32
_MAX_QUEUE = 100_000
_BUSY_WAIT_S = 0.2

CopyStateLost = Callable[[Transaction, Partition, int, int], None]
"""(transaction, partition, batches found in the data partition, batches the decision
counted): the broker forgot the copy's name (see the module docstring)."""


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


class _Stalled(errors.KafkaStorageError):
    """No receipt came for a while: the copy producer is closed and the copy tried again."""


@dataclass(slots=True)
class _Pooled:
    producer: PulsarProducer
    owner: int
    """The log partition of the transactional id that used it last."""
    last_used: float = field(default_factory=time.monotonic)


class Copier(CopySource):
    """Copies a decision's batches into the data partitions (see the module docstring)."""

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
        max_message_bytes: int = 5 * 1024 * 1024,
        forget_after_ms: int = 360 * 60_000,
        stall_s: float = 60.0,
    ) -> None:
        super().__init__(client, journal, local=local, instance=instance)
        self._publisher, self._naming, self._prefix = publisher, naming, prefix
        self._on_state_lost = on_state_lost
        self._idle_s = idle_s
        self._max_message_bytes = max_message_bytes
        self._forget_after_ms = forget_after_ms
        """The broker's ``brokerDeduplicationProducerInactivityTimeoutMinutes``, in ms."""
        self._stall_s = stall_s
        self._pool: dict[tuple[str, str], _Pooled] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._users: dict[tuple[str, str], int] = {}
        """Copies holding or waiting for each lock: a lock is forgotten only with none."""
        self.deletions = TopicDeletions(journal, naming)
        self._released: dict[int, int] = {}
        """Times each log partition was released: a copy that began before gives up."""
        self._closing = False
        self.created = 0
        """Copy producers created (reused ones are not counted again)."""

    # -- copying ------------------------------------------------------------------------------

    async def copy(
        self, txn: Transaction, part: Partition, batches: list[KafkaBatch], *, owner: int = -1
    ) -> int:
        """Copy ``batches`` (what :meth:`batches` answered) into the data partition; return
        their record count once every batch has a receipt. Raises (a Kafka error) when
        anything fails: calling again is safe. ``owner``: the log partition of the
        transactional id (its copy producers close when this sidecar loses it)."""
        if not batches:
            return 0
        self._check_sizes(txn, part, batches)
        total = sum(len(b.records) for b in batches)
        ptopic = self._naming.partition_topic(part.topic, part.partition)
        head = batches[0]
        name = f"{self._prefix}-txn-{head.producer_id}-{head.producer_epoch}"
        key = (ptopic, name)
        released = self._released.get(owner, 0)
        async with self._turn(key):
            pooled = self._pool.get(key)
            try:
                if pooled is None:
                    await self.deletions.check(txn, part)
                    pooled = await self._open(key, owner, released)
                    # -1: the broker has no state for the name (a name it knows has a
                    # mark at or above every copy stored under it): never used, or
                    # forgotten (past its inactivity limit, or past the snapshot's cap
                    # on a reload): what the partition holds tells which
                    if pooled.producer.last_sequence_id() < 0 and await self._count_instead(
                        txn, part, batches
                    ):
                        return total
                pooled.owner = owner
                await self._send_all(txn, batches, total, pooled.producer)
            except BaseException as exc:
                # whatever was pending failed with it: close, so nothing is sent after
                # the failure (the next attempt sends every batch again)
                await self._discard(key, pooled)
                if isinstance(exc, Exception):
                    raise translate(
                        exc, f"copying transaction {txn.ordinal} of {txn.transactional_id!r}"
                    ) from exc
                raise
            finally:
                if pooled is not None:
                    pooled.last_used = time.monotonic()
        return total

    def _check_sizes(self, txn: Transaction, part: Partition, batches: list[KafkaBatch]) -> None:
        """The bound the produce path checked (``admission._too_large``): a copy that
        could be refused for its size is never begun (a refused batch must not be
        followed by the next one)."""
        for index, batch in enumerate(batches):
            n = len(batch.records)
            size = entry_size_bound(batch) + copy_overhead(txn.transactional_id, n)
            if size > self._max_message_bytes:
                message = (
                    f"transaction {txn.ordinal} of {txn.transactional_id!r}: the copy of batch "
                    f"{index} ({n} records) into {part.topic}-{part.partition} could reach "
                    f"{size} bytes, over KOP_DEDUP_PULSAR_MAX_MESSAGE_BYTES "
                    f"({self._max_message_bytes}); the produce path refuses such a batch, so "
                    "the limit changed since it was journaled: raise it again to copy it"
                )
                log.error("%s", message)
                raise errors.MessageTooLarge(message)

    async def _open(self, key: tuple[str, str], owner: int, released: int) -> _Pooled:
        """Create the key's copy producer (no send timeout) and pool it; refused when the
        log partition was released (or the copier closed) since the copy began."""
        ptopic, name = key

        def given_up() -> bool:
            return self._closing or self._released.get(owner, 0) != released

        producer = await self._create(ptopic, name, given_up)
        self.created += 1
        if given_up():
            await producer.close()
            raise errors.NotCoordinator(
                f"copy producer {name} on {ptopic}: this sidecar let its log partition go"
            )
        pooled = self._pool[key] = _Pooled(producer, owner)
        return pooled

    async def _send_all(
        self, txn: Transaction, batches: list[KafkaBatch], total: int, producer: PulsarProducer
    ) -> None:
        """Send every batch in index order, then wait for every receipt. Raises the first
        failure (nothing more is sent after one is known)."""
        pending: list[asyncio.Future[BatchReceipt]] = []
        failed: list[BaseException] = []

        def watch(future: asyncio.Future[BatchReceipt]) -> None:
            if not future.cancelled() and (exc := future.exception()) is not None:
                failed.append(exc)

        waited = 0
        for index, batch in enumerate(batches):
            while producer.room < len(batch.records) and waited < len(pending):
                await self._receipts(pending[waited : waited + 1])
                waited += 1
            future = producer.send_batch(
                batch, copy_sequence_id(txn.ordinal, index), *self._markers(txn, index, total)
            )
            future.add_done_callback(watch)
            pending.append(future)
            # a refusal inside the client (at the flush) has failed the future already:
            # seen before the next batch is sent
            if future.done() and (exc := future.exception()) is not None:
                raise exc
            if failed:
                raise failed[0]
        await self._receipts(pending[waited:])
        stored = [f.result() for f in pending if not f.result().duplicate]
        if stored:
            last = max(stored, key=lambda r: (r.ledger_id, r.entry_id))
            self._journal.note(producer.topic, (last.ledger_id, last.entry_id))

    async def _receipts(self, futures: list[asyncio.Future[BatchReceipt]]) -> None:
        """Until every future is answered; raises the first failure, and
        :class:`_Stalled` when none is answered for ``stall_s``."""
        remaining = set(futures)
        while remaining:
            done, remaining = await asyncio.wait(
                remaining, timeout=self._stall_s, return_when=asyncio.FIRST_EXCEPTION
            )
            if not done:
                raise _Stalled(f"no receipt for {self._stall_s:.0f} s; the copy starts again")
            for future in done:
                if (exc := future.exception()) is not None:
                    raise exc

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

    async def _create(self, ptopic: str, name: str, given_up: Callable[[], bool]) -> PulsarProducer:
        """The copy producer; a name still held elsewhere (a copy by a previous owner
        still running) is waited for: both copy the same batches under the same ids."""
        delay = _BUSY_WAIT_S
        while True:
            try:
                return await self._publisher.create(
                    ptopic, name, capacity=_MAX_QUEUE, send_timeout_ms=0
                )
            except Exception as exc:
                error = translate(exc, f"creating the copy producer {name}")
                if not error.retriable or given_up() or delay > 5.0 * 8:
                    raise error from exc
                log.info("copy producer %s on %s: %s; retrying", name, ptopic, error.message)
                await asyncio.sleep(min(delay, 5.0))
                delay *= 2

    # -- the broker forgot the name ------------------------------------------------------

    def _forgettable(self, txn: Transaction) -> bool:
        """Whether the broker may have forgotten the copy's name since the decision (it
        cannot sooner: every copy of the transaction connected the name after it)."""
        return now_ms() - txn.updated_ms >= self._forget_after_ms

    async def _count_instead(
        self, txn: Transaction, part: Partition, batches: list[KafkaBatch]
    ) -> bool:
        """The broker does not remember the name (held by this copier now, so nothing more
        is stored under it meanwhile): count the transaction's batches in the data
        partition after the decision's data start, by position to its last entry. True
        when every batch is there (complete); False when none is and the decision is
        younger than the broker's inactivity limit (the name was never used: copy);
        raises :class:`CopyUnresolved` (the alarm raised) otherwise: some are there (the
        broker forgot a name it had stored under, as past the snapshot's cap
        ``brokerDeduplicationMaxNumberOfProducers`` on a reload), or none and the name
        may have been forgotten long after its copy."""
        where = f"{part.topic}-{part.partition}"
        end = await self._journal.data_last_entry(part.topic, part.partition)
        if end is None:
            if not self._forgettable(txn) and await self._journal.data_holds_nothing(
                part.topic, part.partition
            ):
                return False  # nothing stored under any name: a name never used
            raise errors.KafkaStorageError(
                f"{where} names no last entry to count transaction {txn.ordinal} of "
                f"{txn.transactional_id!r} up to; retrying"
            )
        stored: list[StoredBatch] = await read_batches(
            self._client,
            self._naming.partition_topic(part.topic, part.partition),
            after=None if part.data_start is None else decode_entry_position(part.data_start),
            upto=end,
            topic_name=part.topic,
            partition=part.partition,
            select=self._picks(txn),
        )
        present = {int(s.properties.get(PROP_TXN_BATCH, -1)) for s in stored}
        count = len(present & set(range(len(batches))))
        if not stored and not self._forgettable(txn):
            return False
        self._on_state_lost(txn, part, count, len(batches))
        if count == len(batches) and len(stored) == len(batches):
            return True
        raise CopyUnresolved(
            f"transaction {txn.ordinal} of {txn.transactional_id!r}: the broker forgot the copy "
            f"producer's name on {where} and the partition holds {len(stored)} copies of "
            f"{count} of its {len(batches)} batches; copying again could store some twice: "
            "left undone (see brokerDeduplicationProducerInactivityTimeoutMinutes)"
        )

    # -- the pool of open copy producers ----------------------------------------------------

    @contextlib.asynccontextmanager
    async def _turn(self, key: tuple[str, str]) -> AsyncIterator[None]:
        """The key's lock (one copy at a time per producer name), counted while held or
        waited for, so that :meth:`reap` never forgets a lock a copy waits on."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key]

    def open_producers(self) -> int:
        return len(self._pool)

    async def reap(self) -> None:
        """Close copy producers unused for ``idle_s`` (and idle journal barriers), and
        forget the locks of names no copy holds."""
        cutoff = time.monotonic() - self._idle_s
        for key in [k for k, p in self._pool.items() if p.last_used < cutoff]:
            if key not in self._users:
                await self._discard(key)
        for key in [k for k in self._locks if k not in self._pool and k not in self._users]:
            del self._locks[key]
        await self._journal.reap(self._idle_s)

    async def release(self, owner: int) -> None:
        """This sidecar lost log partition ``owner``: close its copy producers now, those a
        copy is using too (that copy fails; its apply loop finds the partition gone), so
        the new owner can create them (the broker allows one producer per name)."""
        self._released[owner] = self._released.get(owner, 0) + 1
        for key in [k for k, p in self._pool.items() if p.owner == owner]:
            await self._discard(key)

    @contextlib.asynccontextmanager
    async def deleting(self, topic: str) -> AsyncIterator[None]:
        """Around the deletion of a Kafka topic (``topic``: its full name): its copy
        producers close first (a copy using one fails and is tried again) and none opens
        until the block ends (:mod:`.deleted`)."""
        async with self.deletions.deleting(topic):
            prefix = f"{topic}-partition-"
            for key in [k for k in self._pool if k[0].startswith(prefix)]:
                await self._discard(key)
            yield

    async def close(self) -> None:
        self._closing = True
        for key in list(self._pool):
            await self._discard(key)

    async def _discard(self, key: tuple[str, str], pooled: _Pooled | None = None) -> None:
        """Close the key's pooled producer (``pooled``: only if it is still that one)."""
        current = self._pool.get(key)
        if current is not None and (pooled is None or current is pooled):
            del self._pool[key]
        target = pooled if pooled is not None else current
        if target is not None:
            await target.producer.close()
