"""kop-dedup bench --kafka without a broker: one aggregation behind the table, the JSON
and the plot; each measure compared with its own baseline; a missed target said."""

from __future__ import annotations

import json

import pytest

from kop_dedup_tools import bench
from kop_dedup_tools.bench_kafka import MODE, MODE_AGAINST_KAFKA, PRODUCER_CONFIG
from kop_dedup_tools.bench_kafka_results import (
    KafkaCell,
    render_kafka_table,
    summarize_kafka,
    write_kafka_results,
)


def cell(side: str, measure: str, producers: int, rate: float, txn: int = 0) -> KafkaCell:
    return KafkaCell(side, measure, producers, int(rate * 2), 2.0, 1.0, 2.0, txn_records=txn)


CELLS = [
    cell("direct", "produce", 1, 10_000),
    cell("direct", "produce", 1, 12_000),  # the best direct repetition
    cell("listener", "produce", 1, 9_000),
    cell("listener", "produce", 1, 6_000),
    cell("kafka", "produce", 1, 30_000),
    cell("direct", "produce", 8, 40_000),
    cell("listener", "produce", 8, 20_000),
    cell("direct", "fetch", 1, 100_000),
    cell("listener", "fetch", 1, 60_000),
    cell("kafka", "fetch", 1, 200_000),
    cell("listener", "txn", 1, 3_000, txn=100),
    cell("kafka", "txn", 1, 6_000, txn=100),
    cell("listener", "txn", 8, 15_000, txn=100),
]


def test_each_side_shows_its_best_repetition_and_each_measure_its_own_baseline():
    rows = {(r.measure, r.producers, r.txn_records): r for r in summarize_kafka(CELLS)}
    produce1 = rows["produce", 1, 0]
    assert produce1.reps == 1  # kafka ran once: the fewer of the sides'
    assert produce1.cells["direct"].records_per_s == 12_000
    assert produce1.cells["listener"].records_per_s == 9_000
    assert produce1.ratio == 0.75  # listener over direct
    assert produce1.vs_kafka == 0.3
    assert rows["produce", 8, 0].ratio == 0.5
    assert rows["produce", 8, 0].vs_kafka is None  # no real Kafka in that row
    assert rows["fetch", 1, 0].ratio == 0.6
    assert rows["fetch", 1, 0].vs_kafka == 0.3
    # transactions through the listener against idempotence through the listener
    txn1, txn8 = rows["txn", 1, 100], rows["txn", 8, 100]
    assert txn1.baseline is produce1.cells["listener"]
    assert txn1.ratio == pytest.approx(3_000 / 9_000, abs=1e-3)
    assert txn1.vs_kafka == 0.5
    assert txn8.ratio == 0.75
    assert [r.measure for r in summarize_kafka(CELLS)] == ["produce"] * 2 + ["fetch"] + ["txn"] * 2


def test_a_row_below_its_target_is_marked_missed_and_one_above_is_not():
    lines = render_kafka_table(summarize_kafka(CELLS)).splitlines()
    by_label = {line.split("|")[0].strip(): line for line in lines[3:]}
    assert by_label["produce, 1 prod"].endswith("MISSED")  # 0.75 < 0.8
    assert not by_label["fetch, 1 consumer"].endswith("MISSED")  # 0.6 >= 0.5
    assert by_label["txn of 100, 1 prod"].endswith("MISSED")  # 0.33 < 0.5
    assert not by_label["txn of 100, 8 prod"].endswith("MISSED")
    assert "one repetition per side" in lines[0]  # the fewer of the sides: kafka ran once
    assert len({len(line.split("|")) for line in lines[1:2] + lines[3:]}) == 1


def test_the_json_summary_holds_what_the_table_prints(tmp_path, monkeypatch):
    plotted = []
    monkeypatch.setattr(
        "kop_dedup_tools.bench_kafka_results.plot_kafka", lambda rows, path: plotted.append(rows)
    )
    rows = summarize_kafka(CELLS)
    printed = write_kafka_results(tmp_path, CELLS, rows, {"started": False}, {"seconds": 2.0})
    data = json.loads((tmp_path / "kafka.json").read_text())
    assert len(data["cells"]) == len(CELLS)
    assert plotted == [rows]
    for r, summary in zip(rows, data["summary"], strict=True):
        assert summary["ratio"] == r.ratio
        assert summary["target"] == r.target
        if r.ratio is not None:
            assert f"{r.ratio:.2f}" in printed


def test_kafka_and_against_kafka_each_choose_the_kafka_run_and_batches_are_of_100_records():
    parser = bench.argparse.ArgumentParser()
    sub = parser.add_subparsers()
    bench.add_cli(sub)
    kafka = parser.parse_args(["bench", "--kafka"])
    against = parser.parse_args(["bench", "--against-kafka"])
    neither = parser.parse_args(["bench"])
    assert (MODE.chosen(kafka), MODE.chosen(against)) == (True, False)
    assert MODE_AGAINST_KAFKA.chosen(against)
    assert MODE.run is MODE_AGAINST_KAFKA.run
    assert not any(m.chosen(neither) for m in bench._MODES)
    assert (kafka.kafka_producers, kafka.txn_records) == ([1, 8], [100, 1000])
    assert PRODUCER_CONFIG["batch.num.messages"] == 100
    assert PRODUCER_CONFIG["acks"] == "all"
    assert PRODUCER_CONFIG["enable.idempotence"] is True
