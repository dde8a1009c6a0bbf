"""kop-dedup bench --transactions without a broker: values that name their round, the
visibility arithmetic, its cells through the one aggregation, table and plot."""

from __future__ import annotations

import threading

from kop_dedup_tools.bench.cells import Cell, Workload, extras, summarize
from kop_dedup_tools.bench.plot import plot
from kop_dedup_tools.bench.table import render
from kop_dedup_tools.bench.txn import (
    BATCHES_PER_ROUND,
    COMPARE,
    RECORDS_PER_BATCH,
    Visibility,
    round_of,
    round_values,
)


def test_every_value_names_its_client_and_round_and_has_the_asked_size():
    values = round_values(3, 17, 1000, 100)
    assert len(values) == 1000
    assert {len(v) for v in values} == {100}
    assert {round_of(v) for v in values} == {(3, 17)}
    assert len(set(values)) == 1000
    assert round_of(b"no round here") is None
    assert round_of(b"a:b:c") is None


def test_a_round_is_visible_when_its_last_record_is_read_counted_from_its_end():
    seen = Visibility(records_per_round=3)
    seen.ended((0, 0), at=10.0)
    for at in (10.1, 10.2):
        seen.read((0, 0), at)
    assert seen.latencies() == []
    assert seen.incomplete() == 1
    seen.read((0, 0), 10.5)
    assert [round(x, 3) for x in seen.latencies()] == [0.5]
    assert seen.incomplete() == 0


def test_records_read_before_the_end_was_answered_count_as_visible_at_once():
    seen = Visibility(records_per_round=2)
    seen.read((1, 4), 5.0)
    seen.read((1, 4), 5.1)
    seen.ended((1, 4), at=6.0)
    assert seen.latencies() == [0.0]


def test_reads_from_several_threads_are_all_counted():
    seen = Visibility(records_per_round=4000)
    seen.ended((0, 0), at=0.0)
    threads = [
        threading.Thread(target=lambda: [seen.read((0, 0), 1.0) for _ in range(1000)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen.latencies() == [1.0]


def cell(mode: str, producers: int, rounds: int, rep: int = 1, **own: object) -> Cell:
    records = rounds * BATCHES_PER_ROUND * RECORDS_PER_BATCH
    figures = extras(rounds=rounds, rounds_per_s=rounds / 2.0, **own)
    return Cell(
        Workload("rounds", producers, 1000), mode, rep, records, 2.0, 5.0, 9.0, extra=figures
    )


def test_each_mode_shows_its_best_repetition_and_the_ratio_of_the_two():
    cells = [
        cell("idempotent", 1, 40),
        cell("idempotent", 1, 50, rep=2),
        cell("transactions", 1, 20, end_p50_ms=4.0, end_p99_ms=8.0),
        cell("transactions", 1, 30, rep=2, end_p50_ms=5.0, end_p99_ms=9.0),
        cell("idempotent", 4, 80),
    ]
    one, four = summarize(cells, COMPARE)
    assert one.cells["idempotent"].extra["rounds"] == 50
    assert one.cells["transactions"].extra["rounds"] == 30
    assert one.ratio == 0.6
    assert "transactions" not in four.cells
    assert four.ratio is None
    table = render("t", [one, four])
    assert "ratio: transactions over idempotent" in table
    line = next(x for x in table.splitlines() if x.startswith("| txn rounds of 1000, 1 prod |"))
    assert line.endswith("| 0.60 |")
    details = next(
        x
        for x in table.splitlines()[::-1]
        if x.startswith("| txn rounds of 1000, 1 prod | transactions |")
    )
    assert "| 15.00 |" in details  # commits/s of the best transactions repetition: 30 over 2 s
    assert "| 9.00 |" in details  # its end-txn p99


def test_the_plot_is_written_from_the_rows_also_with_a_mode_missing(tmp_path):
    rows = summarize(
        [
            cell("idempotent", 1, 50),
            cell("transactions", 1, 30, end_p50_ms=4.0, end_p99_ms=8.0, applied_p50_ms=20.0),
            cell("idempotent", 8, 80),
        ],
        COMPARE,
    )
    plot("t", rows, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
