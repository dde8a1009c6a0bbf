"""The placement rules: the same inputs give every node the same answer, spread evenly;
a topic that grows keeps its leaders; a membership change moves little (and a
coordinator log, whose count is fixed, moves less)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup.cluster.placement import (
    GROUP_LOG,
    TRANSACTION_LOG,
    ClusterView,
    Member,
    owner_at,
    place,
    score,
)

nodes_st = st.sets(st.integers(min_value=0, max_value=2**31 - 2), min_size=1, max_size=12)


def _view(*ids: int) -> ClusterView:
    return ClusterView.of(Member(i, "127.0.0.1", 9000 + i % 1000) for i in ids)


def test_score_is_stable_across_processes_and_versions():
    # a change here moves every partition of every cluster on upgrade, and two versions
    # in one cluster would disagree on every owner: never change it
    assert score(1, "topic:orders/0") == 0x8D6AD03255B02A05
    assert score(1, "topic:orders/0") != score(2, "topic:orders/0")


def test_twelve_partitions_over_three_nodes_are_spread_four_four_four():
    view = _view(1, 2, 3)
    assert sorted(Counter(view.place("topic:orders", 12).values()).values()) == [4, 4, 4]


def test_the_coordinator_logs_keep_the_placement_they_had_before_topics_grew_stably():
    # bounded load, as before: a change here moves state partitions on upgrade, and nodes
    # of two versions would fence each other's coordinators
    assert place(TRANSACTION_LOG, 8, [1, 2, 3]) == (2, 3, 1, 3, 2, 1, 1, 3)
    assert place(GROUP_LOG, 8, [1, 2, 3]) == (2, 3, 3, 1, 3, 2, 1, 1)
    with pytest.raises(ValueError, match="depend on its count"):
        owner_at(GROUP_LOG, 0, [1, 2])


@pytest.mark.parametrize("group", ["g", TRANSACTION_LOG])
@given(nodes=nodes_st, count=st.integers(min_value=1, max_value=64))
def test_every_thing_has_one_owner_among_the_nodes_and_no_node_holds_more_than_its_cap(
    group, nodes, count
):
    owners = place(group, count, sorted(nodes))
    assert len(owners) == count
    assert set(owners) <= nodes
    loads = Counter(owners)
    cap = -(-count // len(nodes))
    assert max(loads.values()) <= cap


@pytest.mark.parametrize("group", ["g", GROUP_LOG])
@given(nodes=nodes_st, count=st.integers(min_value=1, max_value=32))
def test_the_answer_does_not_depend_on_the_order_nodes_are_listed_in(group, nodes, count):
    forward = place(group, count, sorted(nodes))
    backward = place(group, count, sorted(nodes, reverse=True))
    assert forward == backward


@given(
    nodes=st.sets(st.integers(min_value=0, max_value=10_000), min_size=2, max_size=8),
    count=st.integers(min_value=8, max_value=64),
)
def test_a_node_that_leaves_moves_its_things_and_leaves_some_others_in_place(nodes, count):
    before = place("g", count, sorted(nodes))
    gone = min(nodes)
    after = place("g", count, sorted(nodes - {gone}))
    assert gone not in after
    kept = sum(1 for b, a in zip(before, after, strict=True) if b == a)
    # rounds regroup when the node count changes, so some others move (the average is
    # the next test's); a sixth of them at least stays (the worst of 40,000 seeded cases
    # kept a fifth)
    assert kept >= (count - before.count(gone)) // 6


@given(
    nodes=st.sets(st.integers(min_value=0, max_value=10_000), min_size=2, max_size=8),
    count=st.integers(min_value=8, max_value=64),
)
def test_a_coordinator_log_node_that_leaves_moves_its_things_and_few_others(nodes, count):
    before = place(TRANSACTION_LOG, count, sorted(nodes))
    gone = min(nodes)
    after = place(TRANSACTION_LOG, count, sorted(nodes - {gone}))
    moved_others = sum(1 for b, a in zip(before, after, strict=True) if b not in (gone, a))
    # bounded load can cascade a few; far from the modulo rule that moves most things
    assert moved_others <= count // 2


@given(
    nodes=st.sets(st.integers(min_value=0, max_value=2**31 - 2), min_size=1, max_size=12),
    index=st.integers(min_value=0, max_value=100),
)
def test_a_partitions_leader_is_the_same_asked_with_or_without_the_count(nodes, index):
    assert owner_at("topic:t", index, sorted(nodes)) == place("topic:t", index + 1, nodes)[index]


def _unforced_moved(before: tuple[int, ...], after: tuple[int, ...], forced: int) -> float:
    """Of the things whose owner neither left nor is the node that joined, the share
    that moved."""
    free = [(b, a) for b, a in zip(before, after, strict=True) if forced not in (a, b)]
    return sum(1 for b, a in free if b != a) / len(free)


def test_a_membership_change_moves_on_average_under_a_third_of_what_it_need_not():
    rng = random.Random(20261202)
    left, joined = [], []
    for case in range(300):
        nodes = rng.sample(range(10_000), rng.randint(2, 8))
        count, group = rng.randint(8, 64), f"topic:t{case}"
        before = place(group, count, nodes)
        gone = rng.choice(nodes)
        left.append(_unforced_moved(before, place(group, count, set(nodes) - {gone}), gone))
        joined.append(_unforced_moved(before, place(group, count, [*nodes, 10_000]), 10_000))
    # measured: 0.21 and 0.25 (the bounded-load rule that moved leaders on growth: 0.05)
    assert sum(left) / len(left) < 0.3
    assert sum(joined) / len(joined) < 0.3


def test_a_node_that_joins_takes_its_share_and_moves_fewer_others():
    before = place("topic:t", 48, [1, 2, 3])
    after = place("topic:t", 48, [1, 2, 3, 4])
    assert Counter(after)[4] == 12
    moved_between_others = sum(1 for b, a in zip(before, after, strict=True) if a not in (b, 4))
    assert moved_between_others <= 12


def test_a_view_keeps_one_member_per_node_id_the_one_started_first():
    first = Member(7, "a", 1, instance="x", started_ms=10)
    second = Member(7, "b", 2, instance="y", started_ms=20)
    view = ClusterView.of([second, first])
    assert view.members == (first,)
    assert view.controller == 7


def test_owned_by_a_node_not_in_the_view_is_nothing():
    view = _view(1, 2)
    assert view.owned_by(3, "log", 8) == frozenset()
    assert view.owned_by(1, "log", 8) | view.owned_by(2, "log", 8) == frozenset(range(8))


def test_an_index_outside_the_group_is_refused():
    with pytest.raises(ValueError, match=r"not in 0\.\.3"):
        _view(1).owner("g", 4, 4)


@given(
    nodes=nodes_st,
    count=st.integers(min_value=1, max_value=48),
    more=st.integers(min_value=1, max_value=24),
)
def test_adding_partitions_never_moves_the_owner_of_an_existing_one(nodes, count, more):
    # Kafka never moves an existing partition's leader when partitions are added; a move
    # here left the old leader holding the partition's producer names (6 for minutes)
    before = place("g", count, sorted(nodes))
    after = place("g", count + more, sorted(nodes))
    assert after[:count] == before


def test_growing_200_topics_from_3_to_4_partitions_over_3_nodes_moves_no_leader():
    moved = [
        t
        for t in (f"topic:t{i}" for i in range(200))
        if place(t, 4, [1, 2, 3])[:3] != place(t, 3, [1, 2, 3])
    ]
    assert moved == []


@given(nodes=nodes_st, count=st.integers(min_value=1, max_value=64))
def test_at_every_count_the_loads_differ_by_at_most_one(nodes, count):
    loads = Counter(place("g", count, sorted(nodes)))
    counts = [loads.get(n, 0) for n in nodes]
    assert max(counts) - min(counts) <= 1
