"""What every ``kop-dedup bench`` mode's results share: timed cells, the one aggregation
rule, rows that compare two sides, the table's heading, the plot's backend and the
results file.

A mode measures **cells** (one timed run of one side: a frozen dataclass with
:class:`Timed`), keeps every repetition, and shows the **best repetition by records/s
of each side on its own** (:func:`best_of`; the least disturbed run of each side on a
shared machine, the usual benchmark convention) in **rows** that compare the two sides
(:class:`Compared`). Its table, plot and JSON ``summary`` are all drawn from the same
rows, so they agree; :func:`write_json` writes the results file.

A new mode (one module for its cells, table and plot; see
:mod:`kop_dedup_tools.bench_results` or :mod:`kop_dedup_tools.bench_groups_results`)::

    @dataclass(frozen=True, slots=True)
    class KafkaCell(Timed):
        mode: str            # the side: "direct" or "kafka"
        producers: int
        records: int
        seconds: float

    @dataclass(frozen=True, slots=True)
    class KafkaRow(Compared):
        sides = ("direct", "kafka")      # the ratio is kafka over direct
        producers: int
        reps: int
        direct: KafkaCell | None
        kafka: KafkaCell | None

    rows = [KafkaRow(p, reps, best.get("direct"), best.get("kafka"))
            for (p,), reps, best in best_of(cells, lambda c: (c.producers,))]
    write_json(out / "kafka.json", broker, aggregation=AGGREGATION,
               summary=[{"producers": r.producers, **r.sides_json()} for r in rows],
               cells=[c.to_dict() for c in cells])
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, TypeVar

__all__ = [
    "AGGREGATION",
    "Compared",
    "Timed",
    "best_of",
    "machine",
    "pyplot",
    "reps_label",
    "save_figure",
    "write_json",
]

AGGREGATION = "best repetition by records/s, chosen for each mode on its own"


class Timed:
    """What a timed cell derives from its counts (a mixin of the frozen cell dataclasses
    of every benchmark mode)."""

    __slots__ = ()
    mode: str
    """The side the cell measured (``direct``, ``sidecar``, ...)."""
    records: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The cell's fields and records/s (a mode adds its own rates)."""
        return {**asdict(self), "records_per_s": round(self.records_per_s, 1)}  # type: ignore[call-overload]


class Compared:
    """A row's ratio of its two sides' best repetitions (a mixin of the row dataclasses,
    which hold each side's cell, or None, in a field named after the side)."""

    __slots__ = ()
    sides: ClassVar[tuple[str, str]] = ("direct", "sidecar")
    """The baseline's side, then the side measured against it: the ratio is the
    second's records/s over the first's."""
    reps: int

    def side(self, name: str) -> Timed | None:
        cell: Timed | None = getattr(self, name)
        return cell

    def sides_json(self) -> dict[str, Any]:
        """What every mode's JSON summary row holds besides its own keys."""
        base, subject = (self.side(name) for name in self.sides)
        return {
            "reps": self.reps,
            self.sides[0]: base.to_dict() if base else None,
            self.sides[1]: subject.to_dict() if subject else None,
            "ratio": self.shown_ratio,
        }

    @property
    def ratio(self) -> float | None:
        """The second side's records/s over the first's; None when either is missing."""
        base, subject = (self.side(name) for name in self.sides)
        if base is None or subject is None or not base.records_per_s:
            return None
        return subject.records_per_s / base.records_per_s

    @property
    def shown_ratio(self) -> float | None:
        """The ratio as the JSON stores it (3 decimals), which tables and plots format
        too: rounding the raw ratio separately made a table say 0.32 where the JSON's
        0.325 says 0.33."""
        return None if self.ratio is None else round(self.ratio, 3)


C = TypeVar("C", bound=Timed)


def best_of(
    cells: Iterable[C], key: Callable[[C], tuple[int, ...]]
) -> list[tuple[tuple[int, ...], int, dict[str, C]]]:
    """The one aggregation rule of every mode: per key (sorted) and side, the repetition
    with the most records/s, and how many repetitions it was chosen from (the fewer of
    the sides')."""
    groups: dict[tuple[int, ...], dict[str, list[C]]] = {}
    for c in cells:
        groups.setdefault(key(c), {}).setdefault(c.mode, []).append(c)
    return [
        (
            k,
            min(len(runs) for runs in sides.values()),
            {side: max(runs, key=lambda c: c.records_per_s) for side, runs in sides.items()},
        )
        for k, sides in sorted(groups.items())
    ]


def reps_label(reps: Iterable[int], side: str = "mode") -> str:
    """What a table's figures are: one repetition, or the best of how many."""
    counts = sorted(set(reps))
    if counts == [1]:
        return f"one repetition per {side}"
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"best of {n} repetitions by records/s, each {side} on its own"


def machine() -> dict[str, Any]:
    """What the results ran on (every results file starts with it)."""
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": sys.platform,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def write_json(path: Path, broker: dict[str, Any], **sections: Any) -> None:
    """A mode's results file: the machine, the broker, then ``sections`` in order."""
    results = {"machine": machine(), "broker": broker, **sections}
    path.write_text(json.dumps(results, indent=2))


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend; a clear error when it is missing."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - only the plot needs it

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the benchmark's plot needs matplotlib: pip install 'kop-dedup[bench]' "
            "(or pip install matplotlib)"
        ) from exc
    return plt


def save_figure(plt: Any, fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
