"""kop-dedup bench --kafka --groups without a broker: each side's best repetition behind
the table and the JSON; the consume ratio against its goal; the copy loop against the
real Kafka only."""

from __future__ import annotations

import json

from kop_dedup_tools.bench.cells import Cell, Workload, extras, summarize
from kop_dedup_tools.bench.groups_cells import group_cell
from kop_dedup_tools.bench.kafka_groups import COMPARE
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.table import render

TIMINGS = ([0.001, 0.002], [0.001, 0.002], [0.001, 0.002])


def consume(side: str, members: int, rate: float, rep: int = 1) -> Cell:
    w = Workload("consume", members, 100)
    if side == "direct":
        return group_cell(w, side, rep, int(rate * 2), 2.0, TIMINGS, drained=True)
    return group_cell(
        w,
        side,
        rep,
        int(rate * 2),
        2.0,
        TIMINGS,
        sidecar_cpu_s=0.6,
        drained=True,
        committed_ok=True,
        join_s=0.5,
    )


def ctp(side: str, copiers: int, rate: float, rep: int = 1) -> Cell:
    own = extras(transactions=5, drained=False, committed_ok=True)
    return Cell(
        Workload("ctp", copiers, 100), side, rep, int(rate * 2), 2.0, 100.0, 200.0, extra=own
    )


CELLS = [
    consume("direct", 1, 60_000),
    consume("direct", 1, 50_000, rep=2),
    consume("listener", 1, 20_000),
    consume("listener", 1, 33_000, rep=2),  # the best listener repetition
    consume("kafka", 1, 120_000),
    consume("direct", 8, 40_000),
    consume("listener", 8, 10_000),
    ctp("listener", 1, 500),
    ctp("listener", 1, 400, rep=2),
    ctp("kafka", 1, 1_000),
]


def test_each_side_shows_its_best_repetition_and_the_ratio_is_listener_over_direct():
    one, eight, copy = summarize(CELLS, COMPARE)
    assert (one.workload.clients, one.reps) == (1, 1)  # kafka ran once: the fewest
    assert one.cells["listener"].rep == 2
    assert one.ratio == 0.55  # 33,000 / 60,000
    assert one.vs_reference == 0.275
    assert one.met
    assert eight.ratio == 0.25
    assert not eight.met
    assert eight.vs_reference is None  # no real Kafka in that row
    assert copy.cells["listener"].records_per_s == 500
    assert copy.vs_reference == 0.5
    assert (copy.ratio, copy.goal) == (None, None)  # the copy loop has no direct side


def test_the_table_says_met_or_missed_and_the_json_holds_what_it_prints():
    results = Results("kafka-groups", "t", COMPARE, CELLS)
    printed = render("t", results.rows())
    main = next(b for b in printed.split("\n\n") if b.startswith("| workload |"))
    lines = {line.split("|")[1].strip(): line for line in main.splitlines()}
    assert lines["group consume, 1 member"].endswith("| 0.55 | >= 0.5 met | 0.28 |")
    assert lines["group consume, 8 members"].endswith("| 0.25 | >= 0.5 MISSED | - |")
    assert lines["copy, txn of 100, 1 copier"].endswith("| - | - | 0.50 |")
    data = json.loads(json.dumps(results.to_json()))
    assert [r["ratio"] for r in data["summary"]] == [0.55, 0.25, None]
    assert [r["met"] for r in data["summary"]] == [True, False, None]
    assert data["summary"][0]["cells"]["listener"]["extra"]["join_s"] == 0.5
    assert data["summary"][2]["vs_reference"] == 0.5
    for figure in ("33,000", "500", "1,000", "| 5 |"):  # the copy loop's transactions too
        assert figure in printed
