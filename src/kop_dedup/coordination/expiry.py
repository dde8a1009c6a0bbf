"""Bounded registry state: entries expire a while after they were last set, and a cap
drops the oldest first. Pure; the caller supplies the time (epoch milliseconds).

An entry's time is when its value was last set (for a table, the broker's publish
time of its latest record). Entries are kept in that order, so expiring and
capping cost one step per entry dropped, never a scan of the map::

    bounds = Bounds(expiry_ms=7 * 86_400_000, max_entries=200_000)
    entries: ExpiringMap[int, int] = ExpiringMap(bounds)
    entries.put(42, 3, at_ms=now)
    dropped = entries.expire(now + bounds.expiry_ms)   # [(42, 3, now)]

``expire`` drops entries from the oldest while they are expired, so an entry
set with a time older than an entry already behind it (clocks of two machines,
a re-read record) expires when that one does: never early, at most that late.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Bounds", "ExpiringMap"]

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Bounds:
    expiry_ms: int
    """An entry is dropped this long after it was last set."""
    max_entries: int
    """Above this many entries the oldest is dropped."""

    def __post_init__(self) -> None:
        if self.expiry_ms <= 0 or self.max_entries <= 0:
            raise ValueError(f"bounds must be positive: {self}")


class ExpiringMap(Generic[K, V]):
    """A map whose entries expire and whose size is capped, oldest dropped first."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.capped = 0
        """Entries dropped by the cap since the last :meth:`take_capped`."""

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def entry(self, key: K) -> tuple[V, int] | None:
        """(value, time it was last set) or None."""
        return self._entries.get(key)

    def put(self, key: K, value: V, at_ms: int) -> None:
        """Set ``key`` as of ``at_ms``; it moves behind the others unless it goes back in
        time (then it keeps its place, and expires no earlier than its neighbours)."""
        old = self._entries.get(key)
        self._entries[key] = (value, at_ms)
        if old is None:
            if len(self._entries) > self.bounds.max_entries:
                self._entries.popitem(last=False)
                self.capped += 1
        elif at_ms >= old[1]:
            self._entries.move_to_end(key)

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        return None if entry is None else entry[0]

    def expire(self, now_ms: int) -> list[tuple[K, V, int]]:
        """Drop and return the entries set ``expiry_ms`` or longer before ``now_ms``."""
        cutoff = now_ms - self.bounds.expiry_ms
        dropped: list[tuple[K, V, int]] = []
        while self._entries:
            key, (value, at) = next(iter(self._entries.items()))
            if at > cutoff:
                break
            self._entries.popitem(last=False)
            dropped.append((key, value, at))
        return dropped

    def has_expired(self, now_ms: int) -> bool:
        """Whether :meth:`expire` would drop anything now."""
        if not self._entries:
            return False
        _, (_, at) = next(iter(self._entries.items()))
        return at <= now_ms - self.bounds.expiry_ms

    def take_capped(self) -> int:
        """Entries dropped by the cap since the last call."""
        capped, self.capped = self.capped, 0
        return capped

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
