"""An answer reused for a while: what a probe may ask as often as it likes.

``/readyz`` asks the broker whether deduplication is on; Kubernetes probes it every few
seconds per pod, and anyone who can reach it may call it in a loop. :class:`Reused`
asks at most once per ``ttl_s`` (concurrent callers share one call) and hands out the
last answer meanwhile.

>>> ready = Reused(ask_broker, ttl_s=READY_TTL_S)
>>> await ready.get()
(True, 'ok')
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["READY_TTL_S", "Reused"]

T = TypeVar("T")

READY_TTL_S = 2.0
"""How long a readiness answer is reused (a probe's period is 5 s or more)."""


class Reused(Generic[T]):
    """``ask()``'s answer, asked again only once it is ``ttl_s`` old."""

    def __init__(self, ask: Callable[[], Awaitable[T]], *, ttl_s: float) -> None:
        self._ask, self._ttl = ask, ttl_s
        self._last: tuple[float, T] | None = None
        self._pending: asyncio.Future[T] | None = None

    async def get(self) -> T:
        last = self._last
        if last is not None and time.monotonic() - last[0] < self._ttl:
            return last[1]
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._refresh())
        return await asyncio.shield(self._pending)

    async def _refresh(self) -> T:
        answer = await self._ask()
        self._last = (time.monotonic(), answer)
        return answer
