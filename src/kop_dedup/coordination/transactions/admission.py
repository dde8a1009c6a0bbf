"""Transactional produce admission: which batches may be journaled, into which
transaction, and the partitions they join to it.

A transactional batch is checked against its transactional id (producer id 49, epoch
47), its partition joined to the transaction (which begins one if none is open: 51
while a decision is being applied), then journaled through the idempotent produce
path, where every idempotence rule holds. Answer 0 means durably journaled; visible
once the transaction commits.

A batch is refused whole (10 MESSAGE_TOO_LARGE, the limit named) when its journal entry
or its copy into the data partition could exceed the broker's maxMessageSize: the
transaction's markers count (:func:`.copier.copy_overhead`,
:func:`.journal.journal_overhead`), so a batch answered 0 can always be copied. A
malformed batch (87, 10), a topic name that is invalid (17) or a partition that does not
exist (3) is refused before its partition joins: such a batch joins nothing. (A batch
the sequence rules refuse at journal time, 45 or 47, has joined its partition already:
the transaction then holds a partition with nothing of it journaled.)

A join names this sidecar the partition's journaler (and opens a local copy of its
batches); one another sidecar joined is marked shared. Joins of one id run one at a
time: the batches of a transaction's first round arrive together, and the join
running takes the partitions the others wait for too.

An end-txn waits for the same id's produce requests in flight on this sidecar, and
holds new ones until the decision is durable (:meth:`ProduceAdmission.deciding`):
every batch answered 0 here is in the decision. (A batch in flight on *another*
sidecar is not waited for: a Kafka client sends EndTxn once every produce was
answered.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.transactions.copier import copy_overhead
from kop_dedup.coordination.transactions.journal import (
    PROP_TXN_ID,
    PROP_TXN_ORDINAL,
    Journal,
    journal_overhead,
)
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.coordination.transactions.requests import ProduceAnswer
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.records import KafkaBatch, check_shape
from kop_dedup.protocol.transactions import SHARED, Partition, Transaction, TxnState
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.message_ids import EntryPosition
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.pulsar.wire import entry_size_bound

__all__ = ["Journaler", "ProduceAdmission"]

log = logging.getLogger(__name__)

Journaled = tuple[errors.KafkaError | None, str | None]
"""(the error, or None when stored; the first record's position when known)."""
Journaler = Callable[[KafkaBatch, float, str, dict[str, str]], Awaitable[Journaled]]
"""Writes one batch (deadline, journal partition topic, record properties) through the
idempotent produce path, which answers and counts it."""
PartKey = tuple[str, int]


def _not_added(txn: Transaction, key: PartKey) -> errors.KafkaError | None:
    """Why a batch for ``key`` may not be journaled without joining its partition."""
    if txn.state is TxnState.ONGOING and txn.partition(*key) is not None:
        return None
    if txn.state.preparing:
        return errors.ConcurrentTransactions(
            f"transaction {txn.ordinal} of {txn.transactional_id!r} is {txn.state.value}: "
            "retry once it is complete"
        )
    return errors.InvalidTxnState(
        f"{key[0]}-{key[1]} is not in a transaction of {txn.transactional_id!r}: add it "
        "(AddPartitionsToTxn) before producing to it"
    )


def _position(message_id: str) -> EntryPosition:
    """(ledger, entry) of a receipt's ``ledger:entry:partition:batch``."""
    ledger, entry, *_ = message_id.split(":")
    return int(ledger), int(entry)


class _Gate:
    """One transactional id's produce requests in flight on this sidecar, and the
    end-txn calls deciding it: an end-txn waits until none is in flight, and a produce
    arriving meanwhile waits for the decision (then it is refused, 51, or joins the
    next transaction)."""

    __slots__ = ("_event", "ending", "inflight", "joining", "wanted")

    def __init__(self) -> None:
        self.inflight = 0
        self.ending = 0
        self._event = asyncio.Event()
        self.joining = asyncio.Lock()
        """Held around a join of partitions (see ``produce``)."""
        self.wanted: dict[PartKey, str | None] = {}
        """Partitions requests of the id wait to join, with their requests' tokens."""

    def wake(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def changed(self, within: float | None) -> None:
        """Until the next change, or ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), within)

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and self.ending == 0


class ProduceAdmission:
    def __init__(
        self,
        state: TransactionStateManager,
        journal: Journal,
        local: LocalCopy,
        instance: str,
        journaler: Journaler,
        partitions_of: Callable[[str], Awaitable[int]],
        on_busy: Callable[[str, float], Awaitable[bool]],
        settings: TxnSettings,
    ) -> None:
        self._settings = settings
        self._state, self._journal, self._local = state, journal, local
        self._instance, self._journaler, self._partitions_of = instance, journaler, partitions_of
        self._on_busy = on_busy
        """Called with the id when a join met a decision being applied (51): applies it
        and waits for it, at most the given seconds; True once it is applied here."""
        self._gates: dict[str, _Gate] = {}

    def gates(self) -> int:
        """Transactional ids with a produce or an end-txn in flight here."""
        return len(self._gates)

    # -- the gate ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def deciding(self, transactional_id: str) -> AsyncIterator[None]:
        """Around an end-txn's decision: waits for the id's produce requests in flight
        here, and holds new ones until it is over."""
        gate = self._gates.setdefault(transactional_id, _Gate())
        gate.ending += 1
        try:
            while gate.inflight:
                await gate.changed(None)
            yield
        finally:
            gate.ending -= 1
            self._settle(transactional_id, gate)

    def _settle(self, transactional_id: str, gate: _Gate) -> None:
        gate.wake()
        if gate.idle and self._gates.get(transactional_id) is gate:
            del self._gates[transactional_id]

    # -- produce ----------------------------------------------------------------------------

    async def produce(
        self,
        transactional_id: str,
        batches: Sequence[KafkaBatch],
        deadline: float,
        token: str | None = None,
        *,
        join: bool = True,
    ) -> list[ProduceAnswer]:
        """Journal transactional batches; one answer per batch, in order (see the
        module docstring). ``token``: the transaction they belong to (48 when it is not
        the open one: :func:`kop_dedup.protocol.transactions.check_token`).
        ``join=False``: a batch for a partition not in the ongoing transaction is
        refused, 48 INVALID_TXN_STATE (51 while a decision is applied), instead of
        joining it (Kafka's transactions v1 with partition verification: the client
        adds partitions with AddPartitionsToTxn before it produces to them)."""
        gate = self._gates.setdefault(transactional_id, _Gate())
        while gate.ending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                late = errors.RequestTimedOut(
                    f"an end-txn of {transactional_id!r} is deciding; retry (it is safe)"
                )
                return [ProduceAnswer(late) for _ in batches]
            await gate.changed(remaining)
        gate.inflight += 1
        try:
            return await self._produce(transactional_id, batches, deadline, gate, token, join)
        finally:
            gate.inflight -= 1
            self._settle(transactional_id, gate)

    async def _produce(
        self,
        transactional_id: str,
        batches: Sequence[KafkaBatch],
        deadline: float,
        gate: _Gate,
        token: str | None,
        join: bool,
    ) -> list[ProduceAnswer]:
        try:
            txn = tx.known(await self._state.read(transactional_id), transactional_id)
        except errors.KafkaError as exc:
            return [ProduceAnswer(exc) for _ in batches]
        try:
            tx.check_token(txn, token)
            elsewhere = None
        except errors.KafkaError as exc:
            elsewhere = exc
        refused: list[ProduceAnswer | None] = []
        wanted: dict[PartKey, str | None] = {}
        for batch in batches:
            key = (batch.topic, batch.partition)
            problem = (
                tx.producer_problem(
                    txn, transactional_id, batch.producer_id, batch.producer_epoch, on_produce=True
                )
                or elsewhere
                or self._too_large(transactional_id, batch)
                or await self._unfit(batch)
            )
            if problem is None and not join:
                problem = _not_added(txn, key)
            refused.append(None if problem is None else ProduceAnswer(problem))
            # only an ongoing transaction's partitions are joined already: one being
            # decided or applied (it may complete before the join below) is not this
            # batch's transaction, and every partition must join the next one; a
            # partition another sidecar joined is marked shared first (its local copy
            # there no longer holds every batch)
            if problem is None and not self._joined(txn, txn, key, token):
                wanted[key] = token
        if wanted:
            try:
                txn = await self._join_wanted(transactional_id, txn, wanted, gate, token)
            except Exception as exc:  # a log write that failed (Pulsar away): a Kafka code
                error = translate(
                    exc, f"adding partitions to the transaction of {transactional_id!r}"
                )
                return [r or ProduceAnswer(error) for r in refused]
        return await self._journal_all(transactional_id, txn, batches, refused, deadline)

    async def _join_wanted(
        self,
        transactional_id: str,
        txn: Transaction,
        wanted: dict[PartKey, str | None],
        gate: _Gate,
        token: str | None,
    ) -> Transaction:
        """One join at a time per id: the batches of a transaction's first round arrive
        together; the join running takes the partitions the others wait for too
        (``gate.wanted``), and they find their partitions joined."""
        gate.wanted.update(wanted)
        try:
            async with gate.joining:
                now = self._state.get(transactional_id)
                keys = [k for k in wanted if not self._joined(now, txn, k, token)]
                if not keys and now is not None:
                    return now
                also = [k for k, t in gate.wanted.items() if t == token]
                return await self.join(
                    transactional_id,
                    txn.producer_id,
                    txn.producer_epoch,
                    keys,
                    also=also,
                    token=token,
                )
        finally:
            for key in wanted:
                gate.wanted.pop(key, None)

    async def _journal_all(
        self,
        transactional_id: str,
        txn: Transaction,
        batches: Sequence[KafkaBatch],
        refused: list[ProduceAnswer | None],
        deadline: float,
    ) -> list[ProduceAnswer]:
        extra = {PROP_TXN_ID: transactional_id, PROP_TXN_ORDINAL: str(txn.ordinal)}
        pending = {
            i: self._journaler(
                b, deadline, self._journal.partition_topic(b.topic, b.partition), extra
            )
            for i, b in enumerate(batches)
            if refused[i] is None
        }
        results = dict(zip(pending, await asyncio.gather(*pending.values()), strict=True))
        answers = []
        for i, batch in enumerate(batches):
            answer = refused[i]
            if answer is None:
                error, message_id = results[i]
                self._keep(transactional_id, txn.ordinal, batch, error, message_id)
                answer = ProduceAnswer(error, message_id, counted=True)
            answers.append(answer)
        return answers

    async def _unfit(self, batch: KafkaBatch) -> errors.KafkaError | None:
        """87 or 10 for a malformed batch, 17 or 3 when its topic or partition cannot
        exist: checked before the partition joins, so a batch the journal would refuse
        for these joins nothing (Kafka's AddPartitionsToTxn answers 3 for a partition
        that does not exist)."""
        s = self._settings
        try:
            check_shape(batch, max_records=s.max_batch_records, max_bytes=s.max_batch_bytes)
            validate_topic(batch.topic)
            count = await self._partitions_of(batch.topic)
        except errors.KafkaError as exc:
            return exc
        if 0 <= batch.partition < count:
            return None
        return errors.UnknownTopicOrPartition(
            f"topic {batch.topic!r} has partitions 0..{count - 1}; got {batch.partition}"
        )

    def _too_large(self, transactional_id: str, batch: KafkaBatch) -> errors.KafkaError | None:
        """MESSAGE_TOO_LARGE when the batch's journal entry or copy could outgrow the
        broker's limit once the transaction's markers are on it."""
        limit = self._settings.max_message_bytes
        n = len(batch.records)
        whole = self._settings.journal_whole_batches
        markers = max(
            copy_overhead(transactional_id, n),
            journal_overhead(transactional_id, n, whole=whole),
        )
        size = entry_size_bound(batch) + markers
        if size <= limit:
            return None
        return errors.MessageTooLarge(
            f"with the transaction's markers ({markers} bytes for {n} records and a "
            f"{len(transactional_id)}-character transactionalId) the batch's copy could reach "
            f"{size} bytes; the broker takes at most {limit} "
            "(KOP_DEDUP_PULSAR_MAX_MESSAGE_BYTES): split it"
        )

    def _joined(
        self, now: Transaction | None, seen: Transaction, key: PartKey, token: str | None
    ) -> bool:
        """Whether the partition is in the ongoing transaction of the producer ``seen``
        (the one ``token`` names, when given) and needs no change in the log (this
        sidecar or many journal it)."""
        if now is None or now.state is not TxnState.ONGOING:
            return False
        if token is not None and now.token != token:
            return False
        if (now.producer_id, now.producer_epoch) != (seen.producer_id, seen.producer_epoch):
            return False
        part = now.partition(*key)
        return part is not None and part.journaler in (self._instance, SHARED)

    def _keep(
        self,
        transactional_id: str,
        ordinal: int,
        batch: KafkaBatch,
        error: errors.KafkaError | None,
        message_id: str | None,
    ) -> None:
        """Keep a journaled batch in the local copy; spoil the copy when the answer
        leaves in doubt whether the journal holds a batch the copy does not."""
        if error is None and message_id is not None:
            position = _position(message_id)
            self._local.add(transactional_id, ordinal, batch, position)
            self._journal.note(
                self._journal.partition_topic(batch.topic, batch.partition), position
            )
        elif not (
            isinstance(error, errors.DuplicateSequenceNumber)
            and self._local.holds(transactional_id, ordinal, batch)
        ):
            self._local.spoil(transactional_id, ordinal, (batch.topic, batch.partition))

    # -- joining partitions ------------------------------------------------------------------

    async def _also(self, keys: Sequence[PartKey], also: Sequence[PartKey]) -> list[PartKey]:
        """The partitions other requests wait to join that can be joined now."""
        extra = []
        for topic, partition in [k for k in also if k not in keys]:
            try:
                await self._partitions_of(topic)
                await self._journal.ensure(topic, partition)
            except Exception as exc:  # the waiting request meets it itself
                log.debug("not joining %s-%d for another request: %r", topic, partition, exc)
                continue
            extra.append((topic, partition))
        return extra

    async def _joining(
        self,
        txn: Transaction,
        producer_id: int,
        epoch: int,
        keys: Sequence[PartKey],
        opened: list[PartKey],
        token: str | None,
    ) -> Transaction:
        """The transaction with ``keys`` joined (``opened``: those new to it)."""
        now = now_ms()
        for topic, partition in keys:
            joined = txn.partition(topic, partition) if txn.state is TxnState.ONGOING else None
            start = None
            if joined is None:
                start = await self._journal.recent_end(topic, partition)
            txn = tx.join(
                txn,
                producer_id,
                epoch,
                Partition(topic, partition, start, journaler=self._instance),
                now_ms=now,
                token=token,
            )
            if joined is None:
                opened.append((topic, partition))
            elif joined.journaler not in (self._instance, SHARED):
                txn = tx.share(txn, topic, partition)
        return txn

    async def join(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        keys: Sequence[PartKey],
        also: Sequence[PartKey] = (),
        token: str | None = None,
    ) -> Transaction:
        """Join the partitions to the open transaction (beginning one if none is open),
        decided against the latest state: a partition is skipped only when the
        transaction it is in is ongoing; a producer fenced meanwhile is refused (47).
        ``also``: partitions other requests of the id wait to join, read when the
        decision is taken; joined too when they can be (each is the waiting request's
        own business otherwise). ``token``: the transaction meant (48 for another)."""
        for topic, partition in keys:
            await self._partitions_of(topic)  # the data topic exists (auto-created) first
            await self._journal.ensure(topic, partition)
        opened: list[PartKey] = []

        async def decide(current: Transaction | None) -> Transaction:
            txn = tx.known(current, transactional_id)
            opened.clear()
            extra = await self._also(keys, also)
            return await self._joining(txn, producer_id, epoch, [*keys, *extra], opened, token)

        try:
            txn = await self._state.change(transactional_id, decide)
        except errors.ConcurrentTransactions:
            # the previous decision is still being applied (usually here, for a few ms):
            # wait for it and decide again rather than send the client into its backoff
            if not await self._on_busy(transactional_id, self._settings.busy_wait_s):
                raise
            txn = await self._state.change(transactional_id, decide)
        # local copies for the partitions this sidecar just joined (no await since the
        # write: no batch of theirs was journaled yet)
        for key in opened:
            part = txn.partition(*key)
            if part is not None and part.journaler == self._instance:
                self._local.open(txn.transactional_id, txn.ordinal, key)
        return txn
