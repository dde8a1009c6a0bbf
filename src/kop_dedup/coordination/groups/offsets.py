"""Kafka-style committed offsets of a group: the ``["o", group, topic, partition]`` keys
of the group store, written by plain commits, by a committed transaction
(:mod:`.pending`) and by members of HTTP groups (:mod:`.coordinator`), read by fetches
and the lag view.

Usable on its own by any coordinator that keeps its members elsewhere (Kafka's classic
group protocol decides generations itself and only commits and fetches here)::

    await store.commit(group, [StagedOffset("t", 0, 42)])
    answers = await store.fetch(group, require_stable=True)   # 88 while pending

A committed offset is Kafka's: the next record to read. ``position`` (the Pulsar
position of that record, when known) lets a pull start without a lookup.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.access import StoreAccess
from kop_dedup.coordination.groups.view import Doc, key
from kop_dedup.coordination.names import validate_group_id, validate_topics

__all__ = ["UNKNOWN_OFFSET", "CommittedOffset", "Offsets", "StagedOffset", "offset_doc"]

UNKNOWN_OFFSET = -1
"""Kafka's answer for a partition with no committed offset."""


@dataclass(frozen=True, slots=True)
class StagedOffset:
    """An offset to commit (the next record to read)."""

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


def offset_doc(o: StagedOffset, now_ms: int) -> Doc:
    """The stored form of a committed offset."""
    return {"offset": o.offset, "position": o.position, "metadata": o.metadata, "commitMs": now_ms}


class Offsets:
    """Plain commits and fetches of a group's offsets (see the module docstring)."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def commit(self, group: str, offsets: Iterable[StagedOffset]) -> None:
        """Commit the group's offsets, durably. A transaction's pending marker on the
        same partitions stays: that transaction still decides whether its own offsets
        apply (Kafka keeps pending transactional offsets across plain commits too)."""
        offsets = list(offsets)
        validate_group_id(group)
        validate_topics(o.topic for o in offsets)  # before it is stored (a lag view reads it)
        now = now_ms()
        store = self._store

        async def change(p: int) -> None:
            for o in offsets:
                await store.write(p, key("o", group, o.topic, o.partition), offset_doc(o, now))

        await store.owned(group, change)

    async def fetch(self, group: str, *, require_stable: bool = False) -> list[CommittedOffset]:
        """Every partition the group has an offset (or a pending one) for; a read sees
        every commit made before it, through any sidecar. ``require_stable``: a partition
        with offsets pending in a transaction answers 88 UNSTABLE_OFFSET_COMMIT."""
        store = self._store
        await store.read(group)
        committed: dict[tuple[str, int], CommittedOffset] = {}
        pending: set[tuple[str, int]] = set()
        for k, doc in store.docs(group):
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
