"""The grants' cache drops its least recently used entry when full (pure)."""

from __future__ import annotations

import pytest

from kop_dedup.pulsar.grants import Recent


def test_one_past_capacity_drops_the_least_recently_used_entry():
    cache = Recent(3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"  # used: now the most recent
    cache.put("d", "D")
    assert len(cache) == 3
    assert cache.get("b") is None
    assert [cache.get(k) for k in "acd"] == ["A", "C", "D"]


def test_putting_a_held_key_again_replaces_it_without_dropping_another():
    cache = Recent(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)
    assert (cache.get("a"), cache.get("b"), len(cache)) == (3, 2, 2)


def test_a_cache_holds_at_least_one_entry():
    with pytest.raises(ValueError, match="at least 1"):
        Recent(0)
