"""The transaction coordinator: decides (Kafka's TransactionCoordinator).

It takes the decisions of the transaction protocol, each as one change of the
transactional id's state (:mod:`.state` persists it; :mod:`kop_dedup.protocol.transactions`
holds the transitions as pure data): init-producer-id (fencing an open transaction
first), the partitions and offsets a transaction begins with, the offsets staged in
it, its end, and the timeouts of transactions left open. What it decides is driven to
completion by :mod:`.applier`; transactional batches are admitted by :mod:`.admission`;
transactions in doubt are asked about by :mod:`.checkback`. The surface transports call
is listed in :mod:`kop_dedup.coordination`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination import names
from kop_dedup.coordination.epochs import EpochRegistry
from kop_dedup.coordination.producer_ids import ProducerIdAllocator
from kop_dedup.coordination.transactional_ids import TransactionalIds
from kop_dedup.coordination.transactions.admission import Journaler, ProduceAdmission
from kop_dedup.coordination.transactions.applier import TransactionApplier
from kop_dedup.coordination.transactions.checkback import CheckBacks
from kop_dedup.coordination.transactions.copier import Copier
from kop_dedup.coordination.transactions.journal import Journal
from kop_dedup.coordination.transactions.offsets import TxnOffsets
from kop_dedup.coordination.transactions.requests import (
    EndTxn,
    InitProducerId,
    ProduceAnswer,
    ProducerIdAndEpoch,
    StageOffsets,
)
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.coordination.transactions.staging import MemberCheck, OffsetStaging
from kop_dedup.coordination.transactions.state import Decide, TransactionStateManager
from kop_dedup.coordination.transactions.stats import TxnStats
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import Transaction, TxnState
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.tables import KeyedWriter, PulsarClient

__all__ = ["MemberCheck", "TransactionCoordinator"]

log = logging.getLogger(__name__)

PartKey = tuple[str, int]


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
        offsets: TxnOffsets,
        allocator: ProducerIdAllocator,
        epochs: EpochRegistry,
        legacy: TransactionalIds,
        journaler: Journaler,
        partitions_of: Callable[[str], Awaitable[int]],
        members: MemberCheck,
        settings: TxnSettings,
        owner_of: Callable[[int], str] | None = None,
        release_journals: Callable[[frozenset[int]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.stats = TxnStats(local=copier.local, copier=copier)
        self._admin, self._copier, self._offsets, self._journal = admin, copier, offsets, journal
        self._allocator, self._epochs, self._legacy = allocator, epochs, legacy
        self._decisions_topic = decisions_topic
        self._release_journals = release_journals  # the journal names of moved producers
        self.state = TransactionStateManager(
            client, admin, log_topic, settings, self._recover, self._lost, owner_of=owner_of
        )
        self._decisions = KeyedWriter(client, f"{decisions_topic}-partition-0")
        self.applier = TransactionApplier(
            self.state, copier, journal, offsets, self._decisions, self.stats, settings
        )
        self.admission = ProduceAdmission(
            self.state,
            journal,
            copier.local,
            copier.instance,
            journaler,
            partitions_of,
            on_busy=self.applier.settled,
            settings=settings,
        )
        self._staging = OffsetStaging(self.state, offsets, members)
        self.checkbacks = CheckBacks(self.state, self.applier, copier, self.stats, settings)
        self._background: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        await self._admin.ensure_partitioned_topic(self._decisions_topic, 1)
        try:
            await self._admin.set_topic_retention(
                self._decisions_topic, self.settings.decisions_retention_minutes
            )
        except Exception as exc:  # topic policies off: the namespace's retention holds
            log.warning("could not set the retention of %s: %s", self._decisions_topic, exc)
        await self.state.start()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="transaction-sweeper")

    async def close(self) -> None:
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
        await self.applier.close()
        await self.checkbacks.close()
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._copier.close()
        await self._journal.close()
        await self.state.close()
        await self._decisions.close()

    def _lost(self, partition: int) -> None:
        log.info("transaction log partition %d moved to another sidecar", partition)
        if self._closing:
            return  # close() closes every copy producer
        if self._release_journals is not None:
            pids = frozenset(t.producer_id for t in self.state.in_partition(partition))
            self._release_journals(pids)
        # its copy producers close, so the new owner can create them (one per name)
        task = asyncio.get_running_loop().create_task(self._copier.release(partition))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _recover(self, partition: int, orphan: bool) -> None:  # noqa: ARG002 - always
        """This sidecar just took the partition: finish what was decided, ask about what
        is in doubt (timeouts fire at the next sweep), whoever had it before."""
        await self.applier.recover(partition)
        for txn in self.state.in_partition(partition):
            if txn.in_doubt and not txn.state.preparing:
                self.checkbacks.ensure(txn.transactional_id)

    # -- reads ---------------------------------------------------------------------------

    async def describe(self, transactional_id: str) -> Transaction | None:
        """The id's state (Kafka's DescribeTransactions), as of every change made
        before the call through any sidecar; None for an unknown id."""
        return await self.state.read(transactional_id)

    async def release(
        self, transactional_id: str, release: Callable[[Transaction | None], Awaitable[object]]
    ) -> None:
        """Run ``release`` (an admin's release of the id's owner) as the id's coordinator,
        on its state as it then is (None: unknown to the log): 51 CONCURRENT_TRANSACTIONS
        while a transaction of it is open (retry once it ended); 16 NOT_COORDINATOR on
        another node."""

        async def decide(current: Transaction | None) -> Transaction | None:
            if current is not None and current.state.open:
                raise errors.ConcurrentTransactions(
                    f"transactional id {transactional_id!r} has an open transaction: end "
                    "it (or let it time out), then release the id"
                )
            await release(current)
            return current

        await self.state.change(transactional_id, decide)

    def owned_open(self) -> int:
        """Open transactions in the log partitions this sidecar owns (no I/O)."""
        return self.state.owned_open()

    async def open_transactions(self) -> list[Transaction]:
        """Every open transaction (Ongoing or decided, not yet applied), oldest first."""
        return await self.state.open_transactions()

    # -- init-producer-id -----------------------------------------------------------------

    def check_timeout(self, timeout_ms: int | None) -> int:
        """The transaction timeout to use; 50 INVALID_TRANSACTION_TIMEOUT out of range."""
        timeout = self.settings.default_timeout_ms if timeout_ms is None else timeout_ms
        if not 0 < timeout <= self.settings.max_timeout_ms:
            raise errors.InvalidTransactionTimeout(
                f"transactionTimeoutMs must be in 1..{self.settings.max_timeout_ms} "
                f"(KOP_DEDUP_MAX_TRANSACTION_TIMEOUT_MS), got {timeout}"
            )
        return timeout

    async def init_producer_id(self, request: InitProducerId) -> ProducerIdAndEpoch:
        """The producer id and a new epoch for a transactional id (fencing the previous
        one). An open transaction is fenced and aborted first: CONCURRENT_TRANSACTIONS
        (51) until that abort is complete, as Kafka answers; the client retries."""
        tid = request.transactional_id
        timeout = self.check_timeout(request.timeout_ms)
        expected = None
        if request.producer_id is not None and request.producer_epoch is not None:
            expected = (request.producer_id, request.producer_epoch)
        fenced: list[Transaction] = []

        async def decide(current: Transaction | None) -> Transaction:
            if current is None:
                current = await self._from_legacy(tid, timeout)
            if current is None:
                self.state.admit(tid)  # a new id: its name, and room for it
            if current is not None and current.state is TxnState.ONGOING:
                nxt = tx.fence(current, now_ms=now_ms())
                await self._epochs.raise_to(nxt.producer_id, nxt.producer_epoch)
                fenced.append(nxt)
                return nxt
            new_pid = (
                await self._allocator.allocate()
                if tx.needs_new_producer_id(current, expected)
                else None
            )
            nxt = tx.init(
                current,
                tid,
                timeout_ms=timeout,
                check_back_url=request.check_back_url,
                now_ms=now_ms(),
                new_producer_id=new_pid,
                expected=expected,
            )
            if nxt.producer_epoch > 0:  # fence first: once durable, older epochs are refused
                await self._epochs.raise_to(nxt.producer_id, nxt.producer_epoch)
            return nxt

        try:
            txn = await self.state.change(tid, decide)
        except errors.ConcurrentTransactions:
            self.applier.ensure(tid)
            raise
        if fenced:
            self.stats.fenced += 1
            log.info(
                "fenced transactional id %r at epoch %d: its open transaction %d is aborted",
                tid,
                fenced[0].producer_epoch - 1,
                fenced[0].ordinal,
            )
            self.applier.ensure(tid)
            raise errors.ConcurrentTransactions(
                f"transaction {fenced[0].ordinal} of {tid!r} was open: it is being "
                "aborted and its producer fenced; retry init-producer-id"
            )
        return ProducerIdAndEpoch(txn.producer_id, txn.producer_epoch)

    async def _from_legacy(self, transactional_id: str, timeout_ms: int) -> Transaction | None:
        """An id a sidecar before transactions initialised (the ``transactional-ids``
        table): keep its producer id, so its next epoch still fences the old one."""
        known = await self._legacy.lookup(transactional_id)
        if known is None:
            return None
        return Transaction(transactional_id, known[0], known[1], timeout_ms)

    # -- beginning a transaction: partitions, offsets ----------------------------------------

    async def add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: Sequence[PartKey]
    ) -> dict[PartKey, errors.KafkaError | None]:
        """Kafka's AddPartitionsToTxn: begin the transaction if none is open and join
        the partitions to it; one answer per partition (the same for all when the call
        fails as a whole: 49, 90, 51 while a decision is applied)."""
        keys = list(dict.fromkeys(partitions))
        names.validate_topics(topic for topic, _ in keys)
        try:
            await self.admission.join(transactional_id, producer_id, epoch, keys)
        except errors.InvalidProducerEpoch as exc:
            return dict.fromkeys(keys, errors.ProducerFenced(exc.message))
        except Exception as exc:  # per partition, as Kafka answers AddPartitionsToTxn
            from kop_dedup.pulsar.failures import translate  # noqa: PLC0415 - Kafka's pass

            return dict.fromkeys(keys, translate(exc, "adding partitions to the transaction"))
        return dict.fromkeys(keys)

    async def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group: str
    ) -> None:
        """Kafka's AddOffsetsToTxn: begin the transaction if none is open (the offsets
        come with :meth:`stage_offsets`). 49, 90, 51 as for any transaction call."""

        async def decide(current: Transaction | None) -> Transaction:
            return tx.begin(
                tx.known(current, transactional_id), producer_id, epoch, now_ms=now_ms()
            )

        await self._changing(transactional_id, decide)
        log.debug("transaction of %r: offsets of group %r to come", transactional_id, group)

    # -- transactional produce ------------------------------------------------------------

    async def produce(
        self,
        transactional_id: str,
        batches: Sequence[KafkaBatch],
        deadline: float,
        token: str | None = None,
        *,
        join: bool = True,
    ) -> list[ProduceAnswer]:
        """Journal transactional batches (see :mod:`.admission`); one answer per batch.
        ``token``: the transaction they belong to (see the package docstring).
        ``join=False``: only into partitions already added to the ongoing transaction
        (48 INVALID_TXN_STATE for another, 51 while a decision is applied): Kafka's
        transactions v1, where a client adds partitions before producing to them."""
        return await self.admission.produce(transactional_id, batches, deadline, token, join=join)

    # -- offsets --------------------------------------------------------------------------

    async def stage_offsets(self, request: StageOffsets) -> None:
        """TxnOffsetCommit (:meth:`.staging.OffsetStaging.stage`): the offsets wait in the
        transaction for its decision; until then a stable fetch of those partitions
        answers UNSTABLE_OFFSET_COMMIT. A member's (KIP-447) is checked by the group in
        the change that writes the pending markers: 25, 22."""
        await self._staging.stage(request)

    async def _changing(self, transactional_id: str, decide: Decide[Transaction]) -> Transaction:
        """``state.change``, waiting once for a decision being applied (``busy_wait_s``)."""
        try:
            return await self.state.change(transactional_id, decide)
        except errors.ConcurrentTransactions:
            if not await self.applier.settled(transactional_id, self.settings.busy_wait_s):
                raise
        try:
            return await self.state.change(transactional_id, decide)
        except errors.ConcurrentTransactions:
            self.applier.ensure(transactional_id)
            raise

    # -- end-txn --------------------------------------------------------------------------

    async def end(self, request: EndTxn) -> None:
        """EndTxn: answered once the decision is durable; applied in the background.
        Waits for this id's produce requests in flight on this sidecar first."""
        tid = request.transactional_id
        async with self.admission.deciding(tid):
            await self._end(request)

    async def _end(self, request: EndTxn) -> None:
        tid, commit = request.transactional_id, request.commit

        async def decide(current: Transaction | None) -> Transaction:
            txn = tx.known(current, tid)
            check = tx.check_end(
                txn, request.producer_id, request.producer_epoch, commit, request.token
            )
            if check is tx.EndCheck.DONE:
                return txn
            return tx.prepare(txn, commit, await self.applier.ends(txn, commit), now_ms=now_ms())

        txn = await self._changing(tid, decide)
        if txn.state.preparing:
            self.applier.ensure(tid)

    # -- for the group store ------------------------------------------------------------------

    async def pending_is_live(self, transactional_id: str, ordinal: int, marked_ms: int) -> bool:
        """Whether a pending-offset marker naming transaction ``ordinal`` of the id may
        still be needed: True while that transaction is open (Ongoing or being applied),
        or may still begin (a staging between its marker and its change: bounded by
        the longest transaction timeout from ``marked_ms``); False once it is complete
        or superseded, or the id is unknown (the marker leaked)."""
        txn = await self.state.read(transactional_id)
        if txn is None or txn.ordinal > ordinal:
            return False
        if txn.ordinal == ordinal:
            return txn.state.open
        return now_ms() - marked_ms < self.settings.max_timeout_ms

    # -- timeouts, expiry ---------------------------------------------------------------------

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
        """On the partitions this sidecar owns (never taking one): take again those a
        failed write left in doubt (their recovery applies what was stored), apply every
        decision not being applied, time out open transactions, forget expired ids."""
        await self._copier.reap()
        await self.applier.forget_settled_copies()
        await self.state.parts.settle_doubt()
        now = now_ms()
        for p in range(self.settings.log_partitions):
            if not self.state.owned(p):
                continue
            self.applier.drive(p)
            for txn in self.state.in_partition(p):
                if tx.timed_out(txn, now):
                    try:
                        await self._time_out(txn.transactional_id)
                    except errors.NotCoordinator:  # another sidecar took it: its sweep
                        break
                elif txn.in_doubt and txn.state is TxnState.ONGOING:
                    self.checkbacks.ensure(txn.transactional_id)
                elif not txn.state.open and now - txn.updated_ms > self.settings.expiry_ms:
                    await self.state.forget(p, txn.transactional_id, self.settings.expiry_ms)

    async def _time_out(self, transactional_id: str) -> None:
        fenced: list[Transaction] = []

        async def decide(current: Transaction | None) -> Transaction | None:
            if current is None or not tx.timed_out(current, now_ms()):
                return current
            nxt = (tx.doubt if current.check_back_url else tx.fence)(current, now_ms=now_ms())
            await self._epochs.raise_to(nxt.producer_id, nxt.producer_epoch)
            fenced.append(nxt)
            return nxt

        await self.state.change(transactional_id, decide, take=False)
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
            self.checkbacks.ensure(transactional_id)
        else:  # fenced is decided: aborted once applied, as after a fencing init
            self.applier.ensure(transactional_id)
