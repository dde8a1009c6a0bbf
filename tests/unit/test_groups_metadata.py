"""A group's typed state and its pure transitions: membership, resets and their epochs,
where a member starts, what a pull records and a commit takes, what is forgotten."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.protocol.groups import (
    AutoReset,
    Committed,
    Delivery,
    Group,
    GroupConfig,
    Mode,
    Reset,
    Resets,
    StaleMember,
    Start,
    commit_offsets,
    committed_at_reset,
    counts,
    delivery_after_commit,
    delivery_after_pull,
    departed_broadcast_members,
    group_expired,
    plan_start,
    started_at,
)

CLUSTERING = GroupConfig(Mode.CLUSTERING, AutoReset.EARLIEST, 1_000, 5_000)
BROADCAST = GroupConfig(Mode.BROADCAST, AutoReset.EARLIEST, 1_000, 5_000)


def joined(config: GroupConfig, *members: str, partitions: int = 2) -> Group:
    group = Group.new(config)
    for i, m in enumerate(members):
        group, _ = group.join(m, ("t",), {"t": partitions}, now_ms=i)
    return group


# -- membership ------------------------------------------------------------------------------


def test_a_join_rebalances_and_sends_back_the_partitions_that_moved_and_the_joiners_own():
    group = joined(CLUSTERING, "b")
    assert group.assigned("b") == (("t", 0), ("t", 1))
    group, back = group.join("a", ("t",), {"t": 2}, now_ms=10)
    assert (group.generation, group.assigned("a"), group.assigned("b")) == (
        2,
        (("t", 0),),
        (("t", 1),),
    )
    assert back == [("b", ("t", 0))]
    group, back = group.join("b", ("t",), {"t": 2}, now_ms=11)  # a rejoin
    assert back == [("b", ("t", 1))]
    assert group.changed_ms == 11


def test_leave_and_expiry_send_everything_of_the_member_back():
    group = joined(CLUSTERING, "a", "b")
    left, back = group.leave("g", "a", now_ms=50)
    assert set(left.members) == {"b"}
    assert back == [("a", ("t", 0))]
    with pytest.raises(StaleMember) as stale:
        left.leave("g", "a", now_ms=51)
    assert stale.value.error.errno == 25
    assert group.expire(now_ms=999) is None  # b was seen at 1: its session lasts to 1001
    expired = group.expire(now_ms=1_001)
    assert expired is not None
    kept, back, gone = expired
    assert (gone, set(kept.members)) == (["a", "b"], set())
    assert sorted(back) == [("a", ("t", 0)), ("b", ("t", 1))]


def test_a_session_is_refreshed_only_once_a_quarter_of_it_has_passed():
    group = joined(CLUSTERING, "a")
    assert group.seen("a", now_ms=249) is None
    refreshed = group.seen("a", now_ms=250)
    assert refreshed is not None
    assert refreshed.members["a"].last_seen_ms == 250


def test_the_mode_of_a_group_with_members_is_fixed():
    with pytest.raises(errors.InvalidRequest, match="has members"):
        joined(CLUSTERING, "a").configure("g", mode=Mode.BROADCAST, now_ms=0)
    assert (
        Group.new(CLUSTERING).configure("g", mode=Mode.BROADCAST, now_ms=0).mode is Mode.BROADCAST
    )


def test_a_group_reads_back_what_it_stores():
    group = joined(BROADCAST, "a", "b", partitions=3)
    again = Group.from_doc({**group.to_doc(), "v": 7})
    assert again == Group(
        group.config,
        group.generation,
        group.members,
        group.assignment,
        group.partitions,
        group.changed_ms,
        7,
    )
    legacy = {k: v for k, v in group.to_doc().items() if k != "changedMs"}
    assert Group.from_doc(legacy).changed_ms is None


# -- resets ----------------------------------------------------------------------------------


def reset(epoch: int, members: tuple[str, ...] | None = None, offset: int = 0) -> Reset:
    return Reset(epoch, offset, None, "offset", offset, members, 0)


def test_a_later_reset_for_some_members_leaves_the_earlier_one_for_the_others():
    rs = Resets().added(reset(1)).added(reset(2, ("a",)))
    assert [r.epoch for r in rs.entries] == [1, 2]
    assert (rs.for_member("a").epoch, rs.for_member("b").epoch) == (2, 1)
    assert rs.superseded_for(rs.entries[0], "a")
    assert not rs.superseded_for(rs.entries[0], "b")


def test_a_reset_for_everyone_drops_those_before_it():
    rs = Resets().added(reset(1, ("a",))).added(reset(2, ("b",))).added(reset(3))
    assert [r.epoch for r in rs.entries] == [3]


def test_a_reset_whose_members_later_resets_all_cover_is_dropped():
    rs = Resets().added(reset(1, ("a", "b"))).added(reset(2, ("a",)))
    assert [r.epoch for r in rs.entries] == [1, 2]
    rs = rs.added(reset(3, ("b",)))
    assert [r.epoch for r in rs.entries] == [2, 3]


@given(
    st.lists(
        st.one_of(st.none(), st.sets(st.sampled_from("abcd"), min_size=1).map(tuple)),
        min_size=1,
        max_size=12,
    )
)
def test_each_member_is_given_the_latest_reset_that_targets_it(targets):
    rs = Resets()
    for epoch, members in enumerate(targets, start=1):
        rs = rs.added(reset(epoch, members))
    for member in "abcd":
        latest = max(
            (e for e, ms in enumerate(targets, start=1) if ms is None or member in ms),
            default=None,
        )
        found = rs.for_member(member)
        assert (None if found is None else found.epoch) == latest
    assert len(rs.entries) <= 5  # one for everyone and at most one per member after it


def test_a_new_epoch_is_above_every_reset_kept_and_every_epoch_applied():
    rs = Resets().added(reset(3))
    assert rs.next_epoch([]) == 4
    assert rs.next_epoch([7, 2]) == 8  # a reset applied then dropped must not look applied
    assert Resets().next_epoch() == 1


def test_resets_stored_before_a_partition_kept_several_read_as_one():
    legacy = {
        "epoch": 2,
        "offset": 5,
        "position": None,
        "to": "offset",
        "value": 5,
        "members": None,
        "atMs": 9,
        "v": 4,
    }
    rs = Resets.from_doc(legacy)
    assert rs.entries == (Reset(2, 5, None, "offset", 5, None, 9),)
    assert Resets.from_doc({**rs.to_doc(), "v": 5}).entries == rs.entries


def test_forgotten_members_leave_the_resets_that_named_only_them():
    rs = Resets().added(reset(1)).added(reset(2, ("a", "b"))).added(reset(3, ("c",)))
    kept = rs.without(["b", "c"])
    assert [(r.epoch, r.members) for r in kept.entries] == [(1, None), (2, ("a",))]


# -- where a member starts, what a pull records, what a commit takes -----------------------


def test_a_pending_reset_comes_first_and_an_applied_one_stays_applied():
    group = joined(CLUSTERING, "a")
    pending = plan_start(
        group, Delivery(40, "p", 0), reset(2, offset=3), Committed(50), (), None, 0
    )
    assert (pending.offset, pending.start, pending.reset_epoch) == (3, Start.RESET, 2)
    applied = plan_start(
        group, Delivery(None, None, 2), reset(2, offset=3), Committed(3), (), None, 0
    )
    assert (applied.offset, applied.start, applied.reset) == (3, Start.COMMITTED, None)


def test_a_pull_that_applies_a_reset_commits_its_target():
    r = Reset(4, 17, "1:2:0", "timestamp", 123, None, 0)
    assert committed_at_reset(r, now_ms=99) == Committed(17, "1:2:0", "", 99, 99)


def test_a_pull_records_where_the_next_starts_and_keeps_its_age():
    fresh = delivery_after_pull(
        Delivery(),
        committed=None,
        reset_epoch=1,
        first=5,
        end=9,
        position="1:2:3",
        member="m",
        pull="tok",
        now_ms=100,
    )
    assert fresh == Delivery(9, "1:2:3", 1, ((5, 100),), "m", "tok", 100)
    assert started_at(fresh) == 5
    assert counts(20, None, fresh.offset, started_at(fresh)).inflight == 4


def test_a_commit_trims_the_inflight_ages_it_covers():
    d = Delivery(10, None, 0, ((0, 1), (5, 2)), "m", "tok", 2)
    assert delivery_after_commit(d, 6) == Delivery(10, None, 0, ((5, 2),), "m", "tok", 2)
    assert delivery_after_commit(d, 10).inflight == ()
    assert delivery_after_commit(Delivery(), 3) is None


def test_a_commit_of_a_partition_not_assigned_or_reset_since_the_last_pull_is_refused():
    group = joined(CLUSTERING, "a", "b")
    mine = group.assigned("a")
    assert commit_offsets("g", group, "a", None, {}, {}) == [(tp, None) for tp in mine]
    with pytest.raises(StaleMember, match="not assigned"):
        commit_offsets("g", group, "a", [("t", 1, 5)], {}, {})
    with pytest.raises(StaleMember, match="was reset"):
        commit_offsets("g", group, "a", None, {mine[0]: Delivery(3)}, {mine[0]: reset(1)})
    done = {mine[0]: Delivery(3, None, 1)}
    assert commit_offsets("g", group, "a", [("t", 0, 2)], done, {mine[0]: reset(1)})


# -- retention -------------------------------------------------------------------------------


def test_a_group_is_forgotten_only_empty_idle_and_with_nothing_pending():
    empty = Group.new(CLUSTERING).configure("g", now_ms=1_000)
    assert not group_expired(empty, [], pending=False, now_ms=4_999, retention_ms=4_000)
    assert group_expired(empty, [], pending=False, now_ms=5_000, retention_ms=4_000)
    assert not group_expired(empty, [4_500], pending=False, now_ms=5_000, retention_ms=4_000)
    assert not group_expired(empty, [], pending=True, now_ms=9_000, retention_ms=4_000)
    assert not group_expired(
        joined(CLUSTERING, "a"), [], pending=False, now_ms=10**9, retention_ms=1
    )
    assert not group_expired(None, [None], pending=False, now_ms=10**9, retention_ms=1)  # no clock


def test_departed_broadcast_members_go_once_past_broadcast_expire_ms():
    group = joined(BROADCAST, "stays")
    seen = {"stays": 0, "left-long-ago": 0, "left-recently": 9_000}
    assert departed_broadcast_members(group, seen, now_ms=10_000) == ["left-long-ago"]
    assert departed_broadcast_members(joined(CLUSTERING, "a"), seen, now_ms=10**9) == []


def test_a_generation_ahead_of_the_groups_is_named_ahead_not_stale():
    ahead = StaleMember.generation("g", 3, 1).error
    assert isinstance(ahead, errors.IllegalGeneration)
    assert "generation 3 is ahead of group 'g''s generation 1" in ahead.message
    assert "stale" not in ahead.message
    behind = StaleMember.generation("g", 1, 3).error
    assert "generation 1 is stale: group 'g' is at generation 3" in behind.message
