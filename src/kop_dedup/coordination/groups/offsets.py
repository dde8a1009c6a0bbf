"""Consumer-group offsets, durable in Pulsar: a partitioned, compacted log with one
writer per partition (:class:`~kop_dedup.coordination.partitions.StatePartitions`).

A group's keys all live in one partition (by the group id), so one owner serializes
every change to a group. Two kinds of keyed record:

* ``["o", group, topic, partition]`` -> ``{"offset", "metadata", "commitMs", "v"}``:
  the committed offset (Kafka: the next record to read);
* ``["p", group, topic, partition]`` -> ``{"transactionalId", "ordinal", "v"}``: offsets
  staged in a transaction not yet complete; a fetch with ``requireStable`` answers
  UNSTABLE_OFFSET_COMMIT (88) for that partition until the transaction commits (the
  marker then gives way to the offset) or aborts (the marker goes).

``v`` is a per-key version bumped by the owner, so a reader keeps the newest record
of a key whatever order it reads its own writes and the log in.
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

__all__ = ["CommittedOffset", "OffsetStore", "StagedOffset"]

UNKNOWN_OFFSET = -1
"""Kafka's answer for a partition with no committed offset."""


@dataclass(frozen=True, slots=True)
class StagedOffset:
    topic: str
    partition: int
    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One partition's answer to a fetch."""

    topic: str
    partition: int
    offset: int
    metadata: str
    commit_ms: int | None
    error: errors.KafkaError | None = None


def _key(kind: str, group: str, topic: str, partition: int) -> str:
    return json.dumps([kind, group, topic, partition], separators=(",", ":"))


class _GroupView:
    """Every group of the partitions this sidecar has read: key -> (doc, version)."""

    def __init__(self, partitions: int) -> None:
        self._parts: list[dict[str, dict[str, Any]]] = [{} for _ in range(partitions)]

    def apply(self, partition: int, record: TableRecord) -> None:
        entries = self._parts[partition]
        if record.value is None:
            entries.pop(record.key, None)
            return
        doc = json.loads(record.value)
        current = entries.get(record.key)
        if current is None or int(doc.get("v", 0)) >= int(current.get("v", 0)):
            entries[record.key] = doc

    def put(self, partition: int, key: str, doc: dict[str, Any] | None) -> None:
        entries = self._parts[partition]
        current = entries.get(key)
        if doc is None:
            entries.pop(key, None)
        elif current is None or int(doc["v"]) >= int(current.get("v", 0)):
            entries[key] = doc

    def get(self, partition: int, key: str) -> dict[str, Any] | None:
        return self._parts[partition].get(key)

    def group(self, partition: int, group: str) -> list[tuple[str, str, int, dict[str, Any]]]:
        """(kind, topic, partition, doc) of every key of a group."""
        out = []
        for key, doc in self._parts[partition].items():
            kind, g, topic, p = json.loads(key)
            if g == group:
                out.append((kind, topic, int(p), doc))
        return out


class OffsetStore:
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
        self._view = _GroupView(partitions)
        self.parts = StatePartitions(
            client,
            topic,
            partitions,
            apply=self._view.apply,
            on_acquired=self._acquired,
            on_lost=lambda _p: None,
            writers=lambda: admin.partition_writers(topic),
            name="consumer offsets",
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

    async def _acquired(self, _partition: int) -> None:
        return

    # -- writes (as the owner of the group's partition) --------------------------------

    async def _owned(self, group: str, write: Callable[[int], Awaitable[None]]) -> None:
        """Run ``write`` as the owner of the group's partition; when another sidecar takes
        the partition meanwhile, take it back and run it again (writes are keyed and
        idempotent)."""
        p = self.parts.partition_of(group)
        for attempt in range(3):
            async with self.parts.lock(p):
                await self.parts.own(p)
                try:
                    await write(p)
                except errors.NotCoordinator:
                    if attempt == 2:
                        raise
                else:
                    return

    async def commit(self, group: str, offsets: Iterable[StagedOffset]) -> None:
        """Commit offsets (plain commits, and a committed transaction's); a pending
        marker for the same partitions is cleared with them."""
        offsets = list(offsets)
        now = int(time.time() * 1000)

        async def write(p: int) -> None:
            for o in offsets:
                await self._write(
                    p,
                    _key("o", group, o.topic, o.partition),
                    {
                        "offset": o.offset,
                        "metadata": o.metadata,
                        "commitMs": now,
                    },
                )
                pending = _key("p", group, o.topic, o.partition)
                if self._view.get(p, pending) is not None:
                    await self._remove(p, pending)

        await self._owned(group, write)

    async def mark_pending(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        keys = list(keys)

        async def write(p: int) -> None:
            for topic, partition in keys:
                await self._write(
                    p,
                    _key("p", group, topic, partition),
                    {"transactionalId": transactional_id, "ordinal": ordinal},
                )

        await self._owned(group, write)

    async def clear_pending(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        """Remove the pending markers this transaction left (an abort)."""
        keys = list(keys)

        async def write(p: int) -> None:
            for topic, partition in keys:
                key = _key("p", group, topic, partition)
                doc = self._view.get(p, key)
                if doc is None or doc.get("transactionalId") != transactional_id:
                    continue
                if int(doc["ordinal"]) == ordinal:
                    await self._remove(p, key)

        await self._owned(group, write)

    async def _write(self, p: int, key: str, doc: dict[str, Any]) -> None:
        current = self._view.get(p, key)
        doc = {**doc, "v": int(current.get("v", 0)) + 1 if current else 1}
        await self.parts.write(p, key, json.dumps(doc, separators=(",", ":")).encode())
        self._view.put(p, key, doc)

    async def _remove(self, p: int, key: str) -> None:
        await self.parts.tombstone(p, key)
        self._view.put(p, key, None)

    # -- reads (any sidecar) ---------------------------------------------------------------

    async def fetch(self, group: str, *, require_stable: bool = False) -> list[CommittedOffset]:
        """Every partition the group has an offset (or a pending one) for; a read sees
        every commit made before it, through any sidecar."""
        p = self.parts.partition_of(group)
        await self.parts.read(p)
        committed: dict[tuple[str, int], CommittedOffset] = {}
        pending: set[tuple[str, int]] = set()
        for kind, topic, partition, doc in self._view.group(p, group):
            if kind == "o":
                committed[topic, partition] = CommittedOffset(
                    topic,
                    partition,
                    int(doc["offset"]),
                    str(doc.get("metadata") or ""),
                    int(doc["commitMs"]) if "commitMs" in doc else None,
                )
            else:
                pending.add((topic, partition))
        out = []
        for key in sorted(set(committed) | pending):
            answer = committed.get(key) or CommittedOffset(key[0], key[1], UNKNOWN_OFFSET, "", None)
            if require_stable and key in pending:
                answer = CommittedOffset(
                    answer.topic,
                    answer.partition,
                    UNKNOWN_OFFSET,
                    "",
                    None,
                    errors.UnstableOffsetCommit(
                        f"{key[0]}-{key[1]} has offsets in a transaction that is not complete"
                    ),
                )
            out.append(answer)
        return out
