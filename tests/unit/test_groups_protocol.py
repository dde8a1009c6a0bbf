"""Consumer groups as pure data: assignment, sessions, the broadcast minimum, where a
member starts, exact counts and inflight ages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.protocol.groups import (
    AutoReset,
    GroupConfig,
    Member,
    Mode,
    Start,
    assign,
    broadcast_minimum,
    counts,
    expired,
    inflight_after_commit,
    inflight_after_pull,
    oldest_inflight_ms,
    start_offset,
)

# -- assignment and sessions ------------------------------------------------------------


def test_clustering_spreads_each_topics_partitions_round_robin_in_member_id_order():
    got = assign(Mode.CLUSTERING, {"b": ("t", "u"), "a": ("t",)}, {"t": 3, "u": 2})
    assert got == {"a": (("t", 0), ("t", 2)), "b": (("t", 1), ("u", 0), ("u", 1))}


def test_broadcast_gives_every_member_every_partition_of_its_topics():
    got = assign(Mode.BROADCAST, {"a": ("t",), "b": ("t", "u")}, {"t": 2, "u": 1})
    assert got == {"a": (("t", 0), ("t", 1)), "b": (("t", 0), ("t", 1), ("u", 0))}


@given(
    members=st.dictionaries(
        st.text(min_size=1, max_size=4),
        st.lists(st.sampled_from(["t", "u", "v"]), min_size=1, max_size=3).map(tuple),
        min_size=1,
        max_size=6,
    ),
    partitions=st.fixed_dictionaries(
        {"t": st.integers(0, 8), "u": st.integers(0, 8), "v": st.integers(0, 8)}
    ),
)
def test_clustering_gives_each_subscribed_partition_to_exactly_one_subscriber(members, partitions):
    got = assign(Mode.CLUSTERING, members, partitions)
    owners: dict[tuple[str, int], list[str]] = {}
    for member, tps in got.items():
        for tp in tps:
            assert tp[0] in members[member]
            owners.setdefault(tp, []).append(member)
    subscribed = {t for topics in members.values() for t in topics}
    assert set(owners) == {(t, p) for t in subscribed for p in range(partitions[t])}
    assert all(len(who) == 1 for who in owners.values())
    assert got == assign(Mode.CLUSTERING, dict(reversed(list(members.items()))), partitions)


def test_a_session_expires_at_its_timeout_not_before():
    config = GroupConfig(session_timeout_ms=1_000)
    member = Member("m", ("t",), joined_ms=0, last_seen_ms=5_000)
    assert not expired(member, config, now_ms=5_999)
    assert expired(member, config, now_ms=6_000)


# -- the broadcast minimum and where a member starts --------------------------------------


@pytest.mark.parametrize(
    ("seen", "counted"),
    [(9_000, True), (10_000 - 1_500, True), (10_000 - 1_501, False), (0, False)],
    ids=["recent", "exactly-expire-ms-ago", "one-ms-beyond", "long-ago"],
)
def test_a_member_counts_for_the_minimum_when_seen_within_broadcast_expire_ms(seen, counted):
    minimum = broadcast_minimum([(3, seen), (8, 10_000)], now_ms=10_000, expire_ms=1_500)
    assert minimum == (3 if counted else 8)


def test_no_member_seen_recently_means_no_minimum():
    assert broadcast_minimum([(3, 0)], now_ms=10_000, expire_ms=1_500) is None
    assert broadcast_minimum([], now_ms=10_000, expire_ms=1_500) is None


def start(mode: Mode = Mode.BROADCAST, **kw):
    args = {
        "delivered": None,
        "own": None,
        "others": [],
        "floor": None,
        "auto_offset_reset": AutoReset.LATEST,
        "now_ms": 10_000,
        "expire_ms": 1_000,
    } | kw
    return start_offset(mode, **args)


def test_a_member_starts_where_its_deliveries_stand_then_its_commit_then_the_minimum():
    others = [(4, 9_500), (7, 9_900)]
    assert start(delivered=9, own=5, others=others, floor=1) == (9, Start.DELIVERED)
    assert start(own=5, others=others, floor=1) == (5, Start.COMMITTED)
    assert start(others=others, floor=1) == (4, Start.GROUP_MINIMUM)
    assert start(others=[(4, 0)], floor=1) == (1, Start.FLOOR)  # 4 expired
    assert start() == (None, Start.LATEST)
    assert start(auto_offset_reset=AutoReset.EARLIEST) == (None, Start.EARLIEST)


def test_clustering_ignores_other_members_offsets():
    assert start(Mode.CLUSTERING, others=[(4, 9_900)], floor=2) == (2, Start.FLOOR)


def test_auto_offset_reset_none_with_nothing_stored_is_offset_out_of_range():
    with pytest.raises(errors.OffsetOutOfRange, match="autoOffsetReset is none"):
        start(auto_offset_reset=AutoReset.NONE)


# -- counts ---------------------------------------------------------------------------------


def test_ready_inflight_and_lag_are_differences_of_offsets():
    c = counts(end=23, committed=7, pulled=12)
    assert (c.ready, c.inflight, c.lag) == (11, 5, 16)
    assert c.ready + c.inflight == c.lag


def test_a_member_that_pulled_nothing_stands_at_its_commit():
    c = counts(end=10, committed=4, pulled=None)
    assert (c.pulled, c.ready, c.inflight, c.lag) == (4, 6, 0, 6)


def test_with_nothing_committed_only_ready_is_known():
    c = counts(end=10, committed=None, pulled=3)
    assert (c.ready, c.inflight, c.lag) == (7, None, None)
    assert counts(end=10, committed=None, pulled=None).ready is None


def test_counts_are_never_negative():
    c = counts(end=5, committed=9, pulled=7)  # a commit past what was pulled and the end
    assert (c.ready, c.inflight, c.lag) == (0, 0, 0)


# -- inflight ages ----------------------------------------------------------------------------


def test_the_oldest_inflight_record_was_answered_by_the_pull_holding_the_committed_offset():
    entries = inflight_after_pull([], committed=0, start=0, end=3, now_ms=100)
    entries = inflight_after_pull(entries, committed=0, start=3, end=6, now_ms=200)
    assert entries == [(0, 100), (3, 200)]
    assert oldest_inflight_ms(entries, committed=0, pulled=6) == 100
    assert oldest_inflight_ms(entries, committed=4, pulled=6) == 200
    assert oldest_inflight_ms(entries, committed=6, pulled=6) is None
    assert inflight_after_commit(entries, 4) == [(3, 200)]
    assert inflight_after_commit(entries, 6) == [(3, 200)]


def test_an_empty_pull_adds_no_entry():
    assert inflight_after_pull([(0, 100)], committed=0, start=3, end=3, now_ms=200) == [(0, 100)]


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("pull"), st.integers(0, 5)),
            st.tuples(st.just("commit"), st.integers(0, 5)),
        ),
        max_size=200,
    )
)
def test_the_oldest_inflight_age_is_exact_and_never_understated_when_bounded(steps):
    """Against a record-by-record model: exact while at most 64 pulls are open, never
    younger than the truth past that."""
    entries: list[tuple[int, int]] = []
    delivered_at: dict[int, int] = {}
    pulled, committed = 0, 0
    for now, (what, n) in enumerate(steps, start=1):
        if what == "pull":
            entries = inflight_after_pull(entries, committed, pulled, pulled + n, now)
            for offset in range(pulled, pulled + n):
                delivered_at[offset] = now
            pulled += n
        else:
            committed = min(committed + n, pulled)
            entries = inflight_after_commit(entries, committed)
        got = oldest_inflight_ms(entries, committed, pulled)
        truth = delivered_at.get(committed) if committed < pulled else None
        if truth is None:
            assert got is None
        else:
            assert got is not None
            assert got <= truth
        assert len(entries) <= 64
    open_pulls = len({delivered_at[o] for o in range(committed, pulled)})
    if open_pulls <= 63 and committed < pulled:
        assert oldest_inflight_ms(entries, committed, pulled) == delivered_at[committed]
