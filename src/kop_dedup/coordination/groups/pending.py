"""Offsets pending in a transaction (Kafka's KIP-447): the ``["p", group, topic,
partition]`` markers of the group store.

A transaction that stages offsets (TxnOffsetCommit) marks each partition first
(:meth:`PendingOffsets.mark`): while a marker is there, a stable fetch of that partition
answers 88 UNSTABLE_OFFSET_COMMIT. A partition has one marker, naming the last
transaction that staged offsets for it: ``{"transactionalId", "ordinal", "markedMs",
"after"}`` (``after``: the version of the partition's committed offset when it was
marked).

When the decision is applied:

* :meth:`~PendingOffsets.commit_transaction` writes the transaction's offsets **at most
  once**: a partition whose marker no longer names this (transactional id, ordinal) is
  skipped (applied already: a replayed commit is a no-op; or superseded by a later
  transaction), and so is one whose offset a plain commit moved after the marker was
  written (as Kafka's ``completePendingTxnOffsetCommit``: the later commit wins). Its
  markers are removed.
* :meth:`~PendingOffsets.abort_transaction` removes its markers only.

A plain commit never touches a marker. A marker whose transaction ended without
removing it (a change that failed after the marker was written) is removed by
:meth:`~PendingOffsets.sweep` on the partition's owner, which asks the transaction
coordinator through ``pending_is_live(transactional_id, ordinal, marked_ms)``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.access import StoreAccess
from kop_dedup.coordination.groups.offsets import StagedOffset, offset_doc
from kop_dedup.coordination.groups.view import Doc, key

__all__ = ["PendingIsLive", "PendingOffsets"]

log = logging.getLogger(__name__)

PendingIsLive = Callable[[str, int, int], Awaitable[bool]]
"""``(transactional_id, ordinal, marked_ms) -> whether that transaction may still
apply or abort its offsets`` (the transaction coordinator answers)."""


def _names(marker: Doc | None, transactional_id: str, ordinal: int) -> bool:
    return (
        marker is not None
        and marker.get("transactionalId") == transactional_id
        and int(marker.get("ordinal", -1)) == ordinal
    )


class PendingOffsets:
    """The KIP-447 markers of the group store (see the module docstring)."""

    def __init__(self, store: StoreAccess, pending_is_live: PendingIsLive | None) -> None:
        self._store = store
        self.pending_is_live = pending_is_live

    async def mark(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        """Mark partitions as having offsets pending in transaction ``ordinal`` of
        ``transactional_id`` (before the transaction records them)."""
        keys = list(keys)
        store = self._store

        async def change(p: int) -> None:
            now = now_ms()
            for topic, partition in keys:
                committed = store.view_doc(p, key("o", group, topic, partition))
                await store.write(
                    p,
                    key("p", group, topic, partition),
                    {
                        "transactionalId": transactional_id,
                        "ordinal": ordinal,
                        "markedMs": now,
                        "after": 0 if committed is None else int(committed["v"]),
                    },
                )

        await store.owned(group, change)

    async def commit_transaction(
        self, group: str, transactional_id: str, ordinal: int, offsets: Iterable[StagedOffset]
    ) -> list[StagedOffset]:
        """Apply a committed transaction's offsets at most once (see the module
        docstring); the offsets written (none when replayed)."""
        offsets = list(offsets)
        store = self._store

        async def change(p: int) -> list[StagedOffset]:
            now = now_ms()
            applied = []
            for o in offsets:
                marker_key = key("p", group, o.topic, o.partition)
                marker = store.view_doc(p, marker_key)
                if not _names(marker, transactional_id, ordinal):
                    continue  # applied already, or superseded by a later transaction
                assert marker is not None
                offset_key = key("o", group, o.topic, o.partition)
                committed = store.view_doc(p, offset_key)
                if (0 if committed is None else int(committed["v"])) == int(marker["after"]):
                    await store.write(p, offset_key, offset_doc(o, now))
                    applied.append(o)
                await store.remove(p, marker_key)
            return applied

        result: list[StagedOffset] = await store.owned(group, change)
        return result

    async def abort_transaction(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        """Remove the markers this transaction left (an abort); others stay."""
        keys = list(keys)
        store = self._store

        async def change(p: int) -> None:
            for topic, partition in keys:
                k = key("p", group, topic, partition)
                if _names(store.view_doc(p, k), transactional_id, ordinal):
                    await store.remove(p, k)

        await store.owned(group, change)

    async def sweep(self, partition: int) -> int:
        """Remove the markers of partition ``partition`` (owned by this sidecar) whose
        transaction is no longer live; how many were removed."""
        is_live = self.pending_is_live
        store = self._store
        if is_live is None:
            return 0
        dead: list[tuple[str, str, int]] = []
        for group in store.groups_in(partition):
            for k, marker in store.docs(group):
                if k[0] != "p":
                    continue
                tid, ordinal = str(marker["transactionalId"]), int(marker["ordinal"])
                if not await is_live(tid, ordinal, int(marker.get("markedMs", 0))):
                    dead.append((group, key(*k), int(marker["v"])))
        removed = 0
        for group, marker_key, version in dead:

            async def change(p: int, k: str = marker_key, version: int = version) -> int:
                marker = store.view_doc(p, k)
                if marker is None or int(marker["v"]) != version:
                    return 0  # marked again since it was asked about
                await store.remove(p, k)
                return 1

            removed += await store.owned(group, change, take=False)
        if removed:
            log.warning(
                "consumer groups: removed %d pending-offset markers whose transaction had "
                "ended without clearing them (partition %d)",
                removed,
                partition,
            )
        return removed
