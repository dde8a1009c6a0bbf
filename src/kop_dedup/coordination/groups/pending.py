"""Offsets pending in a transaction (Kafka's KIP-447): the ``"p"`` markers of the group
store.

A transaction that stages offsets (TxnOffsetCommit) marks each partition first
(:meth:`PendingOffsets.mark`): while any marker is on a partition, a stable fetch of it
answers 88 UNSTABLE_OFFSET_COMMIT. **Each transaction has its own marker**,
``["p", group, topic, partition, transactionalId, ordinal]``, holding
``{"transactionalId", "ordinal", "markedMs", "after", "seq"}``: ``after`` is the
version of the partition's committed offset when it was marked, ``seq`` its place among
the partition's markers (above every marker there when it was written). Transactions
of different ids staging one partition (Kafka keeps their pending offsets apart, by
producer id) therefore never touch each other's markers: the end of one never drops
or undoes another's offsets.

When the decision is applied:

* :meth:`~PendingOffsets.commit_transaction` writes the transaction's offsets **at most
  once**: a partition without its marker is skipped (applied already: a replayed commit
  is a no-op; or removed by OffsetDelete). The offset is written unless a later commit
  already stands (:func:`supersedes`, as Kafka's ``completePendingTxnOffsetCommit``:
  of a plain commit and the commits of transactions, the one written last to the log
  wins, a transaction's counting from its TxnOffsetCommit). Its markers are removed.
* :meth:`~PendingOffsets.abort_transaction` removes its markers only.

A plain commit never touches a marker. A marker whose transaction ended without
removing it (a change that failed after the marker was written) is removed by
:meth:`~PendingOffsets.sweep` on the partition's owner, which asks the transaction
coordinator through ``pending_is_live(transactional_id, ordinal, marked_ms)``.

**Sidecars of earlier versions** kept one marker per partition,
``["p", group, topic, partition]``, naming the last transaction that staged it (a later
one replaced an earlier one's: its commit was then skipped). Such a marker is still
read: it makes the partition unstable, the transaction it names applies or removes it
as its own, and the sweep removes it once that transaction is over. Each mark also
writes it still (:func:`shared_key`), so that an earlier sidecar sharing the store
during an upgrade finds the marker it looks for when it applies a transaction staged
here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.access import StoreAccess
from kop_dedup.coordination.groups.offsets import StagedOffset, offset_doc
from kop_dedup.coordination.groups.view import Doc, key
from kop_dedup.protocol.groups.classic import ClassicGroup
from kop_dedup.protocol.groups.fencing import check_txn_member
from kop_dedup.protocol.groups.metadata import Group

__all__ = [
    "STAGED_FIELD",
    "PendingIsLive",
    "PendingOffsets",
    "marker_key",
    "markers_of",
    "shared_key",
    "supersedes",
]

log = logging.getLogger(__name__)

PendingIsLive = Callable[[str, int, int], Awaitable[bool]]
"""``(transactional_id, ordinal, marked_ms) -> whether that transaction may still
apply or abort its offsets`` (the transaction coordinator answers)."""

STAGED_FIELD = "stagedSeq"
"""On a committed offset a transaction wrote: its marker's ``seq`` (0 for a marker of an
earlier version, which was written before every marker that has one)."""


def marker_key(group: str, topic: str, partition: int, transactional_id: str, ordinal: int) -> str:
    """The marker of transaction ``ordinal`` of ``transactional_id`` on a partition."""
    return key("p", group, topic, partition, transactional_id, ordinal)


def shared_key(group: str, topic: str, partition: int) -> str:
    """The one marker per partition that sidecars of earlier versions read and write."""
    return key("p", group, topic, partition)


def _names(marker: Doc | None, transactional_id: str, ordinal: int) -> bool:
    return (
        marker is not None
        and marker.get("transactionalId") == transactional_id
        and int(marker.get("ordinal", -1)) == ordinal
    )


def markers_of(
    docs: Iterable[tuple[list[Any], Doc]], topic: str, partition: int
) -> list[tuple[str, Doc]]:
    """(key, doc) of every marker on one partition, among a group's keys as
    :meth:`~kop_dedup.coordination.groups.store.GroupStore.docs` lists them."""
    return [
        (key(*k), doc)
        for k, doc in docs
        if k[0] == "p" and k[2] == topic and int(k[3]) == partition
    ]


def supersedes(marker: Doc, committed: Doc | None) -> bool:
    """Whether a committed transaction's offset replaces the partition's committed
    one: nothing was committed since its marker was written (the version is the one it
    noted), or only by a transaction that staged before it (a lower ``seq``). A plain
    commit since the marker, or a transaction that staged after it, stands.

    >>> supersedes({"after": 3, "seq": 2}, {"v": 3})
    True
    >>> supersedes({"after": 3, "seq": 2}, {"v": 5, "stagedSeq": 1})
    True
    >>> supersedes({"after": 3, "seq": 2}, {"v": 5})
    False
    """
    version = 0 if committed is None else int(committed["v"])
    if version == int(marker["after"]):
        return True
    staged = None if committed is None else committed.get(STAGED_FIELD)
    return staged is not None and int(staged) < int(marker.get("seq", 0))


async def _keep_apart(
    store: StoreAccess, p: int, group: str, topic: str, partition: int, shared: Doc | None
) -> None:
    """Before the shared marker names another transaction: the one it names now gets a
    marker of its own, if it has none (a sidecar of an earlier version marked it)."""
    if shared is None:
        return
    tid, ordinal = str(shared["transactionalId"]), int(shared["ordinal"])
    own = marker_key(group, topic, partition, tid, ordinal)
    if store.view_doc(p, own) is None:
        await store.write(p, own, {k: v for k, v in shared.items() if k != "v"})


class PendingOffsets:
    """The KIP-447 markers of the group store (see the module docstring)."""

    def __init__(self, store: StoreAccess, pending_is_live: PendingIsLive | None) -> None:
        self._store = store
        self.pending_is_live = pending_is_live

    async def mark(
        self,
        group: str,
        keys: Iterable[tuple[str, int]],
        transactional_id: str,
        ordinal: int,
        *,
        member_id: str | None = None,
        generation: int | None = None,
        instance_id: str | None = None,
    ) -> None:
        """Mark partitions as having offsets pending in transaction ``ordinal`` of
        ``transactional_id`` (before the transaction records them). Marking again (the
        transaction stages the partition again) moves its marker after the others.

        ``member_id``, ``generation`` (KIP-447), ``instance_id`` (KIP-345): the member
        the offsets are committed for, checked in the same change, before anything is
        written (82, 25, 22:
        :func:`~kop_dedup.protocol.groups.fencing.check_txn_member`), so that no
        rebalance comes between the check and the marker."""
        keys = list(dict.fromkeys(keys))
        store = self._store

        async def change(p: int) -> None:
            if member_id is not None or generation is not None:
                doc = store.doc(group, "g")
                check_txn_member(
                    group,
                    ClassicGroup.from_doc(store.doc(group, "k")),
                    None if doc is None else Group.from_doc(doc),
                    member_id,
                    generation,
                    instance_id,
                )
            now = now_ms()
            docs = store.docs(group)
            for topic, partition in keys:
                committed = store.view_doc(p, key("o", group, topic, partition))
                seqs = [int(d.get("seq", 0)) for _, d in markers_of(docs, topic, partition)]
                if committed is not None:
                    seqs.append(int(committed.get(STAGED_FIELD, 0)))
                marker = {
                    "transactionalId": transactional_id,
                    "ordinal": ordinal,
                    "markedMs": now,
                    "after": 0 if committed is None else int(committed["v"]),
                    "seq": max(seqs, default=0) + 1,
                }
                shared = shared_key(group, topic, partition)
                named = store.view_doc(p, shared)
                if not _names(named, transactional_id, ordinal):
                    await _keep_apart(store, p, group, topic, partition, named)
                own = marker_key(group, topic, partition, transactional_id, ordinal)
                await store.write(p, own, marker)
                await store.write(p, shared, marker)

        await store.owned(group, change)

    def _own(
        self, p: int, group: str, topic: str, partition: int, tid: str, ordinal: int
    ) -> list[str]:
        """The keys of the markers transaction ``ordinal`` of ``tid`` holds on a
        partition: its own, and the shared one while it names the transaction."""
        store = self._store
        found = []
        own = marker_key(group, topic, partition, tid, ordinal)
        if store.view_doc(p, own) is not None:
            found.append(own)
        shared = shared_key(group, topic, partition)
        if _names(store.view_doc(p, shared), tid, ordinal):
            found.append(shared)
        return found

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
                found = self._own(p, group, o.topic, o.partition, transactional_id, ordinal)
                if not found:
                    continue  # applied already, or its marker was deleted (OffsetDelete)
                marker = store.view_doc(p, found[0])
                assert marker is not None
                offset_key = key("o", group, o.topic, o.partition)
                if supersedes(marker, store.view_doc(p, offset_key)):
                    doc = {**offset_doc(o, now), STAGED_FIELD: int(marker.get("seq", 0))}
                    await store.write(p, offset_key, doc)
                    applied.append(o)
                for k in found:
                    await store.remove(p, k)
            return applied

        # decided: applied whatever the group count (its markers made room at staging)
        result: list[StagedOffset] = await store.owned(group, change, admit=False)
        return result

    async def abort_transaction(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        """Remove the markers this transaction left (an abort); others stay."""
        keys = list(keys)
        store = self._store

        async def change(p: int) -> None:
            for topic, partition in keys:
                for k in self._own(p, group, topic, partition, transactional_id, ordinal):
                    await store.remove(p, k)

        await store.owned(group, change, admit=False)

    async def remove_all(self, p: int, group: str, topic: str, partition: int) -> None:
        """Remove every marker on a partition, whichever transaction's (OffsetDelete:
        their commits then leave the partition alone). Inside a change of ``p``."""
        for k, _ in markers_of(self._store.docs(group), topic, partition):
            await self._store.remove(p, k)

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
        for group, marker_key_, version in dead:

            async def change(p: int, k: str = marker_key_, version: int = version) -> int:
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
