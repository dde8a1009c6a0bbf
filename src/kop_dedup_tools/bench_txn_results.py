"""What ``kop-dedup bench --transactions`` measured and how it is shown: the cells of each
mode (``idempotent``, ``transactions``), the one aggregation (best repetition by
records/s of each mode, as every benchmark mode), the table, the plot and
``transactions.json``.

>>> rows = summarize_txn(cells)
>>> print(write_txn_results(out, cells, rows, broker))   # the table; the JSON and plot written
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_report import (
    AGGREGATION,
    Timed,
    best_of,
    pyplot,
    save_figure,
    write_json,
)

__all__ = [
    "BATCHES_PER_ROUND",
    "PARTITIONS",
    "RECORDS_PER_BATCH",
    "TxnCell",
    "plot_txn",
    "render_txn_table",
    "summarize_txn",
    "write_txn_results",
]

# a round: 10 batches of 100 records over the 2 partitions of a fresh topic (the table,
# the plot and the JSON say so)
BATCHES_PER_ROUND = 10
RECORDS_PER_BATCH = 100
PARTITIONS = 2


@dataclass(frozen=True, slots=True)
class TxnCell(Timed):
    """One timed run of one mode with ``producers`` clients."""

    mode: str
    producers: int
    rounds: int
    records: int
    seconds: float
    produce_p50_ms: float
    produce_p99_ms: float
    visible_p50_ms: float
    visible_p99_ms: float
    end_p50_ms: float | None = None
    end_p99_ms: float | None = None
    applied_p50_ms: float | None = None
    applied_p99_ms: float | None = None
    cpu_pct: float | None = None
    unread_rounds: int = 0
    """Rounds whose records were not all read within the reader's grace period."""

    @property
    def rounds_per_s(self) -> float:
        return self.rounds / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**Timed.to_dict(self), "rounds_per_s": round(self.rounds_per_s, 2)}


def summarize_txn(cells: list[TxnCell]) -> list[dict[str, Any]]:
    """Per producer count: each mode's best repetition by records/s (the rule of every
    benchmark mode, :func:`~kop_dedup_tools.bench_report.best_of`), and the ratio of
    transactions to idempotent records/s."""
    rows = []
    for (producers,), _reps, best in best_of(cells, lambda c: (c.producers,)):
        idem, txn = best.get("idempotent"), best.get("transactions")
        ratio = (
            txn.records_per_s / idem.records_per_s
            if idem is not None and txn is not None and idem.records_per_s
            else None
        )
        rows.append(
            {
                "producers": producers,
                "idempotent": idem.to_dict() if idem else None,
                "transactions": txn.to_dict() if txn else None,
                "ratio": None if ratio is None else round(ratio, 2),
            }
        )
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def render_txn_table(rows: list[dict[str, Any]]) -> str:
    """The transactions table (best repetition by records/s of each mode)."""
    head = (
        f"transactions of {BATCHES_PER_ROUND} batches x {RECORDS_PER_BATCH} records over "
        f"{PARTITIONS} partitions, against the same rounds produced idempotently; best "
        "repetition by records/s; latencies in ms\n"
        "prod | idem rec/s    p99 visible p99 | txn rec/s commits/s end-txn p50    p99 "
        "applied p50    p99 visible p50    p99 | ratio"
    )
    lines = [head, "-" * len(head.splitlines()[-1])]
    for r in rows:
        i, t = r["idempotent"] or {}, r["transactions"] or {}
        lines.append(
            f"{r['producers']:>4} | {i.get('records_per_s', 0):>10,.0f} "
            f"{_ms(i.get('produce_p99_ms')):>6} {_ms(i.get('visible_p99_ms')):>11} | "
            f"{t.get('records_per_s', 0):>9,.0f} {t.get('rounds_per_s', 0):>9.1f} "
            f"{_ms(t.get('end_p50_ms')):>11} {_ms(t.get('end_p99_ms')):>6} "
            f"{_ms(t.get('applied_p50_ms')):>11} {_ms(t.get('applied_p99_ms')):>6} "
            f"{_ms(t.get('visible_p50_ms')):>11} {_ms(t.get('visible_p99_ms')):>6} | "
            f"{'-' if r['ratio'] is None else format(r['ratio'], '.2f'):>5}"
        )
    return "\n".join(lines)


def write_txn_results(
    out: Path, cells: list[TxnCell], rows: list[dict[str, Any]], broker: dict[str, Any]
) -> str:
    """transactions.json (every repetition and the summary); the table to print."""
    write_json(
        out / "transactions.json",
        broker,
        round={
            "batches": BATCHES_PER_ROUND,
            "records_per_batch": RECORDS_PER_BATCH,
            "partitions": PARTITIONS,
        },
        aggregation=AGGREGATION,
        summary=rows,
        cells=[c.to_dict() for c in cells],
    )
    plot_txn(rows, out / "transactions.png")
    return (
        f"{render_txn_table(rows)}\n\nwrote {out / 'transactions.json'} and "
        f"{out / 'transactions.png'}"
    )


def plot_txn(rows: list[dict[str, Any]], path: Path) -> None:
    """Records/s of both modes per producer count (the ratio on top), and the commit's
    latencies: end-txn answered, applied (CompleteCommit) and visible, p50 and p99."""
    plt = pyplot()
    fig, (rate, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = list(range(len(rows)))
    for offset, mode in ((-0.2, "idempotent"), (0.2, "transactions")):
        rate.bar(
            [x + offset for x in xs],
            [(r[mode] or {}).get("records_per_s", 0) for r in rows],
            width=0.4,
            label=mode,
        )
    for x, r in zip(xs, rows, strict=True):
        if r["ratio"] is not None:
            rate.annotate(f"{r['ratio']:.2f}x", (x + 0.2, 0), ha="center", va="bottom")
    rate.set_xticks(xs, [f"{r['producers']} producers" for r in rows])
    rate.set_title("records/s (ratio: transactions / idempotent)")
    rate.legend(fontsize=8)
    rate.grid(alpha=0.3, axis="y")
    names = [("end-txn", "end"), ("applied", "applied"), ("visible", "visible")]
    width = 0.8 / len(rows) if rows else 0.8
    for i, r in enumerate(rows):
        txn = r["transactions"] or {}
        for j, q in enumerate(("p50", "p99")):
            lat.bar(
                [k + (i - (len(rows) - 1) / 2) * width + (j - 0.5) * width / 2 for k in range(3)],
                [txn.get(f"{key}_{q}_ms") or 0 for _, key in names],
                width=width / 2,
                label=f"{r['producers']} producers {q}",
            )
    lat.set_xticks(range(3), [label for label, _ in names])
    lat.set_yscale("log")
    lat.set_title("after end-txn is sent: answered, applied, visible (ms)")
    lat.legend(fontsize=8)
    lat.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"kop-dedup transactions of {BATCHES_PER_ROUND} batches x {RECORDS_PER_BATCH} "
        f"records over {PARTITIONS} partitions vs the same records produced idempotently "
        "(best repetition by records/s)",
        fontsize=9,
    )
    save_figure(plt, fig, path)
