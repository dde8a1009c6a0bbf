"""The groups benchmark's own logic: the offset check, and its cells through the one
aggregation the table and the JSON share (no broker here; ``kop-dedup bench --groups``
runs it)."""

from __future__ import annotations

import json

from kop_dedup_tools.bench.cells import Workload, summarize
from kop_dedup_tools.bench.groups import COMPARE, OffsetCheck
from kop_dedup_tools.bench.groups_cells import group_cell
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.table import render


def _cell(target: str, members: int, rep: int, records: int, seconds: float = 1.0):
    timings = ([0.001, 0.002], [0.0005, 0.001], [0.0005, 0.001])  # seconds
    return group_cell(
        Workload("pull", members, 100), target, rep, records, seconds, timings, drained=True
    )


def test_the_offset_check_counts_a_skip_and_a_repeat_and_nothing_else():
    check = OffsetCheck()
    assert all(check.see(0, o) for o in range(5))
    assert check.see(1, 0)
    assert not check.see(0, 4)  # a repeat
    assert not check.see(0, 7)  # a skip (5 and 6 never came)
    assert check.gaps == 2
    assert check.next == {0: 8, 1: 1}


def test_a_group_cell_keeps_the_cycle_as_its_latency_and_pulls_and_commits_as_its_own():
    c = _cell("sidecar", 1, 1, 200)
    assert (c.p50_ms, c.p99_ms) == (1.5, 1.99)  # the cycles, in ms
    assert c.extra["pulls"] == 2
    assert (c.extra["pull_p50_ms"], c.extra["commit_p99_ms"]) == (0.75, 0.99)


def test_each_side_shows_its_best_repetition_and_the_ratio_is_of_those():
    cells = [
        _cell("direct", 1, 1, 10_000),
        _cell("direct", 1, 2, 12_000),
        _cell("sidecar", 1, 1, 9_000),
        _cell("sidecar", 1, 2, 6_000),
        _cell("direct", 8, 1, 20_000, seconds=2.0),
        _cell("sidecar", 8, 1, 16_000, seconds=2.0),
    ]
    one, eight = summarize(cells, COMPARE)
    assert [(r.workload.clients, r.reps) for r in (one, eight)] == [(1, 2), (8, 1)]
    assert one.cells["direct"].rep == 2
    assert one.cells["sidecar"].rep == 1
    assert one.ratio == 0.75
    assert eight.ratio == 0.8


def test_table_and_json_show_the_same_figures():
    results = Results(
        "groups", "t", COMPARE, [_cell("direct", 1, 1, 10_000), _cell("sidecar", 1, 1, 7_500)]
    )
    table = render("t", results.rows())
    [summary] = json.loads(json.dumps(results.to_json()))["summary"]
    assert "one repetition per target" in table
    for figure in ("10,000", "7,500", "| 0.75 |", "pull 100 + commit, 1 member |"):
        assert figure in table
    assert summary["ratio"] == 0.75
    assert summary["cells"]["sidecar"]["records_per_s"] == 7_500


def test_a_side_that_did_not_run_has_no_ratio():
    [row] = summarize([_cell("sidecar", 1, 1, 7_500)], COMPARE)
    assert row.ratio is None
    line = next(x for x in render("t", [row]).splitlines() if x.startswith("| pull"))
    assert line.endswith("| - |")
