"""The transaction coordinator: decides, persists through the log, then applies.

Every change to a transactional id runs on the owner of its log partition, under the
partition's lock: read the current :class:`Transaction`, ask
:mod:`kop_dedup.protocol.transactions` for the next one, write it (the version bumped),
and only then act on it. Any sidecar serves any transactional id: the first change it
makes takes the partition over (see :mod:`kop_dedup.coordination.partitions`); reads
(``describe``, the checks on a transactional produce) catch up with the log first, so
they see every change made through any sidecar.

The commit protocol (double journaling with a local copy):

1. transactional batches are journaled (:mod:`.journal`) through the idempotent path;
   the first batch for a partition joins it to the transaction, durably, with the
   journal's position at that moment;
2. ``end(commit)`` writes PrepareCommit, naming for each partition the journal's last
   position and the data partition's: the decision point, answered once durable;
3. the decision is applied in the background (:meth:`_apply`): the partitions'
   batches are copied at once (:mod:`.copier`, idempotent; from the local copy of
   what this sidecar journaled, :mod:`.local_copy`, else from the journal), each
   data partition's copies in decision order (:mod:`.ordering`), with the decision
   record for audits written meanwhile; then the staged offsets are committed and
   CompleteCommit written. Abort writes PrepareAbort and copies nothing.

An end-txn waits for the same id's produce requests in flight on this sidecar, and
holds new ones until the decision is durable (:class:`_Gate`): every batch answered 0
here is in the decision. (A batch still in flight on *another* sidecar when end-txn
arrives is not waited for: a Kafka client sends EndTxn only once every produce was
answered.)

A sidecar that takes a partition over (a client call, or an orphan adopted after its
owner went away) recovers it: decisions are applied again (a replayed copy is a
no-op), and open transactions past their timeout are fenced and aborted, or, with a
check-back URL, the application is asked first.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kop_dedup import errors
from kop_dedup.coordination.epochs import EpochRegistry
from kop_dedup.coordination.groups.store import GroupStore, StagedOffset
from kop_dedup.coordination.partitions import StatePartitions
from kop_dedup.coordination.producer_ids import ProducerIdAllocator
from kop_dedup.coordination.transactional_ids import TransactionalIds
from kop_dedup.coordination.transactions import checkback
from kop_dedup.coordination.transactions.copier import Copier
from kop_dedup.coordination.transactions.journal import PROP_TXN_ID, PROP_TXN_ORDINAL, Journal
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.coordination.transactions.log import TransactionView, encode
from kop_dedup.coordination.transactions.ordering import CopyOrder, Ticket
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import SHARED, Offset, Partition, Transaction, TxnState
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.entries import encode_position
from kop_dedup.pulsar.tables import KeyedWriter, PulsarClient

__all__ = ["Journaler", "TransactionCoordinator", "TxnSettings", "TxnStats"]

log = logging.getLogger(__name__)

Answer = tuple[errors.KafkaError | None, str | None]
"""(the error, or None when stored; the first record's position when known)."""
Journaler = Callable[[KafkaBatch, float, str, dict[str, str]], Awaitable[Answer]]
"""Writes one batch (deadline, journal partition topic, record properties) through the
idempotent produce path, which answers and counts it."""


@dataclass(frozen=True, slots=True)
class TxnSettings:
    log_partitions: int = 8
    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 900_000
    check_back_max: int = 15
    check_back_interval_ms: int = 1_000
    """The first wait between two check-backs; it doubles, up to a minute."""
    check_back_timeout_s: float = 5.0
    sweep_interval_s: float = 1.0
    adopt_interval_s: float = 5.0
    retry_interval_s: float = 1.0
    """How soon a decision whose application failed (Pulsar away) is tried again."""
    apply_delay_s: float = 0.0
    """Waits between a decision and its application (fault tests use it to crash there)."""
    expiry_ms: int = 7 * 86_400_000
    decisions_retention_minutes: int = 1440


@dataclass(slots=True)
class TxnStats:
    """What the coordinator did (this sidecar, since start)."""

    commits: int = 0
    aborts: int = 0
    timeouts: int = 0
    fenced: int = 0
    check_backs: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("COMMIT", "ROLLBACK", "UNKNOWN"), 0)
    )
    copy_state_lost: int = 0
    applied_ms: list[float] = field(default_factory=list)
    """Decision to applied, milliseconds (the last 1,000)."""
    local: LocalCopy | None = None
    copier: Copier | None = None

    def applied(self, ms: float) -> None:
        self.applied_ms.append(ms)
        del self.applied_ms[:-1000]

    def to_dict(self) -> dict[str, object]:
        ordered = sorted(self.applied_ms)

        def pct(q: float) -> float | None:
            return round(ordered[int(q * (len(ordered) - 1))], 2) if ordered else None

        return {
            "commits": self.commits,
            "aborts": self.aborts,
            "timeouts": self.timeouts,
            "fenced": self.fenced,
            "checkBacks": dict(self.check_backs),
            "copyStateLost": self.copy_state_lost,
            "appliedMsP50": pct(0.5),
            "appliedMsP99": pct(0.99),
            "localCopy": None if self.local is None else self.local.to_dict(),
            "copyProducers": None
            if self.copier is None
            else {"open": self.copier.open_producers(), "created": self.copier.created},
        }

    def counters(self) -> list[tuple[str, str, Sequence[tuple[Mapping[str, str], float]]]]:
        """Prometheus counter families (see observability.metrics.render)."""
        return [
            (
                "txn_completed_total",
                "Transactions this sidecar applied, by decision.",
                [({"decision": "commit"}, self.commits), ({"decision": "abort"}, self.aborts)],
            ),
            (
                "txn_timeouts_total",
                "Transactions aborted or checked back on timeout.",
                [({}, self.timeouts)],
            ),
            (
                "txn_fenced_total",
                "Open transactions fenced by a new init-producer-id.",
                [({}, self.fenced)],
            ),
            (
                "txn_check_backs_total",
                "Check-backs to applications, by answer.",
                [({"answer": a}, n) for a, n in sorted(self.check_backs.items())],
            ),
            (
                "txn_copy_state_lost_total",
                "Recoveries that found a copy's producer name forgotten by the broker.",
                [({}, self.copy_state_lost)],
            ),
        ]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _position(message_id: str) -> tuple[int, int]:
    """(ledger, entry) of a receipt's ``ledger:entry:partition:batch``."""
    ledger, entry, *_ = message_id.split(":")
    return int(ledger), int(entry)


class _Gate:
    """One transactional id's produce requests in flight on this sidecar, and the
    end-txn calls deciding it: an end-txn waits until none is in flight (a batch
    answered 0 is in the decision), and a produce arriving meanwhile waits for the
    decision (then it is refused, 51, or joins the next transaction)."""

    __slots__ = ("_event", "ending", "inflight", "joining", "wanted")

    def __init__(self) -> None:
        self.inflight = 0
        self.ending = 0
        self._event = asyncio.Event()
        self.joining = asyncio.Lock()
        """Held around a join of partitions (see ``produce``)."""
        self.wanted: dict[tuple[str, int], None] = {}
        """Partitions requests of the id wait to join (an ordered set)."""

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


class TransactionCoordinator:
    def __init__(
        self,
        client: PulsarClient,
        admin: PulsarAdmin,
        *,
        log_topic: str,
        decisions_topic: str,
        journal: Journal,
        copier: Copier,
        offsets: GroupStore,
        allocator: ProducerIdAllocator,
        epochs: EpochRegistry,
        legacy: TransactionalIds,
        journaler: Journaler,
        partitions_of: Callable[[str], Awaitable[int]],
        settings: TxnSettings,
    ) -> None:
        self.settings = settings
        self.stats = TxnStats()
        self._admin, self._journal, self._copier = admin, journal, copier
        self._offsets, self._allocator, self._epochs = offsets, allocator, epochs
        self._legacy, self._journaler, self._partitions_of = legacy, journaler, partitions_of
        self._log_topic, self._decisions_topic = log_topic, decisions_topic
        self.view = TransactionView(settings.log_partitions)
        self.parts = StatePartitions(
            client,
            log_topic,
            settings.log_partitions,
            apply=self.view.apply,
            on_acquired=self._recover,
            on_lost=self._lost,
            writers=lambda: admin.partition_writers(log_topic),
            name="transaction log",
        )
        self._decisions = KeyedWriter(client, f"{decisions_topic}-partition-0")
        self._checkback = checkback.CheckBack(settings.check_back_timeout_s)
        self._applying: dict[str, asyncio.Task[None]] = {}
        self._local, self._instance = copier.local, copier.instance
        self.stats.local, self.stats.copier = copier.local, copier
        self._order = CopyOrder()
        self._gates: dict[str, _Gate] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        count = await self._admin.ensure_partitioned_topic(
            self._log_topic, self.settings.log_partitions
        )
        if count != self.settings.log_partitions:
            raise RuntimeError(
                f"{self._log_topic} has {count} partitions but KOP_DEDUP_TXN_LOG_PARTITIONS "
                f"is {self.settings.log_partitions}; they must agree (a transactional id's "
                "partition is derived from the count)"
            )
        await self._admin.ensure_partitioned_topic(self._decisions_topic, 1)
        try:
            await self._admin.set_topic_retention(
                self._decisions_topic, self.settings.decisions_retention_minutes
            )
        except Exception as exc:  # topic policies off: the namespace's retention holds
            log.warning("could not set the retention of %s: %s", self._decisions_topic, exc)
        self.parts.start(self.settings.adopt_interval_s)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="transaction-sweeper")

    async def close(self) -> None:
        self._closing = True
        tasks = [*self._applying.values(), *self._asking.values()]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._copier.close()
        await self.parts.close()
        await self._decisions.close()
        await self._checkback.close()

    # -- reads ---------------------------------------------------------------------------

    async def describe(self, transactional_id: str) -> Transaction | None:
        p = self.parts.partition_of(transactional_id)
        await self.parts.read(p)
        return self.view.get(p, transactional_id)

    def owned_open(self) -> int:
        """Open transactions in the log partitions this sidecar owns (no I/O)."""
        return sum(
            1
            for p in range(self.settings.log_partitions)
            if self.parts.owned(p)
            for t in self.view.in_partition(p)
            if t.state.open
        )

    async def open_transactions(self) -> list[Transaction]:
        await self.parts.read_all()
        return sorted(
            (t for t in self.view if t.state.open), key=lambda t: (t.started_ms, t.transactional_id)
        )

    # -- changes (on the owner of the id's partition) -----------------------------------------

    async def _change(
        self,
        transactional_id: str,
        decide: Callable[[Transaction | None], Awaitable[Transaction | None]],
    ) -> Transaction | None:
        """Run ``decide`` on the current state as the partition's owner; write what it
        returns (None: no change)."""
        p = self.parts.partition_of(transactional_id)
        for attempt in range(_TAKEOVER_ATTEMPTS):
            async with self.parts.lock(p):
                await self.parts.own(p)
                current = self.view.get(p, transactional_id)
                nxt = await decide(current)
                if nxt is None or nxt == current:
                    return current
                try:
                    return await self._write(p, nxt)
                except errors.NotCoordinator:
                    # another sidecar took the partition meanwhile (two adopting at once,
                    # or a client on each): take it back and decide again on its state
                    if attempt + 1 == _TAKEOVER_ATTEMPTS:
                        raise
        raise errors.NotCoordinator(f"transaction log partition {p} keeps moving; retry")

    async def _write(self, p: int, txn: Transaction) -> Transaction:
        current = self.view.get(p, txn.transactional_id)
        txn = replace(txn, version=(current.version if current else 0) + 1)
        await self.parts.write(p, txn.transactional_id, encode(txn))
        self.view.put(p, txn)
        return txn

    def _lost(self, partition: int) -> None:
        log.info("transaction log partition %d moved to another sidecar", partition)
        if self._closing:
            return  # close() closes every copy producer
        # its copy producers close, so the new owner can create them (one per name)
        task = asyncio.get_running_loop().create_task(self._copier.release(partition))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- init-producer-id -----------------------------------------------------------------

    def check_timeout(self, timeout_ms: int | None) -> int:
        timeout = self.settings.default_timeout_ms if timeout_ms is None else timeout_ms
        if not 0 < timeout <= self.settings.max_timeout_ms:
            raise errors.InvalidTransactionTimeout(
                f"transactionTimeoutMs must be in 1..{self.settings.max_timeout_ms} "
                f"(KOP_DEDUP_MAX_TRANSACTION_TIMEOUT_MS), got {timeout}"
            )
        return timeout

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int | None, check_back_url: str | None
    ) -> tuple[int, int]:
        """The producer id and a new epoch for a transactional id (fencing the previous
        one). An open transaction is fenced and aborted first: CONCURRENT_TRANSACTIONS
        (51) until that abort is complete, as Kafka answers; the client retries."""
        timeout = self.check_timeout(timeout_ms)
        fenced: list[Transaction] = []

        async def decide(current: Transaction | None) -> Transaction | None:
            if current is None:
                current = await self._from_legacy(transactional_id, timeout)
            if current is not None and current.state is TxnState.ONGOING:
                nxt = tx.fence(current, now_ms=_now_ms())
                await self._epochs.raise_to(nxt.producer_id, nxt.producer_epoch)
                fenced.append(nxt)
                return nxt
            new_pid = (
                await self._allocator.allocate() if tx.needs_new_producer_id(current) else None
            )
            nxt = tx.init(
                current,
                transactional_id,
                timeout_ms=timeout,
                check_back_url=check_back_url,
                now_ms=_now_ms(),
                new_producer_id=new_pid,
            )
            if nxt.producer_epoch > 0:  # fence first: once durable, older epochs are refused
                await self._epochs.raise_to(nxt.producer_id, nxt.producer_epoch)
            return nxt

        try:
            txn = await self._change(transactional_id, decide)
        except errors.ConcurrentTransactions:
            self._ensure_applied(transactional_id)
            raise
        if fenced:
            self.stats.fenced += 1
            log.info(
                "fenced transactional id %r at epoch %d: its open transaction %d is aborted",
                transactional_id,
                fenced[0].producer_epoch - 1,
                fenced[0].ordinal,
            )
            self._ensure_applied(transactional_id)
            raise errors.ConcurrentTransactions(
                f"transaction {fenced[0].ordinal} of {transactional_id!r} was open: it is being "
                "aborted and its producer fenced; retry init-producer-id"
            )
        if txn is None:  # decide always answers for init; a None here is a bug
            raise errors.KafkaError(f"init-producer-id of {transactional_id!r} decided nothing")
        return txn.producer_id, txn.producer_epoch

    async def _from_legacy(self, transactional_id: str, timeout_ms: int) -> Transaction | None:
        """An id a sidecar before transactions initialised (the ``transactional-ids``
        table): keep its producer id, so its next epoch still fences the old one."""
        known = await self._legacy.lookup(transactional_id)
        if known is None:
            return None
        return Transaction(transactional_id, known[0], known[1], timeout_ms)

    # -- transactional produce ------------------------------------------------------------

    async def produce(
        self, transactional_id: str, batches: Sequence[KafkaBatch], deadline: float
    ) -> list[tuple[Answer, bool]]:
        """Journal transactional batches (answer 0: durably journaled, not visible yet).

        Checks each batch's producer id and epoch against the transactional id's (49,
        47), joins new partitions to the transaction (which starts one if none is
        open; 51 while a decision is applied), then journals them through the
        idempotent path, where every idempotence rule holds. Each answer says whether
        the produce path answered (and counted) it, or the coordinator refused it first.

        While an end-txn of the same id decides on this sidecar, the batches wait for
        the decision; an end-txn waits for the batches in flight here (see :class:`_Gate`).
        """
        gate = self._gates.setdefault(transactional_id, _Gate())
        while gate.ending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                late = errors.RequestTimedOut(
                    f"an end-txn of {transactional_id!r} is deciding; retry (it is safe)"
                )
                return [((late, None), False) for _ in batches]
            await gate.changed(remaining)
        gate.inflight += 1
        try:
            return await self._produce(transactional_id, batches, deadline, gate)
        finally:
            gate.inflight -= 1
            self._settle_gate(transactional_id, gate)

    def _settle_gate(self, transactional_id: str, gate: _Gate) -> None:
        gate.wake()
        if gate.idle and self._gates.get(transactional_id) is gate:
            del self._gates[transactional_id]

    async def _produce(
        self, transactional_id: str, batches: Sequence[KafkaBatch], deadline: float, gate: _Gate
    ) -> list[tuple[Answer, bool]]:
        p = self.parts.partition_of(transactional_id)
        await self.parts.read(p)
        txn = self.view.get(p, transactional_id)
        answers: list[Answer | None] = [None] * len(batches)
        wanted: dict[tuple[str, int], KafkaBatch] = {}
        for i, batch in enumerate(batches):
            problem = self._producer_problem(transactional_id, txn, batch)
            if problem is not None:
                answers[i] = (problem, None)
            elif (
                txn is None
                or txn.state is not TxnState.ONGOING
                or (part := txn.partition(batch.topic, batch.partition)) is None
                or part.journaler not in (self._instance, SHARED)
            ):
                # only an ongoing transaction's partitions are joined already: one being
                # decided or applied (it may complete before the join below) is not this
                # batch's transaction, and every partition must join the next one; a
                # partition another sidecar joined is marked shared first (its local
                # copy there no longer holds every batch)
                wanted.setdefault((batch.topic, batch.partition), batch)
        if wanted:
            assert txn is not None  # a batch passed _producer_problem: the id is known
            # one join at a time per id: the batches of a transaction's first round
            # arrive together; the join running takes the partitions the others wait
            # for too (gate.wanted), and they find their partitions joined
            gate.wanted.update(dict.fromkeys(wanted))
            try:
                async with gate.joining:
                    now = self.view.get(p, transactional_id)
                    keys = [k for k in wanted if not self._joined(now, txn, k)]
                    if keys:
                        txn = await self._join(
                            transactional_id,
                            txn.producer_id,
                            txn.producer_epoch,
                            keys,
                            also=gate.wanted,
                        )
                    else:
                        txn = now
            except errors.KafkaError as exc:
                return [(a or (exc, None), False) for a in answers]
            finally:
                for key in wanted:
                    gate.wanted.pop(key, None)
        refused = [a is not None for a in answers]
        if txn is None:  # every batch was refused above
            return [(a or (errors.KafkaError("no answer"), None), False) for a in answers]
        extra = {PROP_TXN_ID: transactional_id, PROP_TXN_ORDINAL: str(txn.ordinal)}
        pending = [
            (
                i,
                self._journaler(
                    b, deadline, self._journal.partition_topic(b.topic, b.partition), extra
                ),
            )
            for i, b in enumerate(batches)
            if answers[i] is None
        ]
        results = await asyncio.gather(*(c for _, c in pending))
        for (i, _), result in zip(pending, results, strict=True):
            answers[i] = result
            self._keep(transactional_id, txn.ordinal, batches[i], result)
        return [
            (a or (errors.KafkaError("no answer"), None), not refused[i])
            for i, a in enumerate(answers)
        ]

    def _joined(self, now: Transaction | None, seen: Transaction, key: tuple[str, int]) -> bool:
        """Whether the partition is in the ongoing transaction for this producer and
        needs no change in the log (this sidecar or many journal it)."""
        if now is None or now.state is not TxnState.ONGOING:
            return False
        if (now.producer_id, now.producer_epoch) != (seen.producer_id, seen.producer_epoch):
            return False
        part = now.partition(*key)
        return part is not None and part.journaler in (self._instance, SHARED)

    def _keep(self, transactional_id: str, ordinal: int, batch: KafkaBatch, answer: Answer) -> None:
        """Keep a journaled batch in the local copy; spoil the copy when the answer
        leaves in doubt whether the journal holds a batch the copy does not."""
        error, message_id = answer
        key = (batch.topic, batch.partition)
        if error is None and message_id is not None:
            position = _position(message_id)
            self._local.add(transactional_id, ordinal, batch, position)
            self._journal.note(self._journal.partition_topic(*key), position)
        elif not (
            isinstance(error, errors.DuplicateSequenceNumber)
            and self._local.holds(transactional_id, ordinal, batch)
        ):
            self._local.spoil(transactional_id, ordinal, key)

    @staticmethod
    def _producer_problem(
        transactional_id: str, txn: Transaction | None, batch: KafkaBatch
    ) -> errors.KafkaError | None:
        if txn is None:
            return errors.InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} is unknown: call init-producer-id with it"
            )
        if batch.producer_id != txn.producer_id:
            return errors.InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} maps to producer {txn.producer_id}, "
                f"not {batch.producer_id}"
            )
        if batch.producer_epoch < txn.producer_epoch:
            return errors.InvalidProducerEpoch(
                f"producer {batch.producer_id} epoch {batch.producer_epoch} is fenced: "
                f"transactional id {transactional_id!r} is at epoch {txn.producer_epoch}"
            )
        if batch.producer_epoch > txn.producer_epoch:
            return errors.InvalidProducerEpoch(
                f"epoch {batch.producer_epoch} was never handed out for {transactional_id!r} "
                f"(it is at {txn.producer_epoch}): transactional producers get epochs from "
                "init-producer-id"
            )
        return None

    async def _join(  # noqa: C901 - one decision over the partitions asked for and others
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        keys: list[tuple[str, int]],
        also: Mapping[tuple[str, int], None] | None = None,
    ) -> Transaction:
        """Join the partitions to the open transaction (starting one if none is open),
        decided against the latest state: a partition is skipped only when the
        transaction it is in is ongoing; a producer fenced meanwhile is refused (47).
        A partition joined here names this sidecar its journaler (and gets a local
        copy); one another sidecar joined is marked shared. ``also``: partitions other
        requests of the id wait to join, read when the decision is taken; joined too
        when they can be (each is the waiting request's own business otherwise)."""
        for topic, partition in keys:
            await self._partitions_of(topic)  # the data topic exists (auto-created) first
            await self._journal.ensure(topic, partition)
        opened: list[tuple[str, int]] = []

        async def more() -> list[tuple[str, int]]:
            extra = []
            for topic, partition in [k for k in (also or {}) if k not in keys]:
                try:
                    await self._partitions_of(topic)
                    await self._journal.ensure(topic, partition)
                except Exception as exc:  # the waiting request meets it itself
                    log.debug("not joining %s-%d for another request: %r", topic, partition, exc)
                    continue
                extra.append((topic, partition))
            return extra

        async def decide(current: Transaction | None) -> Transaction | None:
            if current is None:
                raise errors.InvalidProducerIdMapping(
                    f"transactional id {transactional_id!r} is unknown: call init-producer-id"
                )
            opened.clear()
            txn = current
            now = _now_ms()
            for topic, partition in [*keys, *await more()]:
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
                )
                if joined is None:
                    opened.append((topic, partition))
                elif joined.journaler not in (self._instance, SHARED):
                    txn = tx.share(txn, topic, partition)
            return txn

        try:
            txn = await self._change(transactional_id, decide)
        except errors.ConcurrentTransactions:
            self._ensure_applied(transactional_id)
            raise
        if txn is None:
            raise errors.InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} is unknown"
            )
        self._open_local(txn, opened)
        return txn

    def _open_local(self, txn: Transaction, joined: list[tuple[str, int]]) -> None:
        """Local copies for the partitions this sidecar just joined (no await since the
        write: no batch of theirs was journaled yet)."""
        for key in joined:
            part = txn.partition(*key)
            if part is not None and part.journaler == self._instance:
                self._local.open(txn.transactional_id, txn.ordinal, key)

    # -- offsets --------------------------------------------------------------------------

    async def stage_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        group: str,
        offsets: Sequence[StagedOffset],
    ) -> None:
        """TxnOffsetCommit: the offsets wait in the transaction for its decision; until
        then a stable fetch of those partitions answers UNSTABLE_OFFSET_COMMIT."""
        p = self.parts.partition_of(transactional_id)
        await self.parts.read(p)
        current = self.view.get(p, transactional_id)
        if current is None:
            raise errors.InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} is unknown: call init-producer-id"
            )
        staged = [Offset(group, o.topic, o.partition, o.offset, o.metadata) for o in offsets]
        # where the transaction will be, so the pending markers name it
        probe = tx.stage_offsets(current, producer_id, epoch, staged, now_ms=_now_ms())
        await self._offsets.mark_pending(
            group, [(o.topic, o.partition) for o in offsets], transactional_id, probe.ordinal
        )

        async def decide(txn: Transaction | None) -> Transaction | None:
            if txn is None:
                raise errors.InvalidProducerIdMapping(
                    f"transactional id {transactional_id!r} is unknown"
                )
            return tx.stage_offsets(txn, producer_id, epoch, staged, now_ms=_now_ms())

        try:
            await self._change(transactional_id, decide)
        except errors.InvalidProducerEpoch as exc:
            raise errors.ProducerFenced(exc.message) from exc

    # -- end-txn --------------------------------------------------------------------------

    async def end(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> None:
        """EndTxn: answered once the decision is durable; applied in the background.
        Waits for this id's produce requests in flight on this sidecar first."""
        gate = self._gates.setdefault(transactional_id, _Gate())
        gate.ending += 1
        try:
            while gate.inflight:
                await gate.changed(None)
            await self._end(transactional_id, producer_id, epoch, commit)
        finally:
            gate.ending -= 1
            self._settle_gate(transactional_id, gate)

    async def _end(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> None:
        async def decide(current: Transaction | None) -> Transaction | None:
            if current is not None and current.in_doubt and current.producer_epoch != epoch:
                raise errors.ProducerFenced(
                    f"transaction {current.ordinal} of {transactional_id!r} timed out and is "
                    "being checked back with the application; its producer is fenced"
                )
            if tx.check_end(current, producer_id, epoch, commit) is tx.EndCheck.DONE:
                return None
            if current is None:  # check_end raised for None already
                return None
            return tx.prepare(current, commit, await self._ends(current, commit), now_ms=_now_ms())

        try:
            txn = await self._change(transactional_id, decide)
        except errors.ConcurrentTransactions:
            self._ensure_applied(transactional_id)
            raise
        if txn is not None and txn.state.preparing:
            self._ensure_applied(transactional_id)

    async def _ends(
        self, txn: Transaction, commit: bool
    ) -> dict[tuple[str, int], tuple[str | None, str | None]]:
        """Each partition's journal end and data start for the decision: the journal end
        is the last batch of the local copy when it holds them all (from the receipts),
        else the journal's last position now; the data start a recent lower bound."""

        async def one(part: Partition) -> tuple[str | None, str | None]:
            journal_end: str | None
            kept = (
                self._local.batches(txn.transactional_id, txn.ordinal, part.key)
                if part.journaler == self._instance
                else None
            )
            if kept is not None:
                journal_end = encode_position(kept[-1][0]) if kept else None
            else:
                journal_end = await self._journal.end(part.topic, part.partition)
            data_start = (
                await self._journal.recent_data_end(part.topic, part.partition) if commit else None
            )
            return journal_end, data_start

        found = await asyncio.gather(*(one(part) for part in txn.partitions))
        return {part.key: end for part, end in zip(txn.partitions, found, strict=True)}

    # -- applying decisions -----------------------------------------------------------------

    def _ensure_applied(self, transactional_id: str, *, recovering: bool = False) -> None:
        """Apply the id's decision in the background, once at a time (``recovering``: a
        previous owner may have applied part of it)."""
        task = self._applying.get(transactional_id)
        if (task is not None and not task.done()) or self._closing:
            return
        # the copy's turn in each data partition is taken now, in decision order
        txn = self.view.get(self.parts.partition_of(transactional_id), transactional_id)
        ticket = None
        if txn is not None and txn.state is TxnState.PREPARE_COMMIT:
            ticket = self._order.ticket(part.key for part in txn.partitions)
        task = asyncio.create_task(
            self._apply(transactional_id, recovering=recovering, ticket=ticket),
            name=f"apply {transactional_id}",
        )
        self._applying[transactional_id] = task
        task.add_done_callback(lambda t: self._applied(transactional_id, t))

    def _applied(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        if self._applying.get(transactional_id) is task:
            del self._applying[transactional_id]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("applying the decision of %r failed: %r", transactional_id, exc)

    async def _apply(
        self, transactional_id: str, *, recovering: bool = False, ticket: Ticket | None = None
    ) -> None:
        """Apply the decision until it is complete or another sidecar took over."""
        try:
            await self._apply_until_done(transactional_id, recovering=recovering, ticket=ticket)
        finally:
            if ticket is not None:
                ticket.release()

    async def _apply_until_done(
        self, transactional_id: str, *, recovering: bool, ticket: Ticket | None
    ) -> None:
        p = self.parts.partition_of(transactional_id)
        if self.settings.apply_delay_s:
            await asyncio.sleep(self.settings.apply_delay_s)
        while not self._closing:
            txn = self.view.get(p, transactional_id)
            if txn is None or not txn.state.preparing or not self.parts.owned(p):
                return
            try:
                await self._apply_once(p, txn, recovering=recovering, ticket=ticket)
            except errors.NotCoordinator:
                return  # the new owner recovers it
            except Exception as exc:
                log.warning(
                    "applying transaction %d of %r failed, retrying: %s",
                    txn.ordinal,
                    transactional_id,
                    exc,
                )
                recovering = True
                await asyncio.sleep(self.settings.retry_interval_s)
            else:
                return

    async def _apply_once(
        self, p: int, txn: Transaction, *, recovering: bool, ticket: Ticket | None
    ) -> None:
        started = time.monotonic()
        commit = txn.state is TxnState.PREPARE_COMMIT
        copied: dict[tuple[str, int], int] = {}
        if commit:
            copied = await self._copy_all(p, txn, recovering=recovering, ticket=ticket)
        else:
            await self._decide_record(txn, commit, copied)
        groups: dict[str, list[Offset]] = {}
        for o in txn.offsets:
            groups.setdefault(o.group, []).append(o)
        for group, offsets in groups.items():
            if commit:
                await self._offsets.commit_transaction(
                    group,
                    txn.transactional_id,
                    txn.ordinal,
                    [StagedOffset(o.topic, o.partition, o.offset, o.metadata) for o in offsets],
                )
            else:
                await self._offsets.abort_transaction(
                    group,
                    [(o.topic, o.partition) for o in offsets],
                    txn.transactional_id,
                    txn.ordinal,
                )
        async with self.parts.lock(p):
            if not self.parts.owned(p):
                return  # the new owner recovers it
            await self.parts.read(p)  # what another owner wrote meanwhile
            current = self.view.get(p, txn.transactional_id)
            if current is None or current.ordinal != txn.ordinal or not current.state.preparing:
                return
            done = await self._write(p, tx.complete(current, now_ms=_now_ms()))
        self._local.drop(txn.transactional_id, txn.ordinal)
        elapsed = (time.monotonic() - started) * 1000
        if commit:
            self.stats.commits += 1
            self.stats.applied(elapsed)
        else:
            self.stats.aborts += 1
        log.info(
            "transaction %d of %r: %s (%d records copied in %.1f ms)",
            done.ordinal,
            done.transactional_id,
            done.state.value,
            sum(copied.values()),
            elapsed,
        )

    async def _copy_all(
        self, p: int, txn: Transaction, *, recovering: bool, ticket: Ticket | None
    ) -> dict[tuple[str, int], int]:
        """Copy every partition at once, each in its turn, and write the decision record
        meanwhile (its counts are known once the batches are); everything finishes (or
        fails) before this returns, so a retry never runs beside a copy of the same
        batches."""
        found = await asyncio.gather(*(self._copier.batches(txn, part) for part in txn.partitions))
        copied = {
            part.key: sum(len(b.records) for b in batches)
            for part, batches in zip(txn.partitions, found, strict=True)
        }

        async def copy(part: Partition, batches: list[KafkaBatch]) -> int:
            if ticket is not None:
                await ticket.wait(part.key)
            n = await self._copier.copy(txn, part, recovering=recovering, owner=p, batches=batches)
            if ticket is not None:
                ticket.done(part.key)
            return n

        results = await asyncio.gather(
            *(copy(part, b) for part, b in zip(txn.partitions, found, strict=True)),
            self._decide_record(txn, commit=True, copied=copied),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return copied

    async def _decide_record(
        self, txn: Transaction, commit: bool, copied: dict[tuple[str, int], int]
    ) -> None:
        """The decision, append-only, for audits: which transactions committed, where."""
        doc = {
            "transactionalId": txn.transactional_id,
            "ordinal": txn.ordinal,
            "producerId": txn.producer_id,
            "producerEpoch": txn.producer_epoch,
            "decision": "COMMIT" if commit else "ABORT",
            "partitions": [
                {"topic": t, "partition": p, "records": copied.get((t, p), 0)}
                for t, p in (part.key for part in txn.partitions)
            ],
            "groups": sorted({o.group for o in txn.offsets}),
            "at": _now_ms(),
        }
        await self._decisions.send(
            f"{txn.transactional_id}/{txn.ordinal}", json.dumps(doc, separators=(",", ":")).encode()
        )

    # -- recovery, timeouts, check-back ------------------------------------------------------

    async def _recover(self, partition: int) -> None:
        """This sidecar just took the partition: finish what was decided (in the order
        it was decided, as far as the log tells: copies into one data partition follow
        that order)."""
        for txn in sorted(self.view.in_partition(partition), key=lambda t: t.updated_ms):
            if txn.state.preparing:
                log.info(
                    "recovering transaction %d of %r (%s)",
                    txn.ordinal,
                    txn.transactional_id,
                    txn.state.value,
                )
                self._ensure_applied(txn.transactional_id, recovering=True)
            elif txn.in_doubt:
                self._ensure_asking(txn.transactional_id)

    async def _sweep_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("transaction sweep failed: %r", exc)

    async def sweep(self) -> None:
        """On the partitions this sidecar owns: time out open transactions, forget
        expired ids."""
        await self._copier.reap()
        now = _now_ms()
        for p in range(self.settings.log_partitions):
            if not self.parts.owned(p):
                continue
            for txn in self.view.in_partition(p):
                if tx.timed_out(txn, now):
                    await self._time_out(txn.transactional_id)
                elif txn.in_doubt and txn.transactional_id not in self._asking:
                    self._ensure_asking(txn.transactional_id)
                elif not txn.state.open and now - txn.updated_ms > self.settings.expiry_ms:
                    await self._forget(p, txn.transactional_id)

    async def _forget(self, p: int, transactional_id: str) -> None:
        """Remove an id idle past its expiry (checked again on a fresh view)."""
        async with self.parts.lock(p):
            if not self.parts.owned(p):
                return
            await self.parts.read(p)
            txn = self.view.get(p, transactional_id)
            if txn is None or txn.state.open:
                return
            if _now_ms() - txn.updated_ms <= self.settings.expiry_ms:
                return
            await self.parts.tombstone(p, transactional_id)
            self.view.forget(p, transactional_id)

    async def _time_out(self, transactional_id: str) -> None:
        fenced: list[Transaction] = []

        async def decide(current: Transaction | None) -> Transaction | None:
            if current is None or not tx.timed_out(current, _now_ms()):
                return None
            nxt = (
                tx.doubt(current, now_ms=_now_ms())
                if current.check_back_url
                else tx.fence(current, now_ms=_now_ms())
            )
            await self._epochs.raise_to(nxt.producer_id, nxt.producer_epoch)
            fenced.append(nxt)
            return nxt

        await self._change(transactional_id, decide)
        if not fenced:
            return
        self.stats.timeouts += 1
        txn = fenced[0]
        log.info(
            "transaction %d of %r timed out after %d ms: producer fenced at epoch %d; %s",
            txn.ordinal,
            transactional_id,
            txn.timeout_ms,
            txn.producer_epoch,
            "asking the application" if txn.in_doubt else "aborting",
        )
        if txn.in_doubt:
            self._ensure_asking(transactional_id)
        else:
            await self._prepare_abort(transactional_id)

    async def _prepare_abort(self, transactional_id: str) -> None:
        async def decide(current: Transaction | None) -> Transaction | None:
            if current is None or current.state not in (
                TxnState.ONGOING,
                TxnState.PREPARE_EPOCH_FENCE,
            ):
                return None
            return tx.prepare(current, commit=False, ends={}, now_ms=_now_ms())

        txn = await self._change(transactional_id, decide)
        if txn is not None and txn.state.preparing:
            self._ensure_applied(transactional_id)

    def _ensure_asking(self, transactional_id: str) -> None:
        task = self._asking.get(transactional_id)
        if (task is not None and not task.done()) or self._closing:
            return
        task = asyncio.create_task(
            self._ask(transactional_id), name=f"check back {transactional_id}"
        )
        self._asking[transactional_id] = task
        task.add_done_callback(lambda _t: self._asking.pop(transactional_id, None))

    async def _ask(self, transactional_id: str) -> None:
        """Check back until the application answers COMMIT or ROLLBACK, or the limit."""
        p = self.parts.partition_of(transactional_id)
        while not self._closing:
            txn = self.view.get(p, transactional_id)
            if txn is None or not txn.in_doubt or txn.state is not TxnState.ONGOING:
                return
            if not self.parts.owned(p):
                return
            if txn.check_backs >= self.settings.check_back_max:
                log.info(
                    "transaction %d of %r: no decision after %d check-backs: aborting",
                    txn.ordinal,
                    transactional_id,
                    txn.check_backs,
                )
                await self._decide_in_doubt(transactional_id, commit=False)
                return
            answer, what = await self._checkback.ask(
                txn.check_back_url or "", await self._check_body(txn)
            )
            self.stats.check_backs[answer.value] += 1
            log.info(
                "check-back %d of transaction %d of %r at %s: %s",
                txn.check_backs + 1,
                txn.ordinal,
                transactional_id,
                txn.check_back_url,
                what,
                extra={"transactional_id": transactional_id, "check_back": answer.value},
            )
            if answer is checkback.Answer.COMMIT or answer is checkback.Answer.ROLLBACK:
                await self._decide_in_doubt(
                    transactional_id, commit=answer is checkback.Answer.COMMIT
                )
                return

            await self._change(transactional_id, _count_check_back(txn.ordinal))
            wait_ms = min(self.settings.check_back_interval_ms * 2**txn.check_backs, 60_000)
            await asyncio.sleep(wait_ms / 1000)

    async def _decide_in_doubt(self, transactional_id: str, *, commit: bool) -> None:
        async def decide(current: Transaction | None) -> Transaction | None:
            if current is None or not current.in_doubt or current.state is not TxnState.ONGOING:
                return None
            return tx.prepare(current, commit, await self._ends(current, commit), now_ms=_now_ms())

        txn = await self._change(transactional_id, decide)
        if txn is not None and txn.state.preparing:
            self._ensure_applied(transactional_id)

    async def _check_body(self, txn: Transaction) -> dict[str, object]:
        """What the application is asked about: the transaction and its journaled records."""
        partitions: list[dict[str, object]] = []
        records: list[dict[str, object]] = []
        total = 0
        for part in txn.partitions:
            with_end = replace(
                part, journal_end=await self._journal.end(part.topic, part.partition)
            )
            stored = await self._copier.journaled(txn, with_end)
            count = sum(len(s.batch.records) for s in stored)
            total += count
            partitions.append({"topic": part.topic, "partition": part.partition, "records": count})
            for s in stored:
                for r in s.batch.records:
                    if len(records) < _CHECK_BACK_RECORDS:
                        records.append(
                            {
                                "topic": part.topic,
                                "partition": part.partition,
                                "key": None if r.key is None else _b64(r.key),
                                "value": None if r.value is None else _b64(r.value),
                            }
                        )
        return {
            "transactionalId": txn.transactional_id,
            "producerId": txn.producer_id,
            "producerEpoch": txn.producer_epoch - 1,
            "ordinal": txn.ordinal,
            "partitions": partitions,
            "records": records,
            "recordCount": total,
        }


_CHECK_BACK_RECORDS = 1000
_TAKEOVER_ATTEMPTS = 3


def _count_check_back(
    ordinal: int,
) -> Callable[[Transaction | None], Awaitable[Transaction | None]]:
    async def count(current: Transaction | None) -> Transaction | None:
        if current is None or not current.in_doubt or current.ordinal != ordinal:
            return None
        return tx.asked(current, now_ms=_now_ms())

    return count


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
