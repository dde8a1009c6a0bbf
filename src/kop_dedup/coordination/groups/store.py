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
=====================================  =============================================

Every record carries ``v``, a per-key version bumped by the owner: a reader keeps the
newest record of a key whatever order it reads the owner's writes and the log in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.partitions import StatePartitions
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.tables import PulsarClient, TableRecord

__all__ = ["UNKNOWN_OFFSET", "CommittedOffset", "GroupStore", "StagedOffset", "key"]

UNKNOWN_OFFSET = -1
"""Kafka's answer for a partition with no committed offset."""

_TAKEOVER_ATTEMPTS = 3

Doc = dict[str, Any]


def key(kind: str, group: str, *rest: object) -> str:
    return json.dumps([kind, group, *rest], separators=(",", ":"))


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
        return [g for g, keys in self._groups[partition].items() if keys]


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
        self._acquired_hooks: list[Callable[[int], Awaitable[None]]] = []
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
        await self.parts.close()

    def on_acquired(self, hook: Callable[[int], Awaitable[None]]) -> None:
        self._acquired_hooks.append(hook)

    async def _acquired(self, partition: int) -> None:
        for hook in self._acquired_hooks:
            await hook(partition)

    # -- primitives for the group coordinator --------------------------------------------

    def partition_of(self, group: str) -> int:
        return self.parts.partition_of(group)

    def doc(self, group: str, kind: str, *rest: object) -> Doc | None:
        return self._view.get(self.partition_of(group), key(kind, group, *rest))

    def docs(self, group: str) -> list[tuple[list[Any], Doc]]:
        """(key as a list, doc) of every key of the group, as this sidecar has read."""
        return self._view.group(self.partition_of(group), group)

    def groups_in(self, partition: int) -> list[str]:
        return self._view.groups(partition)

    async def read(self, group: str) -> None:
        """Catch up with every change to the group made before this call."""
        await self.parts.read(self.partition_of(group))

    async def owned(self, group: str, change: Callable[[int], Awaitable[Any]]) -> Any:
        """Run ``change(partition)`` as the owner of the group's partition, under its lock;
        when another sidecar takes the partition meanwhile, take it back and run it again
        (on the state as it then is)."""
        p = self.partition_of(group)
        for attempt in range(_TAKEOVER_ATTEMPTS):
            async with self.parts.lock(p):
                await self.parts.own(p)
                try:
                    return await change(p)
                except errors.NotCoordinator:
                    if attempt + 1 == _TAKEOVER_ATTEMPTS:
                        raise
        raise errors.NotCoordinator(f"consumer-groups partition {p} keeps moving; retry")

    async def write(self, p: int, k: str, doc: Doc) -> Doc:
        """Store a key (as the owner, inside :meth:`owned`); the version is bumped here."""
        current = self._view.get(p, k)
        doc = {**doc, "v": int(current.get("v", 0)) + 1 if current else 1}
        await self.parts.write(p, k, json.dumps(doc, separators=(",", ":")).encode())
        self._view.put(p, k, doc)
        return doc

    async def remove(self, p: int, k: str) -> None:
        if self._view.get(p, k) is None:
            return
        await self.parts.tombstone(p, k)
        self._view.put(p, k, None)

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
