"""Holding a keyed table's read at the one moment that matters: a catch-up reads on a
worker thread (:func:`kop_dedup.pulsar.tables._read_chunk`), so the records it took from
the reader exist only in that thread until the event loop applies them. The tests of a
catch-up cut short (a partition's load cancelled when the partition moves on) hold that
thread there, cancel the catch-up, then let the thread finish::

    held = HeldRead(monkeypatch, key="tid-1")  # the first chunk holding a record of tid-1
    loading = asyncio.ensure_future(table.catch_up())
    await held.taken()          # the worker took the chunk from the reader
    loading.cancel()
    held.release()              # the worker returns it to nobody

Nothing of Pulsar is replaced: the real reader reads from the real broker; only the
moment its chunk is handed back is chosen by the test.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from kop_dedup.pulsar import tables

__all__ = ["HeldRead"]


class HeldRead:
    """Holds the first worker-thread read whose chunk holds a record of ``key``, after it
    took the chunk from the reader, until :meth:`release` (30 s at most)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, key: str) -> None:
        self._taken, self._released = threading.Event(), threading.Event()
        read = tables._read_chunk

        def held(reader: Any, limit: int) -> Any:
            chunk = read(reader, limit)
            if not self._taken.is_set() and any(r.key == key for r in chunk.records):
                self._taken.set()
                self._released.wait(30)
            return chunk

        monkeypatch.setattr(tables, "_read_chunk", held)

    async def taken(self, timeout: float = 30.0) -> None:
        """Once the chunk with the key was taken from the reader (and is held)."""
        if not await asyncio.to_thread(self._taken.wait, timeout):
            raise AssertionError("no read took the key's record")

    def release(self) -> None:
        self._released.set()
