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
import time
from typing import Any

import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar import tables

__all__ = ["HeldRead", "InsideRead"]


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


class InsideRead:
    """A worker-thread read held *inside* the client's ``read_next`` (a slow read): the
    first chunk read of ``topic`` that takes a record of ``key`` does not return from
    ``read_next`` until :meth:`release` (30 s at most). Every close of a reader of
    ``topic`` records how many calls of a worker thread were inside that reader then
    (:attr:`closes`): a close under a read races in the C++ client.

    Nothing of Pulsar is replaced: the real reader reads from the real broker; the
    wrapper around it only delays the return of one call and counts.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, topic: str, key: str) -> None:
        self._topic, self._key = topic, key
        self._taken, self._released = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._inside: dict[int, int] = {}
        """Calls inside each client reader (by id) now."""
        self.closes: list[int] = []
        """For each close of a reader of the topic: the calls inside it at that moment."""
        read = tables._read_chunk

        def read_chunk(reader: Any, limit: int) -> Any:
            return read(_Counted(self, reader), limit)

        monkeypatch.setattr(tables, "_read_chunk", read_chunk)
        close = pulsar_async.Reader.close

        async def closing(reader: Any) -> None:
            if self._topic in reader.topic():
                with self._lock:
                    self.closes.append(self._inside.get(id(reader._reader), 0))
            await close(reader)

        monkeypatch.setattr(pulsar_async.Reader, "close", closing)

    def _enter(self, reader: Any) -> None:
        with self._lock:
            self._inside[id(reader)] = self._inside.get(id(reader), 0) + 1

    def _leave(self, reader: Any) -> None:
        with self._lock:
            self._inside[id(reader)] -= 1

    def _hold(self, msg: Any) -> None:
        if not self._taken.is_set() and msg.partition_key() == self._key:
            self._taken.set()
            self._released.wait(30)

    async def inside(self, timeout: float = 30.0) -> None:
        """Once a worker thread is inside ``read_next``, holding the key's record."""
        if not await asyncio.to_thread(self._taken.wait, timeout):
            raise AssertionError("no read took the key's record")

    async def closed(self, timeout: float) -> bool:
        """Whether a reader of the topic is closed within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self.closes and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return bool(self.closes)

    def release(self) -> None:
        self._released.set()


class _Counted:
    """The client's reader, its calls counted while inside (see :class:`InsideRead`)."""

    def __init__(self, held: InsideRead, reader: Any) -> None:
        self._held, self._reader = held, reader

    def read_next(self, timeout_ms: int) -> Any:
        self._held._enter(self._reader)
        try:
            msg = self._reader.read_next(timeout_ms)
            self._held._hold(msg)
            return msg
        finally:
            self._held._leave(self._reader)

    def has_message_available(self) -> bool:
        self._held._enter(self._reader)
        try:
            return bool(self._reader.has_message_available())
        finally:
            self._held._leave(self._reader)
