"""Taking over a consumer-groups partition, and handing it over cleanly: whether the
new owner must recover what the previous one may have left unanswered.

A node that loads a partition whose previous owner has no writer at the broker any
more runs the store's ``on_orphan`` hooks as the new owner, under the partition's lock,
before any other change: the group coordinator sends uncommitted deliveries back to
their committed offsets there, since a crashed owner may have recorded a pull it never
answered. Not when the owner went away cleanly: a node that stops gracefully has
answered every request first, and writes ``["c", ""]`` with ``"clean": true`` on each
partition it owns as it closes (:meth:`CleanClose.mark_all`, within a deadline: a
partition not marked in time is recovered by its next owner, which costs duplicates,
never a loss; a partition with a pull recorded and neither answered nor put back, e.g.
cancelled by the stop, is never marked), and so does a node that hands a partition over
to the owner a membership change names (:meth:`CleanClose.mark`); the next owner reads
it, writes ``"clean": false`` before anything else, and runs no hook. Taking a partition
from a live owner (one that did not let go within the hand-off wait) runs no hook
either: the live owner answers what it recorded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.access import StoreAccess
from kop_dedup.coordination.groups.view import NO_GROUP, key

__all__ = ["CLEAN", "CleanClose"]

log = logging.getLogger(__name__)

CLEAN = key("c", NO_GROUP)
"""The partition's own doc: whether its last owner closed cleanly (and the version
floor, see :mod:`.view`)."""


class CleanClose:
    """The clean-close protocol of one store (see the module docstring)."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store
        self.hooks: list[Callable[[int], Awaitable[None]]] = []
        self.fresh: set[int] = set()
        """Partitions taken whose clean-close marker was not read yet."""
        self.unrecovered: set[int] = set()
        """Partitions taken from an owner that went away, not recovered yet."""
        self.unclean: set[int] = set()
        """Partitions with a pull recorded here and never answered nor put back."""

    def taken(self, p: int, *, orphan: bool) -> None:
        """This sidecar just took ``p``; ``orphan``: its previous owner went away."""
        self.fresh.add(p)
        if orphan:
            self.unrecovered.add(p)

    def lost(self, p: int) -> None:
        self.fresh.discard(p)
        self.unrecovered.discard(p)

    async def recover(self, p: int) -> None:
        """First thing as a new owner (lock held): the marker read and cleared, then the
        orphan hooks unless the previous owner closed cleanly."""
        store = self._store
        if p in self.fresh:
            marker = store.view_doc(p, CLEAN)
            if marker is not None and marker.get("clean"):
                await store.write(p, CLEAN, {**marker, "clean": False, "atMs": now_ms()})
                self.unrecovered.discard(p)
            self.fresh.discard(p)
        if p not in self.unrecovered:
            return
        for hook in self.hooks:
            await hook(p)
        self.unrecovered.discard(p)

    async def mark(self, p: int) -> None:
        """Mark ``p`` closed cleanly as it is handed over (its lock held, its writer still
        open): the next owner then sends nothing again. Not a partition with a pull left
        unanswered, nor one not recovered yet."""
        store = self._store
        if p in self.unrecovered or p in self.unclean:
            return
        marker = store.view_doc(p, CLEAN) or {}
        await store.write(p, CLEAN, {**marker, "clean": True, "atMs": now_ms()})
        await store.durable(p)

    async def mark_all(self, timeout_s: float) -> int:
        """Mark every partition this sidecar owns (and recovered) closed cleanly, all at
        once, within ``timeout_s``; how many were marked. What is not marked in time
        (broker away, fenced) is recovered by its next owner."""
        store = self._store
        owned = [
            p
            for p in range(store.parts.count)
            if store.parts.owned(p) and p not in self.unrecovered and p not in self.unclean
        ]

        async def mark(p: int) -> bool:
            async with store.parts.lock(p):
                if not store.parts.owned(p):
                    return False
                marker = store.view_doc(p, CLEAN) or {}
                await store.write(p, CLEAN, {**marker, "clean": True, "atMs": now_ms()})
            await store.durable(p)
            return True

        tasks = [asyncio.ensure_future(mark(p)) for p in owned]
        if not tasks:
            return 0
        done, waiting = await asyncio.wait(tasks, timeout=max(timeout_s, 0.0))
        for task in waiting:
            task.cancel()
        marked = sum(1 for t in done if not t.cancelled() and not t.exception() and t.result())
        failed = [t.exception() for t in done if not t.cancelled() and t.exception()]
        if marked < len(tasks):
            log.info(
                "consumer groups: %d of %d partitions marked closed cleanly within %.1f s "
                "(the next owner recovers the others: uncommitted deliveries come again)%s",
                marked,
                len(tasks),
                timeout_s,
                f"; {failed[0]!r}" if failed else "",
            )
        return marked
