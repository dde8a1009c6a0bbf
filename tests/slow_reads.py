"""A read on a worker thread made slow inside the client's calls, and every close of a
Pulsar reader of one topic recorded with how many such reads were inside at that
moment: the tests that cut a read short (cancel it) check that its reader is closed
only once the thread returned, never under it::

    slow = SlowRead(monkeypatch, fetching, "read_available", topic, hold_after_read=True)
    reading = asyncio.ensure_future(reader.read(1 << 20))
    await slow.inside()          # the worker thread is in the read, held
    reading.cancel()
    await slow.close_within(2)   # a close that does not wait comes now
    slow.release()
    assert slow.closes == [0]    # closed once the thread returned

Nothing of Pulsar is replaced: the real read runs on the real reader; only how long
the thread stays inside it is chosen by the test.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pulsar.asyncio as pulsar_async
import pytest

__all__ = ["SlowRead"]


class SlowRead:
    """``module.name`` (a function a worker thread runs) held, at its first call, until
    :meth:`release` (30 s at most): after the real read (``hold_after_read``) or
    before it."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        module: Any,
        name: str,
        topic: str,
        *,
        hold_after_read: bool,
    ) -> None:
        self._taken, self._released = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._inside = 0
        self.closes: list[int] = []
        """For each close of a reader of ``topic``: the reads inside at that moment."""
        read = getattr(module, name)

        def slow(*args: Any) -> Any:
            with self._lock:
                self._inside += 1
            try:
                if not hold_after_read:
                    self._hold()
                out = read(*args)
                if hold_after_read:
                    self._hold()
                return out
            finally:
                with self._lock:
                    self._inside -= 1

        monkeypatch.setattr(module, name, slow)
        close = pulsar_async.Reader.close

        async def closing(reader: Any) -> None:
            if topic in reader.topic():
                with self._lock:
                    self.closes.append(self._inside)
            await close(reader)

        monkeypatch.setattr(pulsar_async.Reader, "close", closing)

    def _hold(self) -> None:
        if not self._taken.is_set():
            self._taken.set()
            self._released.wait(30)

    async def inside(self, timeout: float = 30.0) -> None:
        """Once a worker thread is in the read, held."""
        assert await asyncio.to_thread(self._taken.wait, timeout), "no read came"

    async def close_within(self, timeout: float) -> None:
        """Wait until a reader of the topic was closed, ``timeout`` s at most."""
        deadline = time.monotonic() + timeout
        while not self.closes and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def release(self) -> None:
        self._released.set()
