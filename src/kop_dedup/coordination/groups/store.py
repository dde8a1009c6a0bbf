"""Consumer-group state, durable in Pulsar: a partitioned, compacted log with one writer
per partition (:class:`~kop_dedup.coordination.partitions.StatePartitions`).

Everything of one group lives in one partition (by the group id), so one owner
serializes every change to a group, and any sidecar reads it (a read catches up with
the log first). Keys are JSON lists, the first element the kind:

=====================================  =============================================
``["o", group, topic, partition]``     the group's committed offset (Kafka: the next
                                       record to read), with its position when known
``["p", group, topic, partition]``     offsets staged in a transaction not complete
                                       yet: a stable fetch answers 88 meanwhile
``["g", group]``                       configuration, generation, members, assignment
``["d", group, member, topic, part]``  where deliveries stand (member "" in
                                       clustering mode: a partition has one reader)
``["b", group, member, topic, part]``  a broadcast member's own committed offset
``["r", group, topic, partition]``     the last server-side reset (its epoch, target)
``["c", ""]``                          whether the partition's last owner closed
                                       cleanly (group "" is no group)
=====================================  =============================================

Every record carries ``v``, a per-key version bumped by the owner: a reader keeps the
newest record of a key whatever order it reads the owner's writes and the log in.

**Taking over from an owner that went away.** A sidecar that takes a partition whose
previous owner has no writer at the broker any more runs the ``on_orphan`` hooks as
the new owner, under the partition's lock, before any other change: the group
coordinator sends uncommitted deliveries back to their committed offsets there, since
a crashed owner may have recorded a pull it never answered. Not when the owner went
away cleanly: a sidecar that stops gracefully has answered every request first, and
writes ``["c", ""]`` = ``{"clean": true}`` on each partition it owns as it closes;
the next owner reads it, writes ``{"clean": false}`` before anything else, and runs
no hook. Taking a partition from a live owner (two sidecars taking turns behind a
load balancer) runs no hook either: the live owner answers what it recorded.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.partitions import StatePartitions
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.tables import PulsarClient, TableRecord

__all__ = ["UNKNOWN_OFFSET", "CommittedOffset", "GroupStore", "StagedOffset", "key"]

UNKNOWN_OFFSET = -1
"""Kafka's answer for a partition with no committed offset."""

log = logging.getLogger(__name__)

_TAKEOVER_ATTEMPTS = 3

Doc = dict[str, Any]


def key(kind: str, group: str, *rest: object) -> str:
    return json.dumps([kind, group, *rest], separators=(",", ":"))


def _now_ms() -> int:
    return int(time.time() * 1000)


_NO_GROUP = ""
_CLEAN = key("c", _NO_GROUP)


@dataclass(frozen=True, slots=True)
class StagedOffset:
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    position: str | None = None


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One partition's answer to a fetch."""

    topic: str
    partition: int
    offset: int
    metadata: str
    commit_ms: int | None
    error: errors.KafkaError | None = None


class _View:
    """Every key of the partitions this sidecar has read, and each group's keys."""

    def __init__(self, partitions: int) -> None:
        self._docs: list[dict[str, Doc]] = [{} for _ in range(partitions)]
        self._groups: list[dict[str, set[str]]] = [{} for _ in range(partitions)]

    def apply(self, partition: int, record: TableRecord) -> None:
        self.put(partition, record.key, None if record.value is None else json.loads(record.value))

    def put(self, partition: int, k: str, doc: Doc | None) -> None:
        docs = self._docs[partition]
        current = docs.get(k)
        group = json.loads(k)[1]
        if doc is None:
            docs.pop(k, None)
            self._groups[partition].get(group, set()).discard(k)
        elif current is None or int(doc.get("v", 0)) >= int(current.get("v", 0)):
            docs[k] = doc
            self._groups[partition].setdefault(group, set()).add(k)

    def get(self, partition: int, k: str) -> Doc | None:
        return self._docs[partition].get(k)

    def group(self, partition: int, group: str) -> list[tuple[list[Any], Doc]]:
        docs = self._docs[partition]
        return [(json.loads(k), docs[k]) for k in sorted(self._groups[partition].get(group, ()))]

    def groups(self, partition: int) -> list[str]:
        return [g for g, keys in self._groups[partition].items() if keys and g != _NO_GROUP]

    def clear(self, partition: int) -> None:
        self._docs[partition] = {}
        self._groups[partition] = {}


class GroupStore:
    def __init__(
        self,
        client: PulsarClient,
        admin: PulsarAdmin,
        topic: str,
        partitions: int,
        *,
        adopt_interval_s: float,
    ) -> None:
        self.topic, self._admin = topic, admin
        self._partitions_wanted = partitions
        self._adopt_interval_s = adopt_interval_s
        self._view = _View(partitions)
        self._orphan_hooks: list[Callable[[int], Awaitable[None]]] = []
        self._unrecovered: set[int] = set()
        """Partitions taken from an owner that went away, not recovered yet."""
        self._fresh: set[int] = set()
        """Partitions taken whose clean-close marker has not been checked yet."""
        self._on_demand: dict[int, bool] = {}
        """Set by :meth:`owned` while it takes a partition: whether it was an orphan."""
        self._sending: list[set[asyncio.Future[None]]] = [set() for _ in range(partitions)]
        """Writes on their way to the broker, per partition (already in the view)."""
        self._broken: dict[int, BaseException] = {}
        """Partitions whose view holds a write that failed (how): read again before use."""
        self._epoch = [0] * partitions
        """Bumped when a broken partition is read again (failures of older writes are
        then known)."""
        self.parts = StatePartitions(
            client,
            topic,
            partitions,
            apply=self._view.apply,
            on_acquired=self._acquired,
            on_lost=lambda _p: None,
            writers=lambda: admin.partition_writers(topic),
            name="consumer groups",
        )

    async def start(self) -> None:
        count = await self._admin.ensure_partitioned_topic(self.topic, self._partitions_wanted)
        if count != self._partitions_wanted:
            raise RuntimeError(
                f"{self.topic} has {count} partitions, the settings say "
                f"{self._partitions_wanted}; they must agree (a group's partition is "
                "derived from the count)"
            )
        self.parts.start(self._adopt_interval_s)

    async def close(self) -> None:
        """Mark each owned partition closed cleanly (every pull was answered: the next
        owner need not send deliveries again), then close."""
        for p in range(self.parts.count):
            if not self.parts.owned(p) or p in self._unrecovered:
                continue
            async with self.parts.lock(p):
                try:
                    await self.write(p, _CLEAN, {"clean": True, "atMs": _now_ms()})
                    await self._durable(p)
                except Exception as exc:  # fenced or broker away: the next owner recovers
                    log.info("consumer groups: partition %d not marked clean: %r", p, exc)
        await self.parts.close()

    def on_orphan(self, hook: Callable[[int], Awaitable[None]]) -> None:
        """Run ``hook(partition)`` as the new owner of a partition whose previous owner
        went away (see the module docstring)."""
        self._orphan_hooks.append(hook)

    async def _acquired(self, partition: int) -> None:
        """After any acquisition (a task of its own). Taken by :meth:`owned`: it decided
        already. Adopted as an orphan: recover, unless a change got the lock first (it
        recovers before changing anything: the flags are set before this task awaits)."""
        if not self._on_demand.pop(partition, True):
            return
        self._fresh.add(partition)
        self._unrecovered.add(partition)
        async with self.parts.lock(partition):
            if self.parts.owned(partition):
                await self._recover(partition)
        await self._durable(partition)

    async def _recover(self, partition: int) -> None:
        """First thing as a new owner: the clean-close marker read and cleared, then the
        orphan hooks unless the previous owner closed cleanly."""
        if partition in self._fresh:
            marker = self._view.get(partition, _CLEAN)
            if marker is not None and marker.get("clean"):
                await self.write(partition, _CLEAN, {"clean": False, "atMs": _now_ms()})
                self._unrecovered.discard(partition)
            self._fresh.discard(partition)
        if partition not in self._unrecovered:
            return
        for hook in self._orphan_hooks:
            await hook(partition)
        self._unrecovered.discard(partition)

    async def _take(self, p: int, *, caught_up: bool = False) -> None:
        """Own partition ``p`` (lock held); a new owner's recovery runs before returning.
        ``caught_up``: read since the request began (see :meth:`owned`)."""
        if p in self._broken:
            await self._reread(p)
        if not await self.parts.still_owned(p, caught_up=caught_up):
            try:
                live = (await self._admin.partition_writers(self.topic)).get(p, [])
            except Exception as exc:  # cannot tell: recover (duplicates rather than a loss)
                log.warning("consumer groups: who writes partition %d? %r; recovering it", p, exc)
                live = []
            self._on_demand[p] = False  # the acquisition task leaves recovery to us
            try:
                await self.parts.own(p)
            except BaseException:
                self._on_demand.pop(p, None)
                raise
            self._fresh.add(p)
            if not live:
                self._unrecovered.add(p)
        await self._recover(p)

    async def _reread(self, p: int) -> None:
        """A write of ours to ``p`` failed, so the view may hold what is not stored: read
        the partition again from its start, as its owner again (lock held). The previous
        owner went away only if the broker lists no writer on it (not even ours)."""
        try:
            live = (await self._admin.partition_writers(self.topic)).get(p, [])
        except Exception as exc:  # cannot tell: recover (duplicates rather than a loss)
            log.warning("consumer groups: who writes partition %d? %r; recovering it", p, exc)
            live = []
        self._epoch[p] += 1
        failure = self._broken.pop(p)
        self._on_demand[p] = False  # the acquisition task leaves recovery to _take
        try:
            await self.parts.restart(p, functools.partial(self._view.clear, p))
            await self.parts.own(p)
        except BaseException:
            self._broken.setdefault(p, failure)
            self._on_demand.pop(p, None)
            raise
        log.warning("consumer groups: a write to partition %d failed; read it again", p)
        self._fresh.add(p)
        if not live:
            self._unrecovered.add(p)

    def _sent(self, p: int, epoch: int, future: asyncio.Future[None]) -> None:
        self._sending[p].discard(future)
        if future.cancelled() or (exc := future.exception()) is None:
            return
        if epoch == self._epoch[p]:
            self._broken.setdefault(p, exc)

    async def _durable(self, p: int) -> None:
        """Return once every write made to ``p`` so far is stored; raise when one failed
        (NOT_COORDINATOR when another sidecar fenced this one), even one that failed
        before this call: a change may have built on it (the view had it)."""
        pending = list(self._sending[p])
        if pending:
            results = await asyncio.shield(asyncio.gather(*pending, return_exceptions=True))
            for r in results:  # its own failed even when a re-read cleared the mark since
                if isinstance(r, BaseException):
                    raise r
        if p in self._broken:
            raise self._broken[p]

    # -- primitives for the group coordinator --------------------------------------------

    def partition_of(self, group: str) -> int:
        return self.parts.partition_of(group)

    def doc(self, group: str, kind: str, *rest: object) -> Doc | None:
        return self._view.get(self.partition_of(group), key(kind, group, *rest))

    def view_doc(self, partition: int, k: str) -> Doc | None:
        """A key as this sidecar has read it (``k`` from :func:`key`)."""
        return self._view.get(partition, k)

    def docs(self, group: str) -> list[tuple[list[Any], Doc]]:
        """(key as a list, doc) of every key of the group, as this sidecar has read."""
        return self._view.group(self.partition_of(group), group)

    def groups_in(self, partition: int) -> list[str]:
        return self._view.groups(partition)

    async def read(self, group: str) -> None:
        """Catch up with every change to the group made before this call (this
        sidecar's own stored, too)."""
        await self.read_partition(self.partition_of(group))

    async def read_partition(self, p: int) -> None:
        """:meth:`read` for every group of partition ``p`` at once."""
        if p in self._broken:
            async with self.parts.lock(p):
                await self._take(p)
        await self.parts.read(p)
        await self._durable(p)

    async def owned(
        self, group: str, change: Callable[[int], Awaitable[Any]], *, caught_up: bool = False
    ) -> Any:
        """Run ``change(partition)`` as the owner of the group's partition, under its lock;
        when another sidecar takes the partition meanwhile, take it back and run it again
        (on the state as it then is).

        The catch-up that makes the view fresh runs before the lock is taken, so the
        callers waiting for the lock (the members of a group share its partition) share
        one broker round trip instead of paying one each under the lock. The view is
        then complete for a decision: this sidecar's own writes are applied to it as they
        are made (their echoes from the log carry no newer version), and a takeover by
        another sidecar since the catch-up fenced this writer, so the change's write fails
        and it runs again as the owner once more (after a full catch-up).

        ``caught_up``: an earlier change of the same request caught up already (a pull
        records what it planned): a takeover since then fails this change's write, as
        above, so it needs no second round trip. A change that answers something must
        then write it (a pull's record does)."""
        p = self.partition_of(group)
        for attempt in range(_TAKEOVER_ATTEMPTS):
            owner = self.parts.owned(p) and p not in self._broken
            if owner and not (caught_up and attempt == 0):
                await self.parts.read(p)
            async with self.parts.lock(p):
                await self._take(p, caught_up=owner)
                result = await change(p)
            # the lock is not held while the change's writes travel: the next change
            # builds on them (the view has them) and answers once they are stored too
            try:
                await self._durable(p)
            except errors.NotCoordinator:
                if attempt + 1 == _TAKEOVER_ATTEMPTS:
                    raise
                continue
            return result
        raise errors.NotCoordinator(f"consumer-groups partition {p} keeps moving; retry")

    async def write(self, p: int, k: str, doc: Doc) -> Doc:
        """Store a key (as the owner, inside :meth:`owned`); the version is bumped here.

        The view has it at once and the write is on its way (in order) when this
        returns; :meth:`owned` returns once it is stored. A write that fails marks the
        partition broken: its view is read again from the log before the next use."""
        current = self._view.get(p, k)
        doc = {**doc, "v": int(current.get("v", 0)) + 1 if current else 1}
        self._send(p, self.parts.write(p, k, json.dumps(doc, separators=(",", ":")).encode()))
        self._view.put(p, k, doc)
        return doc

    async def remove(self, p: int, k: str) -> None:
        if self._view.get(p, k) is None:
            return
        self._send(p, self.parts.tombstone(p, k))
        self._view.put(p, k, None)

    def _send(self, p: int, sending: Coroutine[Any, Any, None]) -> None:
        # a task's first step runs in creation order and hands the message to the
        # producer before it awaits: the writes reach the broker in the order made
        future = asyncio.ensure_future(sending)
        self._sending[p].add(future)
        future.add_done_callback(functools.partial(self._sent, p, self._epoch[p]))

    # -- Kafka-style offsets (plain commits, transactions) --------------------------------

    async def commit(self, group: str, offsets: Iterable[StagedOffset]) -> None:
        """Commit the group's offsets (plain commits, and a committed transaction's); a
        pending marker for the same partitions is cleared with them."""
        offsets = list(offsets)
        now = int(time.time() * 1000)

        async def change(p: int) -> None:
            for o in offsets:
                await self.write(
                    p,
                    key("o", group, o.topic, o.partition),
                    {
                        "offset": o.offset,
                        "position": o.position,
                        "metadata": o.metadata,
                        "commitMs": now,
                    },
                )
                await self.remove(p, key("p", group, o.topic, o.partition))

        await self.owned(group, change)

    async def mark_pending(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        keys = list(keys)

        async def change(p: int) -> None:
            for topic, partition in keys:
                await self.write(
                    p,
                    key("p", group, topic, partition),
                    {"transactionalId": transactional_id, "ordinal": ordinal},
                )

        await self.owned(group, change)

    async def clear_pending(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        """Remove the pending markers this transaction left (an abort)."""
        keys = list(keys)

        async def change(p: int) -> None:
            for topic, partition in keys:
                k = key("p", group, topic, partition)
                doc = self._view.get(p, k)
                if doc is None or doc.get("transactionalId") != transactional_id:
                    continue
                if int(doc["ordinal"]) == ordinal:
                    await self.remove(p, k)

        await self.owned(group, change)

    async def fetch(self, group: str, *, require_stable: bool = False) -> list[CommittedOffset]:
        """Every partition the group has an offset (or a pending one) for; a read sees
        every commit made before it, through any sidecar."""
        await self.read(group)
        committed: dict[tuple[str, int], CommittedOffset] = {}
        pending: set[tuple[str, int]] = set()
        for k, doc in self.docs(group):
            if k[0] == "o":
                committed[k[2], k[3]] = CommittedOffset(
                    k[2],
                    int(k[3]),
                    int(doc["offset"]),
                    str(doc.get("metadata") or ""),
                    int(doc["commitMs"]) if "commitMs" in doc else None,
                )
            elif k[0] == "p":
                pending.add((k[2], int(k[3])))
        out = []
        for tp in sorted(set(committed) | pending):
            answer = committed.get(tp) or CommittedOffset(tp[0], tp[1], UNKNOWN_OFFSET, "", None)
            if require_stable and tp in pending:
                answer = CommittedOffset(
                    answer.topic,
                    answer.partition,
                    UNKNOWN_OFFSET,
                    "",
                    None,
                    errors.UnstableOffsetCommit(
                        f"{tp[0]}-{tp[1]} has offsets in a transaction that is not complete"
                    ),
                )
            out.append(answer)
        return out
