"""The per-role share of a global cap (:mod:`kop_dedup.security.quotas`)."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.security.quotas import RoleCounts, RoleQuota, owner_quotas, share
from kop_dedup.settings import Settings


def test_share_rounds_down_and_is_at_least_one():
    assert share(10, 25) == 2
    assert share(3, 10) == 1
    assert share(1_000_000, 100) == 1_000_000


def test_one_past_the_share_is_throttled_naming_the_quota_and_setting():
    quota = RoleQuota("consumer groups", "MAX_GROUPS", cap=10, percent=30)
    quota.check("alice", 2)  # the third is allowed
    with pytest.raises(errors.ThrottlingQuotaExceeded) as raised:
        quota.check("alice", 3)
    assert "KOP_DEDUP_MAX_GROUPS" in raised.value.message
    assert "KOP_DEDUP_ROLE_QUOTA_PERCENT" in raised.value.message


def test_connections_are_counted_per_role_and_released():
    counts = RoleCounts.connections(Settings(role_quota_percent=50, kafka_max_connections=4))
    assert counts.acquire("alice")
    assert counts.acquire("alice")
    with pytest.raises(errors.ThrottlingQuotaExceeded):
        counts.acquire("alice")
    assert counts.acquire("bob")
    counts.release("alice")
    assert counts.acquire("alice")


def test_at_one_hundred_percent_nothing_is_counted():
    settings = Settings(role_quota_percent=100)
    assert owner_quotas(settings) == {}
    assert RoleCounts.connections(settings).acquire("alice") is False
