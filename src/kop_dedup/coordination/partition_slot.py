"""One state partition as a node holds it: its keyed table (every node reads it), its
fenced writer (the owner writes it) and the ownership markers that tell a new owner it
has read everything (:mod:`kop_dedup.coordination.partitions` uses them)."""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from kop_dedup.pulsar.exclusive import FencedWriter
from kop_dedup.pulsar.tables import KeyedTable, PulsarClient, TableRecord

__all__ = [
    "OWNER_KEY",
    "Acquired",
    "Apply",
    "Lost",
    "OwnerOf",
    "Released",
    "Slot",
    "Writers",
    "handed_off",
    "partition_of",
]

log = logging.getLogger("kop_dedup.coordination.partitions")

OWNER_KEY = "__owner__"
"""The key of ownership markers; never a coordinator key."""


def partition_of(key: str, partitions: int) -> int:
    """The partition of a key: stable across sidecars, processes and versions (CRC-32)."""
    return zlib.crc32(key.encode("utf-8")) % partitions


Apply = Callable[[int, TableRecord], None]
Acquired = Callable[[int, bool], Coroutine[Any, Any, None]]
"""``(partition, orphan)``: this node just loaded the partition; ``orphan``: the broker
listed no writer on it (its previous owner went away, cleanly or not)."""
Released = Callable[[int], Awaitable[None]]
Lost = Callable[[int], None]
Writers = Callable[[], Awaitable[dict[int, list[str]]]]
"""Names of the producers the broker has on each partition (the admin API's stats)."""
OwnerOf = Callable[[int], str]
"""Who owns a partition, for messages (``"node 3 (10.0.0.7:9092)"``)."""


class Slot:
    __slots__ = (
        "acquiring",
        "index",
        "last_marker",
        "loaded",
        "lock",
        "marker",
        "marker_seen",
        "table",
        "topic",
        "writer",
    )

    def __init__(self, client: PulsarClient, topic: str, index: int, apply: Apply) -> None:
        self.index, self.topic = index, topic
        self.marker: str | None = None
        self.last_marker: str | None = None  # the latest ownership marker read (anyone's)
        self.marker_seen = asyncio.Event()
        self.loaded = asyncio.Event()  # set while this node holds the partition, loaded
        self.acquiring: asyncio.Task[None] | None = None

        def apply_record(record: TableRecord) -> None:
            if record.key == OWNER_KEY:
                if record.value is not None:
                    self.last_marker = record.value.decode()
                    if self.last_marker == self.marker:
                        self.marker_seen.set()
                return
            apply(index, record)

        self.table = KeyedTable(client, topic, apply_record)
        self.writer = FencedWriter(client, topic)
        self.lock = asyncio.Lock()


async def handed_off(slot: Slot, writers: Writers, wait_s: float, name: str, poll_s: float) -> bool:
    """Wait until the broker lists no writer on the slot's partition but ours (its
    previous owner released it, or went away), at most ``wait_s``: then it is taken
    anyway (a node that hangs is fenced). Whether none was listed at once (the previous
    owner was gone: an orphan)."""
    deadline = time.monotonic() + wait_s
    first = True
    while True:
        try:
            live = (await writers()).get(slot.index, [])
        except Exception as exc:  # cannot tell: recovering costs duplicates, not losses
            log.info("%s: who writes partition %d? %r", name, slot.index, exc)
            return True
        live = [w for w in live if w != slot.writer.name]
        if not live:
            return first
        if time.monotonic() > deadline:
            log.warning(
                "%s: partition %d is still written by %s after %.1f s: taking it",
                name,
                slot.index,
                ",".join(live),
                wait_s,
            )
            return False
        first = False
        await asyncio.sleep(poll_s)
