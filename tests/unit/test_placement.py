"""The placement rule: the same inputs give every node the same answer, spread evenly,
and a membership change moves little."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup.cluster.placement import ClusterView, Member, place, score

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


@given(nodes=nodes_st, count=st.integers(min_value=1, max_value=64))
def test_every_thing_has_one_owner_among_the_nodes_and_loads_differ_by_at_most_one(nodes, count):
    owners = place("g", count, sorted(nodes))
    assert len(owners) == count
    assert set(owners) <= nodes
    loads = Counter(owners)
    cap = -(-count // len(nodes))
    assert max(loads.values()) <= cap


@given(nodes=nodes_st, count=st.integers(min_value=1, max_value=32))
def test_the_answer_does_not_depend_on_the_order_nodes_are_listed_in(nodes, count):
    forward = place("g", count, sorted(nodes))
    backward = place("g", count, sorted(nodes, reverse=True))
    assert forward == backward


@given(
    nodes=st.sets(st.integers(min_value=0, max_value=10_000), min_size=2, max_size=8),
    count=st.integers(min_value=8, max_value=64),
)
def test_a_node_that_leaves_moves_its_things_and_few_others(nodes, count):
    before = place("g", count, sorted(nodes))
    gone = min(nodes)
    after = place("g", count, sorted(nodes - {gone}))
    moved_others = sum(1 for b, a in zip(before, after, strict=True) if b not in (gone, a))
    # bounded load can cascade a few; far from the modulo rule that moves most things
    assert moved_others <= count // 2


def test_a_node_that_joins_takes_about_its_share():
    before = place("topic:t", 48, [1, 2, 3])
    after = place("topic:t", 48, [1, 2, 3, 4])
    moved = sum(1 for b, a in zip(before, after, strict=True) if b != a)
    assert Counter(after)[4] == 12
    assert moved <= 12 + 6  # its share, and a little cascade


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
