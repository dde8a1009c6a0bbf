"""What ``kop-dedup bench --groups`` measured, and how it is shown: the cells of each
side, the one aggregation (best repetition per side, as every benchmark mode), the
table, the plot and ``groups.json``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_report import (
    AGGREGATION,
    Compared,
    Timed,
    best_of,
    pyplot,
    reps_label,
    save_figure,
    write_json,
)

__all__ = [
    "GroupCell",
    "GroupRow",
    "groups_summary_json",
    "plot_groups",
    "render_groups_table",
    "summarize_groups",
    "write_group_results",
]


@dataclass(frozen=True, slots=True)
class GroupCell(Timed):
    """One timed read of one side (``direct`` or ``sidecar``) with N members."""

    mode: str
    members: int
    pull_records: int
    rep: int
    records: int
    pulls: int
    """Pulls (direct: batch receives) that gave records, each followed by a commit."""
    seconds: float
    drained: bool
    """Everything prefilled was read before the window ended."""
    cycle_p50_ms: float
    cycle_p99_ms: float
    """A pull and its commit, as the member waited for them."""
    pull_p50_ms: float
    pull_p99_ms: float
    commit_p50_ms: float
    commit_p99_ms: float
    cpu_pct: float | None = None
    rss_mb: float | None = None
    gaps: int = 0
    """Records whose offset was not the next one of its partition (skipped or repeated)."""
    committed_ok: bool | None = None
    """The committed offsets read back equal what was pulled (sidecar only)."""

    @property
    def pulls_per_s(self) -> float:
        return self.pulls / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**Timed.to_dict(self), "pulls_per_s": round(self.pulls_per_s, 1)}


@dataclass(frozen=True, slots=True)
class GroupRow(Compared):
    """One members count: each side's best repetition."""

    members: int
    pull_records: int
    reps: int
    direct: GroupCell | None
    sidecar: GroupCell | None


def summarize_groups(cells: list[GroupCell]) -> list[GroupRow]:
    """The one aggregation (table, plot, JSON): per (members, pull size) and side, the
    repetition with the most records/s (:func:`~kop_dedup_tools.bench_report.best_of`)."""
    return [
        GroupRow(members, size, reps, best.get("direct"), best.get("sidecar"))
        for (members, size), reps, best in best_of(cells, lambda c: (c.members, c.pull_records))
    ]


def groups_summary_json(rows: list[GroupRow]) -> list[dict[str, Any]]:
    """The JSON's ``summary``: the rows the table and the plot show."""
    return [{"members": r.members, "pull_records": r.pull_records, **r.sides_json()} for r in rows]


def _reps_label(rows: list[GroupRow]) -> str:
    return reps_label((r.reps for r in rows), side="side")


def render_groups_table(rows: list[GroupRow]) -> str:
    """A heading that says what the figures are, then one line per members count."""
    head = (
        f"{'memb':>4} {'pull':>4} | {'direct rec/s':>12} {'p50':>6} {'p99':>6} | "
        f"{'sidecar rec/s':>13} {'pulls/s':>7} {'pull50':>6} {'pull99':>6} {'com50':>6} "
        f"{'com99':>6} {'cpu%':>5} {'rss MB':>6} | {'ratio':>5}"
    )
    lines = [
        f"{_reps_label(rows)}; a commit after every pull; latencies in ms "
        "(direct: batch receive + acknowledgement)"
        if rows
        else "no cells",
        head,
        "-" * len(head),
    ]
    for r in rows:
        d, s = r.direct, r.sidecar
        lines.append(
            f"{r.members:>4} {r.pull_records:>4} | "
            + (
                f"{d.records_per_s:>12,.0f} {d.cycle_p50_ms:>6.1f} {d.cycle_p99_ms:>6.1f} | "
                if d
                else " " * 27 + "| "
            )
            + (
                f"{s.records_per_s:>13,.0f} {s.pulls_per_s:>7,.0f} {s.pull_p50_ms:>6.1f} "
                f"{s.pull_p99_ms:>6.1f} {s.commit_p50_ms:>6.1f} {s.commit_p99_ms:>6.1f} "
                f"{s.cpu_pct or 0:>5.0f} {s.rss_mb or 0:>6.0f} | "
                if s
                else " " * 78 + "| "
            )
            + (f"{r.shown_ratio:>5.3f}" if r.shown_ratio is not None else f"{'-':>5}")
        )
    return "\n".join(lines)


def plot_groups(rows: list[GroupRow], e2e: dict[str, Any], path: Path) -> None:
    """records/s per members count (both sides), and the end-to-end latencies."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = list(range(len(rows)))
    for offset, mode in ((-0.2, "direct"), (0.2, "sidecar")):
        axes[0].bar(
            [x + offset for x in xs],
            [getattr(r, mode).records_per_s if getattr(r, mode) else 0 for r in rows],
            width=0.4,
            label=mode,
        )
    axes[0].set_xticks(xs, [f"{r.members} members" for r in rows])
    axes[0].set_yscale("log")
    axes[0].set_title(f"records/s, pulls of {rows[0].pull_records if rows else '-'} + commit")
    axes[0].legend(fontsize=8)
    axes[0].grid(alpha=0.3, axis="y")
    if e2e:
        labels, values = [], []
        for mode in ("direct", "sidecar"):
            for q in ("p50", "p99"):
                if e2e.get(mode):
                    labels.append(f"{mode} {q}")
                    values.append(e2e[mode][f"{q}_ms"])
        axes[1].bar(labels, values)
        axes[1].set_title(
            f"produce -> pull latency (ms) at {e2e['rate']:,.0f} rec/s, {e2e['members']} members"
        )
        axes[1].grid(alpha=0.3, axis="y")
    fig.suptitle(
        "kop-dedup consumer groups vs direct Pulsar consumers "
        f"(same broker, same topics, same run; {_reps_label(rows)})",
        fontsize=9,
    )
    save_figure(plt, fig, path)


def write_group_results(
    out: Path,
    cells: list[GroupCell],
    e2e: dict[str, Any],
    broker: dict[str, Any],
    *,
    partitions: int,
) -> str:
    """groups.json and groups.png from one aggregation of ``cells``; the report to print."""
    rows = summarize_groups(cells)
    write_json(
        out / "groups.json",
        broker,
        aggregation=AGGREGATION.replace("mode", "side"),
        partitions=partitions,
        summary=groups_summary_json(rows),
        cells=[c.to_dict() for c in cells],
        end_to_end=e2e,
    )
    plot_groups(rows, e2e, out / "groups.png")
    report = [render_groups_table(rows)]
    if e2e:
        d, s = e2e["direct"], e2e["sidecar"]
        report.append(
            f"\nproduce -> pull at {e2e['rate']:,.0f} rec/s (half the sidecar's best with "
            f"{e2e['members']} members): sidecar p50 {s['p50_ms']:.1f} ms p99 "
            f"{s['p99_ms']:.1f} ms; direct p50 {d['p50_ms']:.1f} ms p99 {d['p99_ms']:.1f} ms"
        )
    report.append(f"\nwrote {out / 'groups.json'} and {out / 'groups.png'}")
    return "\n".join(report)
