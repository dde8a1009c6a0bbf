"""What ``kop-dedup bench`` (the matrix: batch sizes x producers) measured and how it is
shown: one aggregation for the table, the plot and the JSON, so the three always agree.

A :class:`Cell` is one timed run of one mode (``direct`` or ``sidecar``) at one batch
size and producer count. Each combination runs ``--reps`` times per mode; the figures
shown are the **best repetition by records/s, chosen for each mode on its own**
(:func:`summarize`, the rule of every mode: :mod:`kop_dedup_tools.bench_report`), and
the ratio is sidecar over direct of those two. Every repetition is kept in the JSON's
``cells`` for whoever wants a median.

>>> rows = summarize(cells)
>>> print(render_table(rows))           # the header says "best of N by records/s"
>>> series = plot_series(rows)          # the plot's points, from the same rows
>>> summary_json(rows)                  # the JSON's "summary", from the same rows
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_report import (
    AGGREGATION,
    Compared,
    Timed,
    best_of,
    reps_label,
    save_figure,
)
from kop_dedup_tools.bench_report import pyplot as _pyplot  # the name callers know

__all__ = [
    "AGGREGATION",
    "Cell",
    "Compared",
    "Row",
    "Timed",
    "plot",
    "plot_series",
    "render_table",
    "summarize",
    "summary_json",
]


@dataclass(frozen=True, slots=True)
class Cell(Timed):
    """One timed run of one mode."""

    mode: str
    batch_size: int
    producers: int
    records: int
    batches: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_pct: float | None = None
    rss_mb: float | None = None
    rate_limited: float | None = None
    """The paced rate (records/s) of a half-load run; None for a run at full speed."""

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**Timed.to_dict(self), "batches_per_s": round(self.batches_per_s, 1)}


@dataclass(frozen=True, slots=True)
class Row(Compared):
    """One (batch size, producers) combination: each mode's best repetition."""

    batch_size: int
    producers: int
    reps: int
    """Repetitions the best was chosen from (the fewer of the two modes')."""
    direct: Cell | None
    sidecar: Cell | None


def summarize(cells: list[Cell]) -> list[Row]:
    """Per (batch size, producers) and mode, the repetition with the most records/s
    (:func:`best_of`). Paced (half-load) cells are not part of it."""
    full = [c for c in cells if c.rate_limited is None]
    return [
        Row(size, prods, reps, best.get("direct"), best.get("sidecar"))
        for (size, prods), reps, best in best_of(full, lambda c: (c.batch_size, c.producers))
    ]


def summary_json(rows: list[Row]) -> list[dict[str, Any]]:
    """The JSON's ``summary``: the rows the table and the plot show."""
    return [{"batch_size": r.batch_size, "producers": r.producers, **r.sides_json()} for r in rows]


def _reps_label(rows: list[Row]) -> str:
    return reps_label(r.reps for r in rows)


def render_table(rows: list[Row]) -> str:
    """A heading that says what the figures are, then one line per row."""
    head = (
        f"{'batch':>5} {'prod':>4} | {'direct rec/s':>12} {'p50':>6} {'p99':>6} | "
        f"{'sidecar rec/s':>13} {'batch/s':>8} {'p50':>6} {'p99':>6} {'cpu%':>5} "
        f"{'rss MB':>6} | {'ratio':>5}"
    )
    lines = [
        f"{_reps_label(rows)}; latencies in ms per batch" if rows else "no cells",
        head,
        "-" * len(head),
    ]
    for r in rows:
        d, s = r.direct, r.sidecar
        lines.append(
            f"{r.batch_size:>5} {r.producers:>4} | "
            + (
                f"{d.records_per_s:>12,.0f} {d.p50_ms:>6.1f} {d.p99_ms:>6.1f} | "
                if d
                else " " * 27 + "| "
            )
            + (
                f"{s.records_per_s:>13,.0f} {s.batches_per_s:>8,.0f} {s.p50_ms:>6.1f} "
                f"{s.p99_ms:>6.1f} {s.cpu_pct or 0:>5.0f} {s.rss_mb or 0:>6.0f} | "
                if s
                else " " * 50 + "| "
            )
            + (f"{r.shown_ratio:>5.2f}" if r.shown_ratio is not None else f"{'-':>5}")
        )
    return "\n".join(lines)


def plot_series(rows: list[Row]) -> dict[str, list[tuple[int, float, float]]]:
    """The plot's lines: "<mode>, <n> producers" -> [(batch size, records/s, p99 ms)]."""
    series: dict[str, list[tuple[int, float, float]]] = {}
    for prods in sorted({r.producers for r in rows}):
        for mode in ("direct", "sidecar"):
            points = [
                (r.batch_size, cell.records_per_s, cell.p99_ms)
                for r in rows
                if r.producers == prods and (cell := getattr(r, mode)) is not None
            ]
            if points:
                series[f"{mode}, {prods} producers"] = sorted(points)
    return series


def plot(rows: list[Row], path: Path) -> None:
    """records/s and p99 against batch size, per mode and producer count."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, points in plot_series(rows).items():
        style = "--" if label.startswith("direct") else "-"
        xs = [p[0] for p in points]
        axes[0].plot(xs, [p[1] for p in points], style, marker="o", label=label)
        axes[1].plot(xs, [p[2] for p in points], style, marker="o", label=label)
    for ax, title in ((axes[0], "records/s"), (axes[1], "p99 batch latency (ms)")):
        ax.set_xscale("log")
        ax.set_xlabel("records per batch")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"kop-dedup sidecar vs direct Pulsar producer (same broker, same run; {_reps_label(rows)})",
        fontsize=9,
    )
    save_figure(plt, fig, path)
