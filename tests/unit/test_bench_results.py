"""The one shape of every bench mode's results, without a broker: the aggregation (each
target's best repetition by records/s), the comparisons (ratio, goal, reference, the
latency a paced row adds), the results file, the table and the plot agreeing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kop_dedup_tools.bench.cells import Cell, Compare, Workload, extras, summarize
from kop_dedup_tools.bench.plot import plot, series
from kop_dedup_tools.bench.results import FORMAT, Results
from kop_dedup_tools.bench.table import format_ratio, render

PRODUCE = Compare("sidecar")


def cell(target, size, prods, records, p99, rep=1, rate=None, **more) -> Cell:
    w = Workload("produce", prods, size, rate)
    return Cell(
        w, target, rep, records, 2.0, p99 / 2, p99, extra=extras(batches=records // size), **more
    )


# three repetitions per target where the best is neither the first nor the last, a row
# with only a direct cell, and a paced pair that is a row of its own
CELLS = [
    cell("direct", 100, 8, 20_000, 9.0, 1),
    cell("direct", 100, 8, 24_000, 8.0, 2),
    cell("direct", 100, 8, 22_000, 7.0, 3),
    cell("sidecar", 100, 8, 18_000, 11.0, 1, sidecar_cpu_s=0.5, rss_mb=90),
    cell("sidecar", 100, 8, 19_000, 12.0, 2, sidecar_cpu_s=0.38, rss_mb=91),
    cell("sidecar", 100, 8, 16_000, 10.0, 3, sidecar_cpu_s=0.4, rss_mb=92),
    cell("direct", 1, 1, 2_000, 3.0, 1),
    cell("direct", 1, 1, 2_400, 4.0, 2),
    cell("direct", 1, 1, 2_200, 5.0, 3),
    cell("direct", 100, 8, 9_500, 6.0, rate=4_750.0),
    cell("sidecar", 100, 8, 9_400, 9.5, rate=4_750.0, sidecar_cpu_s=0.2),
]


def table_rows(table: str) -> dict[str, list[str]]:
    """The main table's lines by workload label: their cells."""
    block = next(b for b in table.split("\n\n") if b.startswith("| workload |"))
    cols = ([c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:])
    return {c[0]: c[1:] for c in cols}


def test_each_target_shows_its_best_repetition_by_records_per_second():
    rows = {r.workload.label: r for r in summarize(CELLS, PRODUCE)}
    full = rows["produce, batch 100, 8 prod"]
    assert full.cells["direct"].rep == 2
    assert full.cells["sidecar"].records == 19_000
    assert full.reps == 3
    assert full.ratio == round(19_000 / 24_000, 3)
    assert rows["produce, batch 1, 1 prod"].ratio is None  # no sidecar cell
    paced = rows["produce, batch 100, 8 prod, paced at 4,750 rec/s"]
    assert paced.reps == 1  # paced cells are a row of their own, not a repetition
    assert paced.added_ms == (4.75 - 3.0, 9.5 - 6.0)


def test_cpu_per_record_is_the_sidecars_cpu_seconds_over_the_records():
    best = summarize(CELLS, PRODUCE)[0].cells["sidecar"]
    assert best.cpu_us_per_record == round(0.38 / 19_000 * 1e6, 2)  # 20.0
    assert CELLS[0].cpu_us_per_record is None  # a direct cell has no sidecar


def test_table_plot_and_json_show_the_same_figures():
    results = Results("produce", "t", PRODUCE, CELLS)
    rows = results.rows()
    table = table_rows(render("t", rows))
    drawn = series(rows)
    summary = {s["label"]: s for s in json.loads(json.dumps(results.to_json()))["summary"]}
    for i, r in enumerate(rows):
        label = r.workload.label
        for target in ("direct", "sidecar"):
            best = r.cells.get(target)
            if best is None:
                assert target not in summary[label]["cells"]
                assert drawn["records/s"][target][i] is None
                continue
            assert summary[label]["cells"][target]["records_per_s"] == round(best.records_per_s, 1)
            assert summary[label]["cells"][target]["p99_ms"] == best.p99_ms
            assert drawn["records/s"][target][i] == best.records_per_s
            assert drawn["p99"][target][i] == best.p99_ms
            assert drawn["cpu µs/rec"][target][i] == best.cpu_us_per_record
            assert f"{best.records_per_s:,.0f}" in table[label]
        assert summary[label]["ratio"] == r.ratio
        if r.workload.rate is None:
            assert table[label][-1] == format_ratio(r.ratio)
    assert table["produce, batch 100, 8 prod, paced at 4,750 rec/s"][-1] == "p50 +1.8, p99 +3.5 ms"


def test_the_table_prints_the_ratio_the_json_stores_also_on_a_rounding_boundary():
    # 3,249.6 / 10,000 = 0.32496: the JSON stores 0.325, which reads 0.33 at two decimals;
    # the table must not round the raw ratio to 0.32 on its own
    rows = summarize(
        [cell("direct", 10, 1, 20_000, 1.0), cell("sidecar", 10, 1, 6_499, 2.0)], PRODUCE
    )
    [stored] = Results("produce", "t", PRODUCE, [*rows[0].cells.values()]).to_json()["summary"]
    assert stored["ratio"] == 0.325
    assert table_rows(render("t", rows))["produce, batch 10, 1 prod"][-1] == "0.33"
    assert format_ratio(0.0154) == "0.015"  # small ratios keep a third decimal


def test_the_table_says_what_it_shows_and_every_line_has_every_column():
    table = render("the title", summarize(CELLS, PRODUCE), ["a note"])
    assert table.startswith("the title\n\nrecords/s: best of 1-3 repetitions by records/s")
    assert "cpu µs/rec: the sidecar's CPU time per record" in table
    assert "a note" in table
    main, details = (b for b in table.split("\n\n") if b.startswith("| workload |"))
    for part in (main, details):
        counts = {line.count("|") for line in part.splitlines()}
        assert len(counts) == 1, part  # a missing target keeps the columns in place
    assert "| batches |" in details  # each mode's own figures, in a table of their own


def test_a_results_file_round_trips_and_names_its_format(tmp_path):
    results = Results("produce", "t", PRODUCE, CELLS, {"sidecars": 1}, {"started": False})
    report = results.write(tmp_path)
    written = json.loads((tmp_path / "bench.json").read_text())  # the matrix's own name
    assert list(written)[:4] == ["format", "mode", "title", "machine"]
    assert written["format"] == FORMAT
    assert (
        written["aggregation"] == "best repetition by records/s, chosen for each target on its own"
    )
    assert len(written["cells"]) == len(CELLS)  # every repetition is kept
    again = Results.load(tmp_path / "bench.json")
    assert again.cells == CELLS
    assert [r.to_json() for r in again.rows()] == written["summary"]
    assert render("t", again.rows()) in report
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_of_another_format_is_refused_saying_so():
    with pytest.raises(ValueError, match="format 2"):
        Results.from_json({"machine": {}, "summary": []})


def test_the_plot_is_written_also_with_a_target_missing_and_no_latencies(tmp_path):
    only = [Cell(Workload("fetch", 1, 100), "listener", 1, 1_000, 1.0)]
    plot("t", summarize(only, Compare("listener")), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


HISTORY = sorted((Path(__file__).parents[2] / "docs" / "bench").rglob("*.json"))


def test_the_kept_history_holds_every_mode():
    modes = {json.loads(p.read_text())["mode"] for p in HISTORY}
    assert modes == {
        "produce",
        "memory",
        "transactions",
        "groups",
        "kafka",
        "kafka-groups",
        "wide-produce",
    }


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: p.name)
def test_every_modes_results_render_through_the_one_table_and_the_one_plot(path, tmp_path):
    results = Results.load(path)
    rows = results.rows()
    table = table_rows(render(results.title, rows, results.notes))
    assert list(table) == [r.workload.label for r in rows]
    for r in rows:
        subject = r.cells.get(results.compare.subject)
        if subject is not None:
            assert f"{subject.records_per_s:,.0f}" in table[r.workload.label]
    assert results.to_json()["summary"] == json.loads(path.read_text())["summary"]
    plot(results.title, rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
