"""The parts every bench mode's results share: a row compares the two sides it names, in
its ratio and its JSON alike (a new mode's sides, not only direct and sidecar)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from kop_dedup_tools.bench_report import Compared, Timed, best_of, write_json


@dataclass(frozen=True, slots=True)
class OneCell(Timed):
    mode: str
    producers: int
    records: int
    seconds: float


@dataclass(frozen=True, slots=True)
class TwoSidedRow(Compared):
    sides: ClassVar[tuple[str, str]] = ("direct", "kafka")
    producers: int
    reps: int
    direct: OneCell | None
    kafka: OneCell | None


def test_a_row_with_sides_of_its_own_compares_them_and_names_them_in_its_json():
    cells = [
        OneCell("direct", 1, 10_000, 1.0),
        OneCell("kafka", 1, 8_000, 1.0),
        OneCell("kafka", 1, 9_000, 1.0),
        OneCell("direct", 8, 40_000, 2.0),
    ]
    rows = [
        TwoSidedRow(p, reps, best.get("direct"), best.get("kafka"))
        for (p,), reps, best in best_of(cells, lambda c: (c.producers,))
    ]
    one, eight = rows
    assert one.ratio == 0.9  # the best kafka repetition over the direct one
    assert list(one.sides_json()) == ["reps", "direct", "kafka", "ratio"]
    assert one.sides_json()["kafka"]["records_per_s"] == 9_000
    assert eight.ratio is None
    assert eight.sides_json()["kafka"] is None


def test_a_results_file_starts_with_the_machine_and_the_broker_then_the_sections_in_order(
    tmp_path,
):
    write_json(tmp_path / "r.json", {"started": False}, summary=[], cells=[1], extra={})
    written = json.loads((tmp_path / "r.json").read_text())
    assert list(written) == ["machine", "broker", "summary", "cells", "extra"]
    assert written["broker"] == {"started": False}
    assert written["machine"]["cpus"] >= 1
