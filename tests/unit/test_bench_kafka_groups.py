"""kop-dedup bench --kafka --groups without a broker: each side's best repetition behind
the table, the JSON and the plot; the consume ratio against its target; the flags that
choose the mode."""

from __future__ import annotations

import json

from kop_dedup_tools import bench, bench_groups, bench_kafka, bench_kafka_groups
from kop_dedup_tools.bench_groups_results import GroupCell
from kop_dedup_tools.bench_kafka_groups_results import (
    CtpCell,
    KafkaGroupCell,
    render_kafka_groups_table,
    summarize_consume,
    summarize_ctp,
    write_kafka_group_results,
)


def consume(side: str, members: int, rate: float, rep: int = 1) -> GroupCell:
    fields = (side, members, 100, rep, int(rate * 2), 10, 2.0, True, 1, 2, 1, 2, 1, 2)
    if side == "direct":
        return GroupCell(*fields)
    return KafkaGroupCell(*fields, cpu_pct=30.0, committed_ok=True, join_s=0.5)


def ctp(side: str, copiers: int, rate: float, rep: int = 1) -> CtpCell:
    return CtpCell(side, copiers, 100, rep, int(rate * 2), 5, 2.0, False, 100.0, 200.0, True)


CONSUME = [
    consume("direct", 1, 60_000),
    consume("direct", 1, 50_000, rep=2),
    consume("listener", 1, 20_000),
    consume("listener", 1, 33_000, rep=2),  # the best listener repetition
    consume("kafka", 1, 120_000),
    consume("direct", 8, 40_000),
    consume("listener", 8, 10_000),
]
CTP = [ctp("listener", 1, 500), ctp("listener", 1, 400, rep=2), ctp("kafka", 1, 1_000)]


def test_each_side_shows_its_best_repetition_and_the_ratio_is_listener_over_direct():
    one, eight = summarize_consume(CONSUME)
    assert (one.members, one.reps) == (1, 1)  # kafka ran once: the fewer of the sides'
    assert one.cells["listener"].rep == 2
    assert one.ratio == 0.55  # 33,000 / 60,000
    assert one.vs_kafka == 0.275
    assert one.met
    assert eight.ratio == 0.25
    assert not eight.met
    assert eight.vs_kafka is None  # no real Kafka in that row
    [row] = summarize_ctp(CTP)
    assert row.cells["listener"].records_per_s == 500
    assert row.vs_kafka == 0.5


def test_the_table_says_met_or_missed_and_the_json_holds_what_it_prints(tmp_path, monkeypatch):
    plotted = []
    monkeypatch.setattr(
        "kop_dedup_tools.bench_kafka_groups_results.plot_kafka_groups",
        lambda consume, ctp, path: plotted.append((consume, ctp)),
    )
    printed = write_kafka_group_results(tmp_path, CONSUME, CTP, {"started": False}, {})
    lines = render_kafka_groups_table(summarize_consume(CONSUME), summarize_ctp(CTP)).splitlines()
    by_members = {line.split("|")[0].strip(): line for line in lines[3:5]}
    assert by_members["1"].endswith("met")
    assert by_members["8"].endswith("MISSED")
    data = json.loads((tmp_path / "kafka-groups.json").read_text())
    assert len(data["cells"]["consume"]) == len(CONSUME)
    assert len(data["cells"]["ctp"]) == len(CTP)
    assert [r["ratio"] for r in data["summary"]["consume"]] == [0.55, 0.25]
    assert [r["met"] for r in data["summary"]["consume"]] == [True, False]
    assert data["summary"]["consume"][0]["listener"]["join_s"] == 0.5
    assert data["summary"]["ctp"][0]["vs_kafka"] == 0.5
    for figure in ("0.55", "0.25", "33,000", "500", "1,000"):
        assert figure in printed
    assert len(plotted) == 1


def test_kafka_with_groups_chooses_this_mode_and_each_flag_alone_its_own():
    parser = bench.argparse.ArgumentParser()
    bench.add_cli(parser.add_subparsers())

    def chosen(*flags: str) -> object:
        args = parser.parse_args(["bench", *flags])
        return next((m.run for m in bench._MODES if m.chosen(args)), None)

    assert chosen("--kafka", "--groups") is bench_kafka_groups.run
    assert chosen("--against-kafka", "--groups") is bench_kafka_groups.run
    assert chosen("--groups") is bench_groups.run
    assert chosen("--kafka") is bench_kafka.run
    args = parser.parse_args(["bench", "--kafka", "--groups"])
    assert (args.members, args.copiers, args.ctp_records) == ([1, 8], [1], 100)
