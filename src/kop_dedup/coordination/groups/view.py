"""What a sidecar has read of the consumer-group log: every key of each partition, by
group, with the newest version of each (pure: no I/O).

Every stored doc carries ``v``, its version, bumped by the partition's owner on each
write. The owner applies its own writes at once and reads them again later (their
echoes), after writes it made since; any reader may read the log while the owner
writes. So the view keeps the doc with the highest version, whatever order it meets
them in, and a version never restarts: a key written again after it was removed
gets a version above every one it had (``floor``), and the echo of a removal (a
tombstone, which carries no version) removes only what it removed, not a newer
write made after it (``graves``, kept until that echo is read).

``floor`` survives compaction (which drops a removed key's records): the store keeps
it in the partition's ``["c", ""]`` doc (``FLOOR_FIELD``), read back here.

>>> view = View(1)
>>> view.put(0, '["o","g","t",0]', {"offset": 5, "v": 3})
>>> view.removed(0, '["o","g","t",0]')
>>> view.next_version(0, '["o","g","t",0]')
4
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from kop_dedup.pulsar.tables import TableRecord

__all__ = ["FLOOR_FIELD", "NO_GROUP", "Doc", "View", "key"]

Doc = dict[str, Any]

NO_GROUP = ""
"""The group of the partition's own keys (``["c", ""]``), never a consumer group."""

FLOOR_FIELD = "floor"
"""The field of the partition's ``["c", ""]`` doc that keeps the highest version of a
removed key (so a key written again after compaction still gets a higher one)."""


def key(kind: str, group: str, *rest: object) -> str:
    """A stored key: a JSON list, the kind first, then the group."""
    return json.dumps([kind, group, *rest], separators=(",", ":"))


_CLEAN = key("c", NO_GROUP)


class View:
    """Every key of the partitions this sidecar has read, and each group's keys."""

    def __init__(self, partitions: int) -> None:
        self._docs: list[dict[str, Doc]] = [{} for _ in range(partitions)]
        self._groups: list[dict[str, set[str]]] = [{} for _ in range(partitions)]
        self._floor = [0] * partitions
        self._graves: list[dict[str, deque[int]]] = [{} for _ in range(partitions)]

    # -- reading the log ------------------------------------------------------------------

    def apply(self, partition: int, record: TableRecord) -> None:
        """A record read from the log (the owner's own echoes included)."""
        if record.value is None:
            self._tombstone(partition, record.key)
        else:
            self.put(partition, record.key, json.loads(record.value))

    def put(self, partition: int, k: str, doc: Doc) -> None:
        """Keep ``doc`` unless the view has a newer version of the key (or removed a
        version at least as new)."""
        docs = self._docs[partition]
        current = docs.get(k)
        version = int(doc.get("v", 0))
        if current is not None and version < int(current.get("v", 0)):
            return
        if current is None and version <= max(self._graves[partition].get(k) or (-1,)):
            return  # the echo of a write this owner removed since
        docs[k] = doc
        self._groups[partition].setdefault(json.loads(k)[1], set()).add(k)
        if k == _CLEAN:
            self._floor[partition] = max(self._floor[partition], int(doc.get(FLOOR_FIELD, 0)))

    def _tombstone(self, partition: int, k: str) -> None:
        graves = self._graves[partition]
        grave = graves.get(k)
        removed: int | None = None
        if grave:
            removed = grave.popleft()
            if not grave:
                del graves[k]
        current = self._docs[partition].get(k)
        if current is None:
            return
        if removed is not None and int(current.get("v", 0)) > removed:
            return  # written again after the removal this echoes
        self._drop(partition, k)

    # -- the owner's own changes ----------------------------------------------------------

    def next_version(self, partition: int, k: str) -> int:
        """The version of the next write of ``k``: above its current one, and above
        every version a removed key of the partition had."""
        current = self._docs[partition].get(k)
        return max(int(current.get("v", 0)) if current else 0, self._floor[partition]) + 1

    def removed(self, partition: int, k: str) -> None:
        """The owner removed ``k`` (its tombstone is on its way)."""
        current = self._docs[partition].get(k)
        if current is None:
            return
        self._graves[partition].setdefault(k, deque()).append(int(current.get("v", 0)))
        self._drop(partition, k)

    def floor(self, partition: int) -> int:
        return self._floor[partition]

    def _drop(self, partition: int, k: str) -> None:
        doc = self._docs[partition].pop(k)
        self._floor[partition] = max(self._floor[partition], int(doc.get("v", 0)))
        group = json.loads(k)[1]
        keys = self._groups[partition].get(group)
        if keys is not None:
            keys.discard(k)
            if not keys:
                del self._groups[partition][group]

    # -- queries --------------------------------------------------------------------------

    def get(self, partition: int, k: str) -> Doc | None:
        return self._docs[partition].get(k)

    def group(self, partition: int, group: str) -> list[tuple[list[Any], Doc]]:
        docs = self._docs[partition]
        return [(json.loads(k), docs[k]) for k in sorted(self._groups[partition].get(group, ()))]

    def groups(self, partition: int) -> list[str]:
        return [g for g, keys in self._groups[partition].items() if keys and g != NO_GROUP]

    def holds(self, partition: int, group: str) -> bool:
        return bool(self._groups[partition].get(group))

    def group_count(self, partition: int) -> int:
        """Groups the partition holds (not the store's own bookkeeping)."""
        groups = self._groups[partition]
        return len(groups) - (NO_GROUP in groups)

    def size(self, partition: int) -> int:
        """Keys held for the partition (its own included), and removals not echoed yet."""
        return len(self._docs[partition]) + len(self._graves[partition])

    def clear(self, partition: int) -> None:
        self._docs[partition] = {}
        self._groups[partition] = {}
        self._graves[partition] = {}
        self._floor[partition] = 0
