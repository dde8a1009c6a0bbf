"""One results file for every ``kop-dedup bench`` mode: ``<out>/<name>.json`` (every
repetition, and the summary the table and the plot show) beside ``<out>/<name>.png``.

>>> results = Results("kafka", "Kafka clients through the listener", compare, cells,
...                   setup={"seconds": 4.0}, broker=broker)
>>> print(results.write(out))            # kafka.json, kafka.png; the table to print
>>> again = Results.load(out / "kafka.json")   # the same rows, table and plot

The file::

    {"format": 2, "mode": "kafka", "title": "...", "machine": {...}, "broker": {...},
     "setup": {...}, "compare": {...}, "aggregation": "...", "notes": [...],
     "summary": [row, ...], "cells": [cell, ...]}

``cells`` is what was measured (:meth:`Cell.to_json`); ``summary`` is derived from
them (:func:`~kop_dedup_tools.bench.cells.summarize`) and is not read back.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench.cells import AGGREGATION, Cell, Compare, Row, summarize
from kop_dedup_tools.bench.plot import plot
from kop_dedup_tools.bench.table import render

__all__ = ["FORMAT", "Results", "machine"]

FORMAT = 2
"""Format 1 was one layout per mode; docs/bench/ was converted to this one once."""

_FILES = {"produce": "bench"}
"""A mode's file name where it is not the mode's own (the matrix has always been
bench.json)."""


def machine() -> dict[str, Any]:
    """What the results ran on (every results file holds it)."""
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": sys.platform,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


@dataclass
class Results:
    """A run of one mode: its cells, what its rows compare, and how it ran."""

    mode: str
    title: str
    compare: Compare
    cells: list[Cell]
    setup: dict[str, Any] = field(default_factory=dict)
    broker: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Lines the report prints under the table."""
    machine: dict[str, Any] = field(default_factory=machine)

    @property
    def name(self) -> str:
        return _FILES.get(self.mode, self.mode)

    def rows(self) -> list[Row]:
        return summarize(self.cells, self.compare)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "mode": self.mode,
            "title": self.title,
            "machine": self.machine,
            "broker": self.broker,
            "setup": self.setup,
            "compare": self.compare.to_json(),
            "aggregation": AGGREGATION,
            "notes": self.notes,
            "summary": [r.to_json() for r in self.rows()],
            "cells": [c.to_json() for c in self.cells],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Results:
        if data.get("format") != FORMAT:
            raise ValueError(
                f"not a bench results file of format {FORMAT} (format {data.get('format')})"
            )
        return cls(
            data["mode"],
            data["title"],
            Compare.from_json(data["compare"]),
            [Cell.from_json(c) for c in data["cells"]],
            data.get("setup") or {},
            data.get("broker") or {},
            list(data.get("notes") or []),
            data.get("machine") or {},
        )

    @classmethod
    def load(cls, path: Path) -> Results:
        return cls.from_json(json.loads(Path(path).read_text()))

    def write(self, out: Path) -> str:
        """``<name>.json`` and ``<name>.png`` under ``out``; the report to print."""
        out.mkdir(parents=True, exist_ok=True)
        json_path, png_path = out / f"{self.name}.json", out / f"{self.name}.png"
        json_path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        rows = self.rows()
        plot(self.title, rows, png_path)
        return f"{render(self.title, rows, self.notes)}\n\nwrote {json_path} and {png_path}"
