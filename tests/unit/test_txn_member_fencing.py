"""KIP-447 fencing of a transactional offset commit made for a member (pure): the check
the group store runs in the change that writes the pending-offset marker."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.protocol.groups import AutoReset, Group, GroupConfig, Mode
from kop_dedup.protocol.groups.fencing import check_txn_member
from tests.unit.test_classic_group import joined, req, stable

CONFIG = GroupConfig(Mode.CLUSTERING, AutoReset.EARLIEST, 1_000, 5_000)


def _http_group(*members: str) -> Group:
    group = Group.new(CONFIG)
    for i, m in enumerate(members):
        group, _ = group.join(m, ["t"], {"t": 2}, now_ms=i)
    return group


def test_an_http_groups_current_member_and_generation_pass_and_one_past_is_refused():
    group = _http_group("a", "b")
    gen = group.generation
    check_txn_member("g", None, group, "a", gen)
    check_txn_member("g", None, group, None, None)
    for stale in (gen - 1, gen + 1):  # a zombie's, and one never handed out
        with pytest.raises(errors.IllegalGeneration):
            check_txn_member("g", None, group, "a", stale)
    with pytest.raises(errors.UnknownMemberId):
        check_txn_member("g", None, group, "c", gen)
    with pytest.raises(errors.UnknownMemberId):  # the member first, as Kafka checks
        check_txn_member("g", None, group, "c", gen - 1)


def test_no_group_knows_no_member_and_generation_zero_only():
    check_txn_member("g", None, None, None, 0)
    with pytest.raises(errors.IllegalGeneration):
        check_txn_member("g", None, None, None, 1)
    with pytest.raises(errors.UnknownMemberId):
        check_txn_member("g", None, None, "a", 0)


def test_a_kafka_group_fences_the_previous_generation_once_a_member_joined():
    before = stable("a", "b")
    gen = before.generation
    check_txn_member("g", before, None, "a", gen)
    moving = joined(before, "c", 100)  # the round to gen + 1 has begun
    check_txn_member("g", moving, None, "a", gen)  # Kafka: still the group's generation
    after = moving.join(req("a"), 200).join(req("b"), 300)
    assert after.generation == gen + 1
    with pytest.raises(errors.IllegalGeneration):
        check_txn_member("g", after, None, "a", gen)
    check_txn_member("g", after, None, "a", gen + 1)
    with pytest.raises(errors.UnknownMemberId):
        check_txn_member("g", after, None, "zombie", gen + 1)


def test_a_kafka_group_reset_fences_its_generation():
    before = stable("a")
    gen = before.generation
    with pytest.raises(errors.IllegalGeneration, match="stale"):
        check_txn_member("g", before.fenced(1_000), None, "a", gen)
