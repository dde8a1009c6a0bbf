"""The one table of every ``kop-dedup bench`` mode: markdown, as the docs pages show it.

A line per workload; per target (baseline first, the subject, the reference last) its
records/s, latency p50 and p99, the sidecar's CPU µs per record and its RSS, each column
only where some cell has the figure; then the comparisons: the ratio (subject over
baseline; a paced row shows the latency the subject adds instead), the goal and whether
it was met, and the ratio to the reference. A second table holds each mode's own
figures (``extra``) of the cells shown.

>>> print(render(results.title, results.rows(), results.notes))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kop_dedup_tools.bench.cells import KINDS, Cell, Row, reps_label

__all__ = ["format_ratio", "render", "targets"]


def targets(rows: Sequence[Row]) -> list[str]:
    """The targets shown, in their columns' order: the baseline, the others as they
    came, the subject, the reference."""
    if not rows:
        return []
    compare = rows[0].compare
    seen = list(dict.fromkeys(t for r in rows for t in r.cells))
    ends = [compare.subject, compare.reference]
    middle = [t for t in seen if t not in (compare.baseline, *ends)]
    return [t for t in [compare.baseline, *middle, *ends] if t in seen]


def format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3f}" if ratio < 0.1 else f"{ratio:.2f}"


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


_Column = tuple[str, Callable[[Cell], str]]


def _columns(target: str, cells: list[Cell]) -> list[_Column]:
    columns: list[_Column] = [(f"{target} rec/s", lambda c: f"{c.records_per_s:,.0f}")]
    if any(c.p50_ms is not None for c in cells):
        columns += [
            ("p50", lambda c: _num(c.p50_ms, ",.1f")),
            ("p99", lambda c: _num(c.p99_ms, ",.1f")),
        ]
    if any(c.sidecar_cpu_s is not None for c in cells):
        columns.append(("cpu µs/rec", lambda c: _num(c.cpu_us_per_record)))
    if any(c.rss_mb is not None for c in cells):
        columns.append(("rss MB", lambda c: _num(c.rss_mb, ".0f")))
    return columns


def _compared(r: Row) -> str:
    if r.workload.rate is None:
        return format_ratio(r.ratio)
    p50, p99 = r.added_ms
    return "-" if p50 is None or p99 is None else f"p50 {p50:+.1f}, p99 {p99:+.1f} ms"


def _goal(r: Row) -> str:
    if r.goal is None:
        return "-"
    return f">= {r.goal:g} " + ("-" if r.met is None else "met" if r.met else "MISSED")


def _markdown(header: list[str], lines: list[list[str]], left: int = 1) -> list[str]:
    align = ["---"] * left + ["---:"] * (len(header) - left)
    return ["| " + " | ".join(cols) + " |" for cols in [header, align, *lines]]


def _heading(title: str, rows: Sequence[Row]) -> list[str]:
    compare = rows[0].compare
    timed = (r.workload.kind for r in rows if any(c.p50_ms is not None for c in r.cells.values()))
    latency = "; ".join(f"{k}: {KINDS[k][1]}" for k in dict.fromkeys(timed) if k in KINDS)
    lines = [title, "", f"records/s: {reps_label(rows)}."]
    if latency:
        lines.append(f"Latency p50/p99 in ms, per {latency}.")
    lines.append("cpu µs/rec: the sidecar's CPU time per record (psutil, over the cell).")
    if compare.baseline or compare.baseline_of:
        of = "".join(
            f"; {k} rows: over the {t} of the {b} row with as many clients"
            for k, (b, t) in compare.baseline_of.items()
        )
        lines.append(
            f"ratio: {compare.subject} over {compare.baseline or 'its baseline'}{of}; "
            "a paced row: the latency it adds."
        )
    return lines


def render(title: str, rows: Sequence[Row], notes: Sequence[str] = ()) -> str:
    """The heading, the table, the notes, and the table of each mode's own figures."""
    if not rows:
        return f"{title}\n\nno cells"
    shown = targets(rows)
    columns = {t: _columns(t, [c for r in rows if (c := r.cells.get(t))]) for t in shown}
    compare = rows[0].compare
    header = ["workload"] + [name for t in shown for name, _ in columns[t]]
    extra: list[tuple[str, Callable[[Row], str]]] = []
    if compare.baseline or compare.baseline_of:
        extra.append(("ratio", _compared))
    if any(r.goal is not None for r in rows):
        extra.append(("goal", _goal))
    if compare.reference in shown:
        extra.append((f"vs {compare.reference}", lambda r: format_ratio(r.vs_reference)))
    header += [name for name, _ in extra]
    lines = []
    for r in rows:
        line = [r.workload.label]
        for t in shown:
            c = r.cells.get(t)
            line += [show(c) if c else "-" for _, show in columns[t]]
        lines.append(line + [show(r) for _, show in extra])
    out = [*_heading(title, rows), "", *_markdown(header, lines)]
    if notes:
        out += ["", *notes]
    return "\n".join(out + _details(rows, shown))


def _details(rows: Sequence[Row], shown: list[str]) -> list[str]:
    """Each mode's own figures of the cells the table shows."""
    best = [(r.workload.label, t, c) for r in rows for t in shown if (c := r.cells.get(t))]
    keys = list(dict.fromkeys(k for _, _, c in best for k in c.extra))
    if not keys:
        return []
    lines = [[label, t, *(_value(c.extra.get(k)) for k in keys)] for label, t, c in best if c.extra]
    return ["", "Each cell's own figures:", "", *_markdown(["workload", "target", *keys], lines, 2)]
