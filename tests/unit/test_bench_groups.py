"""The groups benchmark's own logic: the offset check and the one aggregation that the
table, the plot and the JSON share (no broker here; ``kop-dedup bench --groups`` runs it)."""

from __future__ import annotations

import json

from kop_dedup_tools.bench_groups import OffsetCheck
from kop_dedup_tools.bench_groups_results import (
    GroupCell,
    groups_summary_json,
    render_groups_table,
    summarize_groups,
)


def _cell(mode: str, members: int, rep: int, records: int, seconds: float = 1.0) -> GroupCell:
    return GroupCell(
        mode, members, 100, rep, records, records // 100, seconds, True, 1, 2, 1, 2, 1, 2
    )


def test_the_offset_check_counts_a_skip_and_a_repeat_and_nothing_else():
    check = OffsetCheck()
    assert all(check.see(0, o) for o in range(5))
    assert check.see(1, 0)
    assert not check.see(0, 4)  # a repeat
    assert not check.see(0, 7)  # a skip (5 and 6 never came)
    assert check.gaps == 2
    assert check.next == {0: 8, 1: 1}


def test_each_side_shows_its_best_repetition_and_the_ratio_is_of_those():
    cells = [
        _cell("direct", 1, 1, 10_000),
        _cell("direct", 1, 2, 12_000),
        _cell("sidecar", 1, 1, 9_000),
        _cell("sidecar", 1, 2, 6_000),
        _cell("direct", 8, 1, 20_000, seconds=2.0),
        _cell("sidecar", 8, 1, 16_000, seconds=2.0),
    ]
    rows = summarize_groups(cells)
    assert [(r.members, r.reps) for r in rows] == [(1, 2), (8, 1)]
    one, eight = rows
    assert one.direct is not None
    assert one.direct.rep == 2
    assert one.sidecar is not None
    assert one.sidecar.rep == 1
    assert one.ratio == 9_000 / 12_000
    assert eight.ratio == 0.8


def test_table_and_json_show_the_same_figures():
    rows = summarize_groups([_cell("direct", 1, 1, 10_000), _cell("sidecar", 1, 1, 7_500)])
    table = render_groups_table(rows)
    summary = json.loads(json.dumps(groups_summary_json(rows)))
    assert "one repetition per side" in table
    for figure in ("10,000", "7,500", "0.750"):
        assert figure in table
    assert summary[0]["ratio"] == 0.75
    assert summary[0]["sidecar"]["records_per_s"] == 7_500


def test_a_side_that_did_not_run_has_no_ratio():
    rows = summarize_groups([_cell("sidecar", 1, 1, 7_500)])
    assert rows[0].ratio is None
    assert render_groups_table(rows).splitlines()[-1].rstrip().endswith("-")
