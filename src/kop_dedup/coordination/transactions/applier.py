"""The applier: drives durable decisions to completion (Kafka's
TransactionMarkerChannelManager; our markers are the copies).

A decision (PrepareCommit, PrepareAbort, PrepareEpochFence) is applied in the
background, once at a time per transactional id (:meth:`TransactionApplier.ensure`):
a commit's partitions are copied at once (:mod:`.copier`, idempotent; from the local
copy of what this sidecar journaled, else from the journal), each data partition's
copies in decision order (:mod:`.ordering`), with the decision record for audits
written meanwhile; then the staged offsets are committed and Complete* written. An
abort copies nothing: its pending offsets are cleared and CompleteAbort written.

Applying again what was partly applied is safe: a replayed copy comes back -1/-1. A
sidecar that takes a log partition over applies every decision it finds there
(:meth:`TransactionApplier.recover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.store import StagedOffset
from kop_dedup.coordination.transactions.copier import Copier
from kop_dedup.coordination.transactions.journal import Journal
from kop_dedup.coordination.transactions.offsets import TxnOffsets
from kop_dedup.coordination.transactions.ordering import CopyOrder, Ticket
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.coordination.transactions.stats import TxnStats
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import Offset, Partition, Transaction, TxnState
from kop_dedup.pulsar.message_ids import encode_entry_position
from kop_dedup.pulsar.tables import KeyedWriter

__all__ = ["Ends", "TransactionApplier"]

log = logging.getLogger(__name__)

_SETTLED_AFTER_S = 5.0
"""How long a local copy is kept before the sweep asks the log whether it is settled."""

Ends = dict[tuple[str, int], tuple[str | None, str | None]]
"""(topic, partition) -> (journal end, data start): what a decision names."""


class TransactionApplier:
    def __init__(
        self,
        state: TransactionStateManager,
        copier: Copier,
        journal: Journal,
        offsets: TxnOffsets,
        decisions: KeyedWriter,
        stats: TxnStats,
        settings: TxnSettings,
    ) -> None:
        self._state, self._copier, self._journal = state, copier, journal
        self._offsets, self._decisions = offsets, decisions
        self._stats, self._settings = stats, settings
        self._local, self._instance = copier.local, copier.instance
        self._order = CopyOrder()
        self._applying: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._applying.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def applying(self) -> int:
        """Decisions being applied on this sidecar now."""
        return len(self._applying)

    # -- what a decision names ------------------------------------------------------------

    async def ends(self, txn: Transaction, commit: bool) -> Ends:
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
                journal_end = encode_entry_position(kept[-1][0]) if kept else None
            else:
                journal_end = await self._journal.end(part.topic, part.partition)
            data_start = (
                await self._journal.recent_data_end(part.topic, part.partition) if commit else None
            )
            return journal_end, data_start

        found = await asyncio.gather(*(one(part) for part in txn.partitions))
        return {part.key: end for part, end in zip(txn.partitions, found, strict=True)}

    # -- driving ------------------------------------------------------------------------------

    def ensure(self, transactional_id: str, *, recovering: bool = False) -> None:
        """Apply the id's decision in the background, once at a time (``recovering``: a
        previous owner may have applied part of it)."""
        task = self._applying.get(transactional_id)
        if (task is not None and not task.done()) or self._closing:
            return
        # the copy's turn in each data partition is taken now, in decision order
        txn = self._state.get(transactional_id)
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

    async def forget_settled_copies(self) -> None:
        """Drop the local copies of transactions that completed elsewhere (another
        sidecar took the id over and applied its decision) or moved on: no apply here
        drops them. Reads only the log partitions this sidecar does not own (its own
        view is fresh), and only for copies kept a while (an open transaction's)."""
        kept = self._local.kept(older_than_s=_SETTLED_AFTER_S)
        if not kept:
            return
        for p in {self._state.partition_of(tid) for tid, _ in kept}:
            if not self._state.owned(p):
                await self._state.parts.read(p)
        for tid, ordinal in kept:
            txn = self._state.get(tid)
            if txn is None or txn.ordinal > ordinal or not txn.state.open:
                self._local.drop(tid, ordinal)

    async def recover(self, partition: int) -> None:
        """This sidecar just took the partition: apply what was decided (in the order it
        was decided, as far as the log tells: copies into one data partition follow
        that order)."""
        for txn in sorted(self._state.in_partition(partition), key=lambda t: t.updated_ms):
            if txn.state.preparing:
                log.info(
                    "recovering transaction %d of %r (%s)",
                    txn.ordinal,
                    txn.transactional_id,
                    txn.state.value,
                )
                self.ensure(txn.transactional_id, recovering=True)

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
        """Until the decision is complete, or this sidecar no longer owns the id's log
        partition (its new owner recovers it). Any failure while it still does is
        tried again: a NOT_COORDINATOR of the group store (its partition moved) too."""
        p = self._state.partition_of(transactional_id)
        if self._settings.apply_delay_s:
            await asyncio.sleep(self._settings.apply_delay_s)
        while not self._closing:
            txn = self._state.get(transactional_id)
            if txn is None or not txn.state.preparing or not self._state.owned(p):
                return
            try:
                await self.apply_once(txn, recovering=recovering, ticket=ticket)
            except Exception as exc:
                if isinstance(exc, errors.NotCoordinator) and not self._state.owned(p):
                    return  # the new owner of the log partition recovers it
                self._stats.apply_retries += 1
                log.warning(
                    "applying transaction %d of %r failed, retrying: %s",
                    txn.ordinal,
                    transactional_id,
                    exc,
                )
                recovering = True
                await asyncio.sleep(self._settings.retry_interval_s)
            else:
                return

    def drive(self, partition: int) -> int:
        """Apply every decision of an owned partition that is not being applied (the
        sweep: a decision whose write failed but was stored, one whose apply gave up);
        how many were started."""
        started = 0
        for txn in sorted(self._state.in_partition(partition), key=lambda t: t.updated_ms):
            if txn.state.preparing and txn.transactional_id not in self._applying:
                self.ensure(txn.transactional_id, recovering=True)
                started += 1
        return started

    async def apply_once(
        self, txn: Transaction, *, recovering: bool, ticket: Ticket | None = None
    ) -> None:
        """Apply ``txn``'s decision once: copies, decision record, offsets, Complete*.
        Raises when a step fails (calling again is safe)."""
        started = time.monotonic()
        commit = txn.state is TxnState.PREPARE_COMMIT
        copied: dict[tuple[str, int], int] = {}
        if commit:
            copied = await self._copy_all(txn, recovering=recovering, ticket=ticket)
        else:
            await self._decision_record(txn, commit, copied)
        await self._apply_offsets(txn, commit)
        done = await self._state.complete(txn)
        if done is None:
            return  # the new owner recovers it, or it is complete already
        self._local.drop(txn.transactional_id, txn.ordinal)
        elapsed = (time.monotonic() - started) * 1000
        if commit:
            self._stats.commits += 1
            self._stats.applied(elapsed)
        else:
            self._stats.aborts += 1
        log.info(
            "transaction %d of %r: %s (%d records copied in %.1f ms)",
            done.ordinal,
            done.transactional_id,
            done.state.value,
            sum(copied.values()),
            elapsed,
        )

    async def _apply_offsets(self, txn: Transaction, commit: bool) -> None:
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

    async def _copy_all(
        self, txn: Transaction, *, recovering: bool, ticket: Ticket | None
    ) -> dict[tuple[str, int], int]:
        """Copy every partition at once, each in its turn, and write the decision record
        meanwhile (its counts are known once the batches are); everything finishes (or
        fails) before this returns, so a retry never runs beside a copy of the same
        batches."""
        p = self._state.partition_of(txn.transactional_id)
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
            self._decision_record(txn, commit=True, copied=copied),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return copied

    async def _decision_record(
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
            "at": now_ms(),
        }
        await self._decisions.send(
            f"{txn.transactional_id}/{txn.ordinal}", json.dumps(doc, separators=(",", ":")).encode()
        )
