"""Per-member locks of the group coordinator: a member's pulls through one sidecar run
one at a time (a pull plans from where the previous one ended)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["MemberLocks"]


class MemberLocks:
    """One lock per member pulling through this sidecar, kept only while a pull of
    that member waits or runs (bounded by the pulls in flight)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._held)

    @contextlib.asynccontextmanager
    async def hold(self, group: str, member: str) -> AsyncIterator[None]:
        k = (group, member)
        lock, users = self._held.get(k, (asyncio.Lock(), 0))
        self._held[k] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._held[k]
            if users == 1:
                del self._held[k]
            else:
                self._held[k] = (lock, users - 1)
