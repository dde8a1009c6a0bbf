"""kop-dedup bench --transactions without a broker: values that name their round, the
visibility arithmetic, one aggregation behind the table and the JSON."""

from __future__ import annotations

import threading

from kop_dedup_tools.bench_txn import (
    BATCHES_PER_ROUND,
    RECORDS_PER_BATCH,
    TxnCell,
    Visibility,
    render_txn_table,
    round_of,
    round_values,
    summarize_txn,
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


def cell(mode: str, producers: int, rounds: int, **extra: object) -> TxnCell:
    records = rounds * BATCHES_PER_ROUND * RECORDS_PER_BATCH
    return TxnCell(mode, producers, rounds, records, 2.0, 5.0, 9.0, 3.0, 7.0, **extra)


def test_each_mode_shows_its_best_repetition_and_the_ratio_of_the_two():
    cells = [
        cell("idempotent", 1, 40),
        cell("idempotent", 1, 50),
        cell("transactions", 1, 20, end_p50_ms=4.0, end_p99_ms=8.0),
        cell("transactions", 1, 30, end_p50_ms=5.0, end_p99_ms=9.0),
        cell("idempotent", 4, 80),
    ]
    rows = {r["producers"]: r for r in summarize_txn(cells)}
    assert rows[1]["idempotent"]["rounds"] == 50
    assert rows[1]["transactions"]["rounds"] == 30
    assert rows[1]["ratio"] == 0.6
    assert rows[4]["transactions"] is None
    assert rows[4]["ratio"] is None
    table = render_txn_table(list(rows.values())).splitlines()
    assert "best repetition by records/s" in table[0]
    one = next(line for line in table if line.split("|")[0].strip() == "1")
    assert one.split()[-1] == "0.60"
    assert "15.0" in one  # commits/s of the best transactions repetition: 30 over 2 s
    four = next(line for line in table if line.split("|")[0].strip() == "4")
    assert four.split()[-1] == "-"


def test_the_plot_is_written_from_the_summary_rows_also_with_a_mode_missing(tmp_path):
    from kop_dedup_tools.bench_txn import plot_txn

    rows = summarize_txn(
        [
            cell("idempotent", 1, 50),
            cell("transactions", 1, 30, end_p50_ms=4.0, end_p99_ms=8.0, applied_p50_ms=20.0),
            cell("idempotent", 8, 80),
        ]
    )
    plot_txn(rows, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
