"""A map that keeps at most ``capacity`` entries, dropping the least recently used.

Used for what the sidecar remembers beyond the broker's word (where producers started,
which epochs had state on a partition, stats per producer): useful, never required for
correctness, and never allowed to grow without bound.

>>> m = BoundedMap[str, int](capacity=2)
>>> m["a"] = 1; m["b"] = 2; m["c"] = 3
>>> list(m), m.dropped
(['b', 'c'], 1)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["BoundedMap"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedMap(Generic[K, V]):
    """An LRU map: reads and writes make an entry the most recent; ``dropped`` counts
    the entries pushed out by the bound."""

    __slots__ = ("_data", "capacity", "dropped")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.dropped = 0
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, default: V | None = None) -> V | None:
        try:
            value = self._data[key]
        except KeyError:
            return default
        self._data.move_to_end(key)
        return value

    def __getitem__(self, key: K) -> V:
        value = self._data[key]
        self._data.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.dropped += 1

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._data.pop(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def items(self) -> list[tuple[K, V]]:
        """Every entry, least recent first, without making any of them more recent."""
        return list(self._data.items())
