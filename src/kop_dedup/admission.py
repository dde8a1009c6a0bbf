"""Admission: a budget of request bytes in flight, first come first served (the HTTP
produce endpoint's raw bodies; a Kafka connection's inflated Produce batches).

The sidecar holds every record of a produce request in memory until Pulsar has
answered for it, and Python needs many times a record's wire size for it
(about 20x for 100-byte values). Without a bound, many producers with large
batches in flight can take the process past its memory limit. A request waits
for its share of the budget after its body is read and before it is parsed
(the raw body costs its size, the parsed records many times that), much as
Kafka's broker stops reading requests when its request memory pool
(``queued.max.request.bytes``) is used up.

>>> budget = ByteBudget(100)
>>> async def serve():
...     async with budget.hold(60):
...         ...  # parse and publish the body that was read

Waiters are admitted strictly in arrival order, so a large request is not
starved by a stream of small ones. A request larger than the whole budget is
admitted alone, when nothing else is in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["ByteBudget"]


class ByteBudget:
    """At most ``capacity`` bytes held at once (one oversized holder alone)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1 byte")
        self.capacity = capacity
        self.in_use = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for their share."""
        return len(self._waiters)

    def _fits(self, n: int) -> bool:
        return self.in_use == 0 or self.in_use + n <= self.capacity

    async def acquire(self, n: int) -> None:
        """Wait until ``n`` bytes are free (in arrival order), then take them.
        Zero bytes never wait."""
        n = min(n, self.capacity)
        if n <= 0:
            return
        if not self._waiters and self._fits(n):
            self.in_use += n
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((n, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if not waiter.cancelled():  # granted just as we were cancelled
                self.release(n)
            elif (n, waiter) in self._waiters:
                self._waiters.remove((n, waiter))
                self._wake()  # the head may have changed
            raise

    def release(self, n: int) -> None:
        self.in_use -= max(0, min(n, self.capacity))
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, waiter = self._waiters.popleft()
            if waiter.cancelled():  # its task gives up; nothing to hand it
                continue
            self.in_use += n
            waiter.set_result(None)

    @asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        await self.acquire(n)
        try:
            yield
        finally:
            self.release(n)
