"""The soak's pure parts: the seeded fault schedule and the checks that judge a run."""

from __future__ import annotations

import pytest

from kop_dedup_tools.soak_check import (
    Answer,
    OutRecord,
    aborted_reads,
    committed_offsets,
    copy_counts,
    lso_violations,
    spans,
)
from kop_dedup_tools.soak_faults import FAULT_KINDS, describe, plan

INPUTS = {0: ["a0", "a1", "a2", "a3"], 1: ["b0", "b1"]}


def out(partition: int, values: list[str], **kw) -> list[OutRecord]:
    return [OutRecord(partition, i, v, **kw) for i, v in enumerate(values)]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert plan(7, 12) == plan(7, 12)
    assert plan(7, 12) != plan(8, 12)


def test_a_schedule_as_long_as_the_kinds_has_each_kind_once():
    for seed in range(20):
        assert sorted(f.kind for f in plan(seed, len(FAULT_KINDS))) == sorted(FAULT_KINDS)


def test_a_schedule_keeps_to_the_kinds_and_gaps_it_is_given():
    faults = plan(3, 9, kinds=["broker-pause", "takeover"], gap_s=(1.0, 2.0), sidecars=3)
    assert {f.kind for f in faults} == {"broker-pause", "takeover"}
    assert all(1.0 <= f.gap_s <= 2.0 for f in faults)
    assert all(f.params["sidecar"] in {0, 1, 2} for f in faults if f.kind == "takeover")
    assert "takeover" in describe(next(f for f in faults if f.kind == "takeover"))


def test_an_unknown_fault_kind_is_refused():
    with pytest.raises(ValueError, match="unknown fault kinds"):
        plan(1, 3, kinds=["sidecar-kill", "disk-full"])


def test_an_exact_copy_passes_every_count():
    got = out(0, INPUTS[0]) + out(1, INPUTS[1])
    assert {k: r.violations for k, r in copy_counts(INPUTS, got, reader="r").items()} == {
        "duplicates": 0,
        "lost": 0,
        "order": 0,
    }


def test_a_duplicate_a_loss_and_a_swap_are_each_counted():
    got = out(0, ["a0", "a2", "a1", "a2"]) + out(1, ["b0", "b1", "b1", "b1"])
    counts = copy_counts(INPUTS, got, reader="r")
    assert counts["duplicates"].violations == 3  # a2 once more, b1 twice more
    assert counts["lost"].violations == 1  # a3
    assert counts["order"].violations == 1  # a1 after a2
    assert "a3" in counts["lost"].examples[0]


def test_a_value_in_the_wrong_partition_or_in_no_input_is_counted():
    got = out(0, [*INPUTS[0], "b0", "zz"]) + out(1, ["b1"])
    counts = copy_counts(INPUTS, got, reader="r")
    assert counts["duplicates"].violations == 2
    assert counts["lost"].violations == 1  # b0 never read where it belongs


def test_records_of_an_attempt_never_asked_to_commit_are_aborted_reads():
    got = [*out(0, ["a0", "a1"], attempt="t/0/1"), OutRecord(0, 2, "a2", attempt="t/0/2")]
    result = aborted_reads(got, {"t/0/2"}, reader="r")
    assert (result.checked, result.violations) == (3, 1)


def copies(partition: int, txn: tuple[int, int], offsets: range) -> list[OutRecord]:
    return [OutRecord(partition, o, f"v{o}", txn=txn, txn_id="tid") for o in offsets]


def test_spans_are_where_each_transaction_landed_per_partition():
    got = copies(0, (1, 1), range(3)) + copies(0, (1, 2), range(3, 5)) + copies(1, (1, 1), range(2))
    found = spans(got)
    assert [(s.txn, s.first, s.last, s.records) for s in found[0]] == [
        ((1, 1), 0, 2, 3),
        ((1, 2), 3, 4, 2),
    ]
    assert [(s.first, s.last) for s in found[1]] == [(0, 1)]


def answer(offset: int, partition: int = 0) -> Answer:
    return Answer(1.0, "out", partition, offset, "list-offsets")


def test_an_end_strictly_inside_a_transaction_is_a_violation_and_its_edges_are_not():
    topic = {"out": spans(copies(0, (1, 1), range(10, 20)))}
    assert lso_violations([answer(10), answer(20), answer(5), answer(25)], topic).violations == 0
    result = lso_violations([answer(11), answer(19), answer(15, partition=1)], topic)
    assert (result.checked, result.violations) == (3, 2)
    assert "[10, 19]" in result.examples[0]


def test_an_end_at_another_interleaved_transactions_start_is_not_counted():
    # transaction 1 at 10, 12, 14; transaction 2 at 11, 13, 15: an LSO of 11 is right
    # while 2 is still being copied (1's 12 and 14 wait behind it)
    got = [OutRecord(0, o, f"v{o}", txn=(1, 1 + o % 2)) for o in range(10, 16)]
    topic = {"out": spans(got)}
    assert lso_violations([answer(11)], topic).violations == 0
    assert lso_violations([answer(12)], topic).violations == 1


def test_committed_offsets_must_be_the_inputs_end_neither_beyond_nor_short():
    assert committed_offsets({0: 250, 1: 250}, {0: 250, 1: 250}, group="g").ok
    result = committed_offsets({0: 265, 1: 240}, {0: 250, 1: 250}, group="g")
    assert result.violations == 2
    assert "beyond" in result.examples[0]
    assert "short" in result.examples[1]
