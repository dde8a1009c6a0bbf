"""Offsets staged in a transaction (Kafka's TxnOffsetCommit, KIP-447): the pending
markers in the group store, written as part of the transaction's change, and their
removal when that change does not take them.

The transaction coordinator (:mod:`.coordinator`) hands TxnOffsetCommit here. A commit
made for a member (``member_id``, ``generation``) is checked by the group **in the
change that writes the markers** (:meth:`TxnOffsets.mark_pending`, under the group
partition's lock, on the group coordinator's node), as Kafka checks it under the group
lock: a rebalance to generation g+1 between a check and the marker would let a zombie
of g stage offsets after g+1 fetched the committed ones (both then process the same
input). The read-based check before the change (``members``) stays as a quick refusal
and for a group coordinator of an earlier version, which does not check in its change.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from kop_dedup.clock import now_ms
from kop_dedup.coordination import names
from kop_dedup.coordination.transactions.offsets import TxnOffsets
from kop_dedup.coordination.transactions.requests import StageOffsets
from kop_dedup.coordination.transactions.state import TransactionStateManager
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.transactions import Offset, Transaction, TxnState

__all__ = ["MemberCheck", "OffsetStaging"]

log = logging.getLogger(__name__)

PartKey = tuple[str, int]
MemberCheck = Callable[[str, str | None, int | None], Awaitable[None]]
"""``(group, member id, generation)``: raises what a stale member's commit gets (25
UNKNOWN_MEMBER_ID, 22 ILLEGAL_GENERATION); None skips that check (KIP-447)."""


class OffsetStaging:
    def __init__(
        self, state: TransactionStateManager, offsets: TxnOffsets, members: MemberCheck
    ) -> None:
        self._state, self._offsets, self._members = state, offsets, members

    async def stage(self, request: StageOffsets) -> None:
        """TxnOffsetCommit: the offsets wait in the transaction for its decision; until
        then a stable fetch of those partitions answers UNSTABLE_OFFSET_COMMIT.

        With a member (KIP-447) the group checks it, in the change that writes the
        markers. The pending markers are written as part of the transaction's change,
        under the log partition's lock, once the change is known to be allowed: nothing
        of the id (an end-txn, another staging) runs between a marker and the change
        that records its offsets. A marker of a change that then failed is removed once
        its transaction can no longer stage it (the group store's sweep removes what is
        left, asking the coordinator's ``pending_is_live``)."""
        tid, group = request.transactional_id, request.group
        member, generation = request.member_id, request.generation
        names.validate_group_id(group)
        names.validate_topics(o.topic for o in request.offsets)  # before it is staged or stored
        instance = request.instance_id
        if instance is None and (member is not None or generation is not None):
            # a static member's id is checked in the change only (82 before 25 there)
            await self._members(group, member, generation)
        keys = [(o.topic, o.partition) for o in request.offsets]
        staged = [
            Offset(group, o.topic, o.partition, o.offset, o.metadata) for o in request.offsets
        ]
        marked: list[int] = []

        async def decide(current: Transaction | None) -> Transaction:
            txn = tx.stage_offsets(
                tx.known(current, tid),
                request.producer_id,
                request.producer_epoch,
                staged,
                now_ms=now_ms(),
                token=request.token,
            )
            if not marked or marked[-1] != txn.ordinal:
                await self._offsets.mark_pending(
                    group,
                    keys,
                    tid,
                    txn.ordinal,
                    member_id=member,
                    generation=generation,
                    instance_id=instance,
                )
                marked.append(txn.ordinal)
            return txn

        try:
            done = await self._state.change(tid, decide)
        except Exception:
            await self._unmark(tid, group, keys, marked)
            raise
        await self._unmark(tid, group, keys, [o for o in marked if o != done.ordinal])

    async def _unmark(
        self, transactional_id: str, group: str, keys: list[PartKey], ordinals: list[int]
    ) -> None:
        """Remove the markers this call wrote for transactions that did not get its
        offsets and can no longer stage them (not Ongoing at that ordinal any more),
        except for partitions such a transaction did stage. Only as the partition's
        owner with nothing in doubt (else the group store's sweep does it later)."""
        if not ordinals:
            return
        state = self._state
        p = state.partition_of(transactional_id)
        try:
            async with state.parts.lock(p):
                if state.parts.in_doubt(p) or not await state.parts.still_owned(p):
                    return
                current = state.get(transactional_id)
                for ordinal in ordinals:
                    same = current is not None and current.ordinal == ordinal
                    if same and current is not None and current.state is TxnState.ONGOING:
                        continue  # it may still stage them; its decision clears the rest
                    kept = {
                        (o.topic, o.partition)
                        for o in (current.offsets if same and current is not None else ())
                        if o.group == group
                    }
                    leaked = [k for k in keys if k not in kept]
                    if leaked:
                        await self._offsets.abort_transaction(
                            group, leaked, transactional_id, ordinal
                        )
        except Exception as exc:  # the group store's sweep removes them later
            log.warning(
                "pending offsets of %r in group %r left for the sweep: %r",
                transactional_id,
                group,
                exc,
            )
