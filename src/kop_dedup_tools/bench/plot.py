"""The one plot of every ``kop-dedup bench`` mode (matplotlib, a PNG): per workload, a
bar per target in three panels: records/s (the ratio over the subject's bar), latency
(p50 bars, p99 marks) and the sidecar's CPU µs per record. Drawn from the rows the
table shows (:func:`series` is what it draws).

>>> plot(results.title, results.rows(), out / "kafka.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench.cells import Row, reps_label
from kop_dedup_tools.bench.table import format_ratio, targets

__all__ = ["PANELS", "plot", "pyplot", "series"]

PANELS = ("records/s", "p50", "p99", "cpu µs/rec")


def series(rows: Sequence[Row]) -> dict[str, dict[str, list[float | None]]]:
    """What the plot draws: figure (:data:`PANELS`) -> target -> a value per row (None
    where the target did not run or has no such figure)."""
    out: dict[str, dict[str, list[float | None]]] = {p: {} for p in PANELS}
    for t in targets(rows):
        cells = [r.cells.get(t) for r in rows]
        out["records/s"][t] = [None if c is None else c.records_per_s for c in cells]
        out["p50"][t] = [None if c is None else c.p50_ms for c in cells]
        out["p99"][t] = [None if c is None else c.p99_ms for c in cells]
        out["cpu µs/rec"][t] = [None if c is None else c.cpu_us_per_record for c in cells]
    return out


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


def _bars(ax: Any, values: dict[str, list[float | None]], **style: Any) -> list[float]:
    """A bar per target per row; the x of each row's group."""
    names = list(values)
    width = 0.8 / max(len(names), 1)
    xs = [float(x) for x in range(len(next(iter(values.values()), [])))]
    for i, t in enumerate(names):
        offset = (i - (len(names) - 1) / 2) * width
        ys = [0.0 if v is None else v for v in values[t]]
        ax.bar([x + offset for x in xs], ys, width=width, color=f"C{i}", label=t, **style)
    return xs


def plot(title: str, rows: Sequence[Row], path: Path) -> None:
    """The three panels of ``rows`` into ``path``."""
    plt = pyplot()
    drawn = series(rows)
    names = list(drawn["records/s"])
    fig, axes = plt.subplots(1, 3, figsize=(max(12.0, 1.4 * len(rows) + 6), 5))
    rate, latency, cpu = axes
    xs = _bars(rate, drawn["records/s"])
    if rows and (subject := rows[0].compare.subject) in names:
        offset = (names.index(subject) - (len(names) - 1) / 2) * 0.8 / len(names)
        for x, r, y in zip(xs, rows, drawn["records/s"][subject], strict=True):
            if r.ratio is not None and r.workload.rate is None and y:
                label = f"{format_ratio(r.ratio)}x"
                rate.annotate(label, (x + offset, y), ha="center", va="bottom", fontsize=7)
    _bars(latency, drawn["p50"])
    width = 0.8 / max(len(names), 1)
    for i, t in enumerate(names):
        offset = (i - (len(names) - 1) / 2) * width
        marks = [(x + offset, v) for x, v in zip(xs, drawn["p99"][t], strict=True) if v]
        latency.scatter([m[0] for m in marks], [m[1] for m in marks], marker="_", s=200, color="k")
    _bars(cpu, drawn["cpu µs/rec"])
    panels = (
        (rate, "records/s", "records/s"),
        (latency, "latency, ms: p50 (bar), p99 (mark)", "p50"),
        (cpu, "sidecar CPU µs per record", ""),
    )
    for ax, name, log in panels:
        ax.set_xticks(xs, [r.workload.label for r in rows], rotation=30, ha="right", fontsize=7)
        if log and any(v for values in drawn[log].values() for v in values):
            ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    rate.legend(fontsize=7)
    fig.suptitle(f"{title} ({reps_label(rows)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
