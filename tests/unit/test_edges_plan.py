"""The explorer's pure parts (``kop-dedup edges``): the schedule is a function of the seed
and the profile, every step it draws is valid for the topology it has planned so far,
and the model judges what a read_committed reader read as Kafka's guarantees say."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kop_dedup_tools.edges_model import Model
from kop_dedup_tools.edges_plan import Profile, describe, plan


@given(st.integers(0, 2**31), st.integers(1, 60), st.integers(1, 3), st.integers(1, 64))
def test_a_schedule_is_the_same_for_its_seed_and_every_step_fits_the_topology(
    seed: int, steps: int, nodes: int, max_mib: int
) -> None:
    profile = Profile(nodes=nodes, max_txn_bytes=max_mib << 20)
    schedule = plan(seed, steps, profile)
    assert [describe(s) for s in schedule] == [describe(s) for s in plan(seed, steps, profile)]
    assert [s.index for s in schedule] == list(range(steps))
    import random

    rng = random.Random(seed)
    counts = [rng.randint(1, 3) for _ in range(profile.slots)]
    for s in schedule:
        assert 0 <= s.slot < profile.slots
        if s.kind in ("txn", "abort", "plain", "pause"):
            assert s.partitions
            assert all(0 <= p < counts[s.slot] for p in s.partitions)
            assert s.records >= 1
        if s.kind in ("txn", "abort"):
            assert s.records * s.value_bytes <= profile.max_txn_bytes or s.records == 1
        if s.kind == "grow":
            assert counts[s.slot] < s.count <= profile.max_partitions
            counts[s.slot] = s.count
        if s.kind == "delete":
            counts[s.slot] = s.count
        if s.kind == "pause":
            assert nodes >= 2
            assert 0 <= s.node < nodes


def test_transactions_are_drawn_on_both_sides_of_the_read_ahead_bound() -> None:
    sizes = [
        s.records * s.value_bytes
        for seed in range(50)
        for s in plan(seed, 40, Profile(max_txn_bytes=64 << 20))
        if s.kind == "txn"
    ]
    assert min(sizes) < 1_000
    assert any(s > 8 << 20 for s in sizes)
    assert max(sizes) <= 64 << 20


def _model() -> Model:
    m = Model()
    m.topic("a", 2)
    m.committed("a", {0: ["x0", "x1"], 1: ["y0"]})
    return m


def test_the_model_accepts_exactly_what_was_committed() -> None:
    assert _model().check("a", {0: ["x0", "x1"], 1: ["y0"]}) == []


def test_the_model_names_a_loss_a_duplicate_an_aborted_read_and_a_reorder() -> None:
    m = _model()
    m.aborted(["z0"])
    assert m.check("a", {0: ["x0"], 1: ["y0"]}) == ["a-0: 1 committed value(s) lost, first x1"]
    assert m.check("a", {0: ["x0", "x1", "x1"], 1: ["y0"]}) == ["a-0: read x1 twice"]
    assert m.check("a", {0: ["x0", "x1"], 1: ["y0", "z0"]}) == [
        "a: read z0, of an aborted transaction"
    ]
    assert m.check("a", {0: ["x1", "x0"], 1: ["y0"]}) == ["a-0: out of order at offset 0: x1"]


def test_a_transaction_of_unknown_outcome_is_all_or_nothing() -> None:
    m = _model()
    m.uncertain("a", {0: ["u0"], 1: ["u1"]})
    assert m.check("a", {0: ["x0", "x1"], 1: ["y0"]}) == []
    assert m.check("a", {0: ["x0", "x1", "u0"], 1: ["y0", "u1"]}) == []
    assert m.check("a", {0: ["x0", "x1", "u0"], 1: ["y0"]}) == [
        "a: a transaction of unknown outcome read 1 of 2 (not all or nothing)"
    ]
    assert m.waiting_for("a", {0: ["x0", "x1", "u0"], 1: ["y0"]}) == [
        "a: a transaction of unknown outcome read 1 of 2"
    ]


def test_a_deleted_topic_leaves_the_model() -> None:
    m = _model()
    m.deleted("a")
    assert m.check("a", {}) == []
    assert m.waiting_for("a", {}) == []
