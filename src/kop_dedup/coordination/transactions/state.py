"""The transaction state manager (Kafka's TransactionStateManager): persists and loads
each transactional id's :class:`Transaction` in the partitioned transaction log.

Every change runs on the owner of the id's log partition, under the partition's lock
(:meth:`TransactionStateManager.change`): read the current state, let the caller
decide the next one, write it (the version bumped), and only then put it in the view.
The owner is the node the cluster names (:mod:`kop_dedup.coordination.partitions`);
another node's change is refused with NOT_COORDINATOR (its transports forward it
first). Reads catch up with the log first, so they see every change made through any
sidecar. An answer that writes nothing (a decision taken already, a refusal) is given
only from a view proved current: read to the end, no other node's ownership marker after
ours; a write needs no such proof (the fenced writer refuses it). A write that fails is
handled by the partitions' one rule (the partition is taken again, its view reread, its
recovery run, before the next change).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import replace
from typing import Any, TypeVar, cast

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination import names
from kop_dedup.coordination.partitions import StatePartitions
from kop_dedup.coordination.transactions.log import TransactionView, encode
from kop_dedup.coordination.transactions.settings import TxnSettings
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.transactions import Transaction
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["Decide", "TransactionStateManager"]

log = logging.getLogger(__name__)

T = TypeVar("T", bound=Transaction | None)
Decide = Callable[[Transaction | None], Awaitable[T]]
"""Given the current state (None: an unknown id), the next one (the current one: no
change). A decide for a known id only raises for None (:func:`tx.known`) and answers a
Transaction."""


class TransactionStateManager:
    def __init__(
        self,
        client: PulsarClient,
        admin: PulsarAdmin,
        log_topic: str,
        settings: TxnSettings,
        on_acquired: Callable[[int, bool], Coroutine[Any, Any, None]],
        on_lost: Callable[[int], None],
        *,
        owner_of: Callable[[int], str] | None = None,
    ) -> None:
        self._admin, self._topic, self.settings = admin, log_topic, settings
        self.view = TransactionView(settings.log_partitions)
        self.parts = StatePartitions(
            client,
            log_topic,
            settings.log_partitions,
            apply=self.view.apply,
            on_acquired=on_acquired,
            on_lost=on_lost,
            writers=lambda: admin.partition_writers(log_topic),
            name="transaction log",
            owner_of=owner_of,
            handoff_wait_s=settings.handoff_wait_s,
        )
        self.on_forget: Callable[[Transaction], Awaitable[object]] | None = None
        """Called for an expired id before it is removed, under its partition's lock (the
        owners of the id and its producer id are pruned: Kafka's expiry forgets both); a
        failure leaves the id for the next sweep."""

    async def start(self) -> None:
        count = await self._admin.ensure_partitioned_topic(
            self._topic, self.settings.log_partitions
        )
        if count != self.settings.log_partitions:
            raise RuntimeError(
                f"{self._topic} has {count} partitions but KOP_DEDUP_TXN_LOG_PARTITIONS "
                f"is {self.settings.log_partitions}; they must agree (a transactional id's "
                "partition is derived from the count)"
            )

    async def close(self) -> None:
        await self.parts.close()

    # -- reads -----------------------------------------------------------------------------

    def partition_of(self, transactional_id: str) -> int:
        return self.parts.partition_of(transactional_id)

    def owned(self, partition: int) -> bool:
        return self.parts.owned(partition)

    def get(self, transactional_id: str) -> Transaction | None:
        """The id's state as this sidecar has read it (no I/O)."""
        return self.view.get(self.partition_of(transactional_id), transactional_id)

    async def read(self, transactional_id: str) -> Transaction | None:
        """The id's state, having read every change made before this call (anywhere)."""
        p = self.partition_of(transactional_id)
        await self.parts.read(p)
        return self.view.get(p, transactional_id)

    async def read_all(self) -> None:
        await self.parts.read_all()

    def owned_open(self) -> int:
        """Open transactions in the partitions this sidecar owns (no I/O)."""
        return sum(
            1
            for p in range(self.parts.count)
            if self.parts.owned(p)
            for t in self.view.in_partition(p)
            if t.state.open
        )

    async def open_transactions(self) -> list[Transaction]:
        """Every open transaction (Ongoing or decided, not yet applied), oldest first."""
        await self.parts.read_all()
        return sorted(
            (t for t in self.view if t.state.open), key=lambda t: (t.started_ms, t.transactional_id)
        )

    def admit(self, transactional_id: str) -> None:
        """Check a transactional id the log does not hold yet: its name (42), and room
        for it in its partition (89 THROTTLING_QUOTA_EXCEEDED past its share of
        ``max_ids``)."""
        names.validate_transactional_id(transactional_id)
        share = -(-self.settings.max_ids // self.parts.count)
        if self.view.size(self.partition_of(transactional_id)) >= share:
            raise errors.ThrottlingQuotaExceeded(
                f"the transaction log holds its most transactional ids ({share} in this "
                "id's partition, KOP_DEDUP_MAX_TRANSACTIONAL_IDS_IN_LOG); a new one can "
                "start when older ones expire"
            )

    def in_partition(self, partition: int) -> list[Transaction]:
        return self.view.in_partition(partition)

    def __iter__(self) -> Iterator[Transaction]:
        return iter(self.view)

    # -- changes (as the owner of the id's partition) ------------------------------------

    async def change(self, transactional_id: str, decide: Decide[T], *, take: bool = True) -> T:
        """Run ``decide`` on the current state as the partition's owner; write what it
        answers when that differs, and answer the state after. NOT_COORDINATOR on a node
        the cluster does not name the owner (or one fenced meanwhile: nothing stored);
        COORDINATOR_LOAD_IN_PROGRESS while this node loads the partition. An answer that
        writes nothing (no change, or a non-retriable refusal ``decide`` raises) is given
        only once the view is proved current (:meth:`_proved_current`), else
        NOT_COORDINATOR.

        ``take=False``: background work (the sweep's timeouts, check-backs), which runs
        ``decide`` only if this node still owns the partition as read afresh and has no
        failed write pending on it, else raises NOT_COORDINATOR (the owner sweeps it)."""
        p = self.partition_of(transactional_id)
        if take:
            await self.parts.ready(p)
        async with self.parts.lock(p):
            if not take and (self.parts.in_doubt(p) or not await self.parts.still_owned(p)):
                raise errors.NotCoordinator(f"transaction log partition {p} is not ours")
            await self.parts.own(p)
            current = self.view.get(p, transactional_id)
            try:
                nxt = await decide(current)
            except errors.KafkaError as exc:
                if take and not exc.retriable:
                    await self._proved_current(p, exc)
                raise
            if nxt is None or nxt == current:
                if take:
                    await self._proved_current(p)
                return nxt
            return cast("T", await self.write(p, nxt))

    async def _proved_current(self, p: int, refusal: errors.KafkaError | None = None) -> None:
        """Before an answer that writes nothing (a decision taken already, a refusal):
        the view it was decided on is current, having read the partition to its end
        and found no other node's ownership marker after ours (lock held). Else
        NOT_COORDINATOR, and the partition is given up: another node took it while this
        one did not notice (paused past the broker's keep-alive, its next listing still
        to come), and may have moved the id on (a retried EndTxn of transaction N
        answered 0 from here would have answered one of N+1 that the new owner never
        decided). A decision that writes needs no barrier: the fenced writer refuses it.
        Retriable refusals (51) are not proved: the client asks again."""
        if await self.parts.still_owned(p):
            return
        raise errors.NotCoordinator(
            f"transaction log partition {p} was taken over by another node (this one "
            "had not noticed yet); find the coordinator again"
        ) from refusal

    async def write(self, p: int, txn: Transaction) -> Transaction:
        """Store ``txn`` (version bumped) as the owner; call with the lock held."""
        current = self.view.get(p, txn.transactional_id)
        txn = replace(txn, version=(current.version if current else 0) + 1)
        await self.parts.write(p, txn.transactional_id, encode(txn))
        self.view.put(p, txn)
        return txn

    async def complete(self, txn: Transaction) -> Transaction | None:
        """Write that ``txn``'s decision is applied (Complete*), if the id is still at
        that decision and this sidecar still owns its partition (read afresh: another
        owner may have written meanwhile); None when not (the new owner finishes it, or
        it is finished)."""
        p = self.partition_of(txn.transactional_id)
        async with self.parts.lock(p):
            if not self.parts.owned(p):
                return None
            await self.parts.read(p)
            current = self.view.get(p, txn.transactional_id)
            if current is None or current.ordinal != txn.ordinal or not current.state.preparing:
                return None
            return await self.write(p, tx.complete(current, now_ms=now_ms()))

    async def forget(self, p: int, transactional_id: str, expiry_ms: int) -> None:
        """Remove an id idle past ``expiry_ms`` (checked again on a fresh view)."""
        async with self.parts.lock(p):
            if not self.parts.owned(p):
                return
            await self.parts.read(p)
            txn = self.view.get(p, transactional_id)
            if txn is None or txn.state.open or now_ms() - txn.updated_ms <= expiry_ms:
                return
            if self.on_forget is not None:
                await self.on_forget(txn)
            await self.parts.tombstone(p, transactional_id)
            self.view.forget(p, transactional_id)
