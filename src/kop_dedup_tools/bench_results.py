"""What ``kop-dedup bench`` measured and how it is shown: one aggregation for the table,
the plot and the JSON, so the three always agree.

A :class:`Cell` is one timed run of one mode (``direct`` or ``sidecar``) at one batch
size and producer count. Each combination runs ``--reps`` times per mode; the figures
shown are the **best repetition by records/s, chosen for each mode on its own**
(:func:`summarize`), and the ratio is sidecar over direct of those two. Best-of-N is the
usual benchmark convention (the least disturbed run of each side on a shared machine);
every repetition is kept in the JSON's ``cells`` for whoever wants a median.

>>> rows = summarize(cells)
>>> print(render_table(rows))           # the header says "best of N by records/s"
>>> series = plot_series(rows)          # the plot's points, from the same rows
>>> summary_json(rows)                  # the JSON's "summary", from the same rows
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Self, TypeVar

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

AGGREGATION = "best repetition by records/s, chosen for each mode on its own"


class Timed:
    """What a timed cell derives from its counts (a mixin of the frozen cell dataclasses
    of every benchmark mode)."""

    __slots__ = ()
    mode: str
    records: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The cell's fields and records/s (a mode adds its own rates)."""
        return {**asdict(self), "records_per_s": round(self.records_per_s, 1)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The inverse of ``to_dict`` (derived fields are dropped)."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in names})


class Compared:
    """A row's ratio of its two sides' best repetitions (a mixin of the row dataclasses)."""

    __slots__ = ()
    reps: int
    direct: Timed | None
    sidecar: Timed | None

    def sides_json(self) -> dict[str, Any]:
        """What every mode's JSON summary row holds besides its own keys."""
        return {
            "reps": self.reps,
            "direct": self.direct.to_dict() if self.direct else None,
            "sidecar": self.sidecar.to_dict() if self.sidecar else None,
            "ratio": self.shown_ratio,
        }

    @property
    def ratio(self) -> float | None:
        """Sidecar records/s over direct records/s; None when either is missing."""
        d, s = self.direct, self.sidecar
        if d is None or s is None or not d.records_per_s:
            return None
        return s.records_per_s / d.records_per_s

    @property
    def shown_ratio(self) -> float | None:
        """The ratio as the JSON stores it (3 decimals), which tables and plots format
        too: rounding the raw ratio separately made a table say 0.32 where the JSON's
        0.325 says 0.33."""
        return None if self.ratio is None else round(self.ratio, 3)


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


def _pyplot() -> Any:
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
