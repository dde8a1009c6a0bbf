"""The applier: drives durable decisions to completion (Kafka's
TransactionMarkerChannelManager; our markers are the copies).

A commit decision records, per partition, how many of the transaction's batches the
journal holds up to a real end entry (:meth:`TransactionApplier.ends`: from the local
copy's receipts, else a journal barrier and a read by position to it). It is applied in
the background, once at a time per transactional id (:meth:`TransactionApplier.ensure`):
every partition's batches are found first (:meth:`.copier.Copier.batches`: exactly the
number the decision counted, else nothing is copied), then copied at once, each data
partition's copies in decision order (:mod:`.ordering`), each batch under its one
producer name and sequence id, complete once every batch has a receipt
(:mod:`.copier`), with the decision record for audits written meanwhile; then the staged
offsets are committed and CompleteCommit written. CompleteCommit is therefore written
only when every partition holds every batch the decision counted, or no longer exists
(a topic deleted since the decision is dropped from the copy, logged and counted, as
Kafka drops a deleted partition's markers: :mod:`.deleted`). An abort copies nothing:
its pending offsets are cleared and CompleteAbort written.

Applying again what was partly applied is safe: a replayed copy comes back -1/-1, and a
failed attempt is tried again until this sidecar loses the log partition (whose new
owner applies it: :meth:`TransactionApplier.recover`). A copy that cannot be resolved
(the journal no longer holds what the decision counted; the broker forgot the copy's
name) is never completed in part: it is reported (a WARNING, an ERROR once older than
the journal's retention, the ``kop_dedup_txn_copy_unresolved`` gauge, ``unresolved`` in
the transaction's record) and tried again, less often.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar, cast

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.store import StagedOffset
from kop_dedup.coordination.transactions.copier import Copier
from kop_dedup.coordination.transactions.copy_source import CopyUnresolved
from kop_dedup.coordination.transactions.deleted import PartitionGone
from kop_dedup.coordination.transactions.journal import Journal
from kop_dedup.coordination.transactions.offsets import TxnOffsets
from kop_dedup.coordination.transactions.ordering import CopyOrder, Ticket
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.coordination.transactions.stats import TxnStats
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import (
    Offset,
    Partition,
    PartitionEnd,
    Transaction,
    TxnState,
)
from kop_dedup.pulsar.tables import KeyedWriter

__all__ = ["Ends", "TransactionApplier"]

log = logging.getLogger(__name__)

_SETTLED_AFTER_S = 5.0
"""How long a local copy is kept before the sweep asks the log whether it is settled."""
_UNRESOLVED_RETRY_MAX_S = 60.0
"""The longest wait between two attempts at a copy that cannot be resolved."""

Ends = dict[tuple[str, int], PartitionEnd]
"""(topic, partition) -> what a commit decision records of it."""


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
        self._unresolved: dict[str, tuple[int, bool]] = {}
        """Transactional id -> (ordinal, reported at ERROR) of copies unresolved now."""
        self._wakes: dict[str, asyncio.Event] = {}
        """Transactional id -> set to end the wait before its next attempt."""
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
        """What a commit decision records of each partition (see :class:`Partition`): the
        journal's end and the number of the transaction's batches up to it (from the
        local copy's receipts when it holds them all, else a journal barrier and a read
        to it: :meth:`Copier.decision_end`), and a recent lower bound of the data
        partition's end. An abort copies nothing and records none."""
        if not commit:
            return {}

        async def one(part: Partition) -> PartitionEnd:
            (journal_end, batches), data_start = await asyncio.gather(
                self._copier.decision_end(txn, part),
                self._journal.recent_data_end(part.topic, part.partition),
            )
            return PartitionEnd(journal_end, data_start, batches)

        found = await asyncio.gather(*(one(part) for part in txn.partitions))
        return {part.key: end for part, end in zip(txn.partitions, found, strict=True)}

    # -- driving ------------------------------------------------------------------------------

    def ensure(self, transactional_id: str) -> None:
        """Apply the id's decision in the background, once at a time (a previous owner
        may have applied part of it: applying again is safe)."""
        task = self._applying.get(transactional_id)
        if (task is not None and not task.done()) or self._closing:
            return
        # the copy's turn in each data partition is taken now, in decision order
        txn = self._state.get(transactional_id)
        ticket = None
        if txn is not None and txn.state is TxnState.PREPARE_COMMIT:
            ticket = self._order.ticket(part.key for part in txn.partitions)
        task = asyncio.create_task(
            self._apply(transactional_id, ticket=ticket),
            name=f"apply {transactional_id}",
        )
        self._applying[transactional_id] = task
        task.add_done_callback(lambda t: self._applied(transactional_id, t))

    async def settled(self, transactional_id: str, within_s: float) -> bool:
        """Apply the id's decision (:meth:`ensure`) and wait for it here, ``within_s`` at
        most (never cancelling it): True once nothing of the id is being applied here.

        A call that met a decision being applied (51 CONCURRENT_TRANSACTIONS) waits here
        and decides again, instead of sending the client into its retry backoff (20-100
        ms in the Kafka clients) for an apply that takes a few milliseconds."""
        self.ensure(transactional_id)
        task = self._applying.get(transactional_id)
        if task is None:
            return True
        if within_s <= 0:
            return False
        done, _ = await asyncio.wait({task}, timeout=within_s)
        return bool(done)

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
                self.ensure(txn.transactional_id)

    async def _apply(self, transactional_id: str, *, ticket: Ticket | None = None) -> None:
        """Apply the decision until it is complete or another sidecar took over."""
        try:
            await self._apply_until_done(transactional_id, ticket=ticket)
        finally:
            if ticket is not None:
                ticket.release()

    async def _apply_until_done(self, transactional_id: str, *, ticket: Ticket | None) -> None:
        """Until the decision is complete, or this sidecar no longer owns the id's log
        partition (its new owner recovers it). Any failure while it still does is
        tried again: a NOT_COORDINATOR of the group store (its partition moved) too; a
        copy that cannot be resolved (:class:`CopyUnresolved`) is reported and tried
        again less often."""
        p = self._state.partition_of(transactional_id)
        if self._settings.apply_delay_s:
            await asyncio.sleep(self._settings.apply_delay_s)
        unresolved = 0
        try:
            while not self._closing:
                txn = self._state.get(transactional_id)
                if txn is None or not txn.state.preparing or not self._state.owned(p):
                    return
                try:
                    await self.apply_once(txn, ticket=ticket)
                except Exception as exc:
                    if isinstance(exc, errors.NotCoordinator) and not self._state.owned(p):
                        return  # the new owner of the log partition recovers it
                    self._stats.apply_retries += 1
                    wait = self._settings.retry_interval_s
                    if isinstance(exc, CopyUnresolved):
                        unresolved += 1
                        await self._report_unresolved(txn, exc)
                        wait = min(wait * 2**unresolved, _UNRESOLVED_RETRY_MAX_S)
                    else:
                        log.warning(
                            "applying transaction %d of %r failed, retrying: %s",
                            txn.ordinal,
                            transactional_id,
                            exc,
                        )
                    await self._pause(transactional_id, wait)
                else:
                    return
        finally:
            self._unresolved.pop(transactional_id, None)
            self._wakes.pop(transactional_id, None)

    async def _pause(self, transactional_id: str, wait: float) -> None:
        """``wait`` seconds before the next attempt, or until :meth:`wake`."""
        event = self._wakes.setdefault(transactional_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait)
        event.clear()

    def wake(self, transactional_id: str) -> None:
        """The id's decision changed (a partition dropped by an operator): apply it
        again now."""
        event = self._wakes.get(transactional_id)
        if event is not None:
            event.set()
        else:
            self.ensure(transactional_id)

    async def _report_unresolved(self, txn: Transaction, exc: CopyUnresolved) -> None:
        """A decision whose copy cannot be resolved: WARNING the first time, ERROR once the
        transaction is older than the journal's retention (the journal may have lost
        what it needs); the reason is written into the log for ``GET
        /v1/transactions/{id}`` (a gauge counts them)."""
        tid = txn.transactional_id
        self._stats.copy_unresolved += 1
        old = now_ms() - txn.started_ms > self._journal.retention_ms
        seen = self._unresolved.get(tid)
        if seen is None or seen[0] != txn.ordinal or (old and not seen[1]):
            log.log(
                logging.ERROR if old else logging.WARNING,
                "transaction %d of %r is decided but its copy cannot complete%s: %s",
                txn.ordinal,
                tid,
                " (older than the journal's retention: its records may be gone)" if old else "",
                exc.message,
            )
            self._unresolved[tid] = (txn.ordinal, old)
        flagged = tuple(p.key for p in txn.partitions if p.unresolved)
        if txn.unresolved == exc.message and flagged == exc.partitions:
            return
        ordinal = txn.ordinal

        async def mark(current: Transaction | None) -> Transaction | None:
            if current is None or current.ordinal != ordinal or not current.state.preparing:
                return current
            return tx.unresolved(current, exc.message, exc.partitions)

        try:
            await self._state.change(tid, mark, take=False)
        except Exception as failure:  # reported again at the next attempt
            log.debug("recording the unresolved copy of %r: %r", tid, failure)

    def unresolved(self) -> int:
        """Decisions this sidecar applies whose copy cannot be resolved now."""
        return len(self._unresolved)

    def drive(self, partition: int) -> int:
        """Apply every decision of an owned partition that is not being applied (the
        sweep: a decision whose write failed but was stored, one whose apply gave up);
        how many were started."""
        started = 0
        for txn in sorted(self._state.in_partition(partition), key=lambda t: t.updated_ms):
            if txn.state.preparing and txn.transactional_id not in self._applying:
                self.ensure(txn.transactional_id)
                started += 1
        return started

    async def apply_once(self, txn: Transaction, *, ticket: Ticket | None = None) -> None:
        """Apply ``txn``'s decision once: copies, decision record, offsets, Complete*.
        Raises when a step fails (calling again is safe)."""
        started = time.monotonic()
        commit = txn.state is TxnState.PREPARE_COMMIT
        copied: dict[tuple[str, int], int] = {}
        if commit:
            copied = await self._copy_all(txn, ticket=ticket)
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
        self, txn: Transaction, *, ticket: Ticket | None
    ) -> dict[tuple[str, int], int]:
        """Copy every partition at once, each in its turn, and write the decision record
        meanwhile (its counts are known once the batches are); everything finishes (or
        fails) before this returns, so a retry never runs beside a copy of the same
        batches. Nothing is copied unless every partition's batches are found as the
        decision counted them."""
        p = self._state.partition_of(txn.transactional_id)
        parts = [part for part in txn.partitions if not part.dropped]
        finding = await asyncio.gather(
            *(_where(part, self._copier.batches(txn, part)) for part in parts),
            return_exceptions=True,
        )
        _raise_failure(finding)
        found = cast("list[list[KafkaBatch]]", finding)
        copied = {
            part.key: sum(len(b.records) for b in batches)
            for part, batches in zip(parts, found, strict=True)
        }

        async def copy(part: Partition, batches: list[KafkaBatch]) -> int:
            if ticket is not None:
                await ticket.wait(part.key)
            try:
                n = await _where(part, self._copier.copy(txn, part, batches, owner=p))
            except PartitionGone as gone:
                n = self._dropped(txn, batches, gone)
            if ticket is not None:
                ticket.done(part.key)
            return n

        results = await asyncio.gather(
            *(copy(part, b) for part, b in zip(parts, found, strict=True)),
            self._decision_record(txn, commit=True, copied=copied),
            return_exceptions=True,
        )
        _raise_failure(results)
        return copied

    def _dropped(self, txn: Transaction, batches: list[KafkaBatch], gone: PartitionGone) -> int:
        """A partition deleted since the decision: dropped from the copy (Kafka drops a
        deleted partition's markers), logged and counted; nothing was copied there."""
        self._stats.copy_partitions_dropped += 1
        log.warning(
            "transaction %d of %r: %s; its %d records there are dropped from the commit, "
            "the rest is copied",
            txn.ordinal,
            txn.transactional_id,
            gone.message,
            sum(len(b.records) for b in batches),
        )
        return 0

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


T = TypeVar("T")


async def _where(part: Partition, step: Awaitable[T]) -> T:
    """``step`` of ``part``'s copy; an unresolved copy names the partition."""
    try:
        return await step
    except CopyUnresolved as exc:
        raise CopyUnresolved(exc.message, (part.key,)) from exc


def _raise_failure(results: Sequence[object]) -> None:
    """Raise what failed among the partitions' ``results``: the unresolved copies as
    one, naming every partition concerned, else the first failure."""
    failed = [r for r in results if isinstance(r, BaseException)]
    unresolved = [r for r in failed if isinstance(r, CopyUnresolved)]
    if unresolved:
        raise CopyUnresolved(
            "; ".join(u.message for u in unresolved),
            tuple(k for u in unresolved for k in u.partitions),
        ) from unresolved[0]
    if failed:
        raise failed[0]
