"""What ``kop-dedup bench --kafka`` (and ``--against-kafka``) measured and how it is shown:
the cells of each side, one aggregation (the best repetition by records/s of each side on
its own, the rule of every benchmark mode), the rows with their ratios, the table, the
plot and ``kafka.json``.

A cell is one timed run of one **side** of one **measure**:

============  ====================================================================
measure       sides
============  ====================================================================
``produce``   ``direct`` (a Pulsar producer), ``listener`` (a Kafka producer through
              the sidecar's listener), ``kafka`` (the same producer, a real Kafka)
``fetch``     ``direct`` (a Pulsar reader), ``listener`` and ``kafka`` (a Kafka
              consumer, assign mode)
``txn``       ``listener`` and ``kafka``: a Kafka transactional producer, one
              transaction of ``txn_records`` records after another
============  ====================================================================

A row's **ratio** is the listener over its baseline: the direct side for produce and
fetch; for ``txn`` the idempotent ``produce`` listener row of the same producer count
(transactions through the listener against idempotence through the listener). Its
**vs_kafka** is the listener over the real Kafka of the same row.

>>> rows = summarize_kafka(cells)
>>> print(write_kafka_results(out, cells, rows, broker, kafka_broker))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_report import (
    AGGREGATION,
    Timed,
    best_of,
    pyplot,
    reps_label,
    save_figure,
    write_json,
)

__all__ = [
    "MEASURES",
    "SIDES",
    "TARGETS",
    "KafkaCell",
    "KafkaRow",
    "plot_kafka",
    "render_kafka_table",
    "summarize_kafka",
    "write_kafka_results",
]

MEASURES = ("produce", "fetch", "txn")
SIDES = ("direct", "listener", "kafka")
TARGETS = {"produce": 0.8, "fetch": 0.5, "txn": 0.5}
"""The issue's targets for each measure's ratio (listener over its baseline)."""


@dataclass(frozen=True, slots=True)
class KafkaCell(Timed):
    """One timed run of one side of one measure."""

    mode: str
    """The side: ``direct``, ``listener`` or ``kafka``."""
    measure: str
    producers: int
    """Producers (produce, txn) or consumers (fetch: 1)."""
    records: int
    seconds: float
    p50_ms: float | None = None
    """Produce: a batch's first record from ``produce()`` to its delivery report (a
    Pulsar batch: send to receipt); txn: begin to commit answered; fetch: none."""
    p99_ms: float | None = None
    txn_records: int = 0
    """Records per transaction (txn only)."""
    sidecar_cpu_pct: float | None = None
    """The sidecar's CPU over the cell (listener side only)."""
    client_cpu_pct: float | None = None
    """The measuring process's CPU over the cell (it holds the clients of every side)."""


@dataclass(frozen=True, slots=True)
class KafkaRow:
    """One measure at one producer count (and transaction size): each side's best."""

    measure: str
    producers: int
    txn_records: int
    reps: int
    cells: dict[str, KafkaCell] = field(default_factory=dict)
    baseline: KafkaCell | None = None
    """What the listener is compared with: the direct side of the row, or (txn) the
    listener of the idempotent produce row of the same producer count."""

    @property
    def ratio(self) -> float | None:
        """The listener's records/s over the baseline's, 3 decimals (None: a side missing)."""
        return _ratio(self.cells.get("listener"), self.baseline)

    @property
    def vs_kafka(self) -> float | None:
        """The listener's records/s over the real Kafka's, 3 decimals."""
        return _ratio(self.cells.get("listener"), self.cells.get("kafka"))

    @property
    def target(self) -> float:
        return TARGETS[self.measure]

    @property
    def label(self) -> str:
        if self.measure == "txn":
            return f"txn of {self.txn_records}, {self.producers} prod"
        if self.measure == "fetch":
            return f"fetch, {self.producers} consumer"
        return f"produce, {self.producers} prod"

    def to_json(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "producers": self.producers,
            "txn_records": self.txn_records,
            "reps": self.reps,
            **{side: (c.to_dict() if (c := self.cells.get(side)) else None) for side in SIDES},
            "baseline_records_per_s": (
                None if self.baseline is None else round(self.baseline.records_per_s, 1)
            ),
            "ratio": self.ratio,
            "target": self.target,
            "vs_kafka": self.vs_kafka,
        }


def _ratio(subject: Timed | None, base: Timed | None) -> float | None:
    if subject is None or base is None or not base.records_per_s:
        return None
    return round(subject.records_per_s / base.records_per_s, 3)


def summarize_kafka(cells: list[KafkaCell]) -> list[KafkaRow]:
    """Per (measure, producers, transaction size) and side, the repetition with the most
    records/s (:func:`~kop_dedup_tools.bench_report.best_of`); each row's baseline."""
    grouped = best_of(cells, lambda c: (MEASURES.index(c.measure), c.producers, c.txn_records))
    rows: list[KafkaRow] = []
    idempotent: dict[int, KafkaCell] = {}
    for (measure_no, producers, txn_records), reps, best in grouped:
        measure = MEASURES[measure_no]
        if measure == "produce" and "listener" in best:
            idempotent[producers] = best["listener"]
        baseline = idempotent.get(producers) if measure == "txn" else best.get("direct")
        rows.append(KafkaRow(measure, producers, txn_records, reps, best, baseline))
    return rows


def _rate(cell: KafkaCell | None) -> str:
    return f"{cell.records_per_s:>10,.0f}" if cell else f"{'-':>10}"


def _ms(value: float | None) -> str:
    return f"{value:>6.1f}" if value is not None else f"{'-':>6}"


def _x(value: float | None) -> str:
    return f"{value:>5.2f}" if value is not None else f"{'-':>5}"


def render_kafka_table(rows: list[KafkaRow]) -> str:
    """A heading that says what the figures are, then one line per row; a row whose
    ratio misses the issue's target says so."""
    head = (
        f"{'':<22} | {'baseline':>10} | {'listener':>10} {'p50':>6} {'p99':>6} "
        f"{'sc cpu%':>7} | {'ratio':>5} {'target':>6} | {'kafka':>10} {'p99':>6} | "
        f"{'vs kafka':>8}"
    )
    lines = [
        (
            f"records/s, {reps_label((r.reps for r in rows), 'side')}; latencies in ms "
            "(produce: per batch, txn: per transaction); baseline: a direct Pulsar "
            "producer/reader, for txn the idempotent listener row"
        )
        if rows
        else "no cells",
        head,
        "-" * len(head),
    ]
    for r in rows:
        lst, kafka = r.cells.get("listener"), r.cells.get("kafka")
        missed = r.ratio is not None and r.ratio < r.target
        cpu = lst.sidecar_cpu_pct if lst else None
        cpu_s = f"{cpu:>7.0f}" if cpu is not None else f"{'-':>7}"
        lines.append(
            f"{r.label:<22} | {_rate(r.baseline)} | {_rate(lst)} "
            f"{_ms(lst.p50_ms if lst else None)} {_ms(lst.p99_ms if lst else None)} "
            f"{cpu_s} | "
            f"{_x(r.ratio)} {f'>={r.target:.1f}':>6} | {_rate(kafka)} "
            f"{_ms(kafka.p99_ms if kafka else None)} | {_x(r.vs_kafka):>8}"
            + ("  MISSED" if missed else "")
        )
    return "\n".join(lines)


def write_kafka_results(
    out: Path,
    cells: list[KafkaCell],
    rows: list[KafkaRow],
    broker: dict[str, Any],
    setup: dict[str, Any],
) -> str:
    """kafka.json (the setup, every repetition and the summary) and kafka.png; the
    table to print."""
    write_json(
        out / "kafka.json",
        broker,
        setup=setup,
        aggregation=AGGREGATION,
        summary=[r.to_json() for r in rows],
        cells=[c.to_dict() for c in cells],
    )
    plot_kafka(rows, out / "kafka.png")
    return f"{render_kafka_table(rows)}\n\nwrote {out / 'kafka.json'} and {out / 'kafka.png'}"


def plot_kafka(rows: list[KafkaRow], path: Path) -> None:
    """Records/s of each side per row (log scale), the ratio to the baseline on top."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4.5))
    xs = list(range(len(rows)))
    bars = (("baseline", -0.27), ("listener", 0.0), ("kafka", 0.27))
    for side, offset in bars:
        values = [(r.baseline if side == "baseline" else r.cells.get(side)) for r in rows]
        ax.bar(
            [x + offset for x in xs],
            [c.records_per_s if c else 0 for c in values],
            width=0.27,
            label={
                "baseline": "baseline (direct Pulsar; txn: idempotent listener)",
                "listener": "Kafka client through the listener",
                "kafka": "Kafka client, real Apache Kafka",
            }[side],
        )
    for x, r in zip(xs, rows, strict=True):
        lst = r.cells.get("listener")
        if r.ratio is not None and lst is not None:
            ax.annotate(
                f"{r.ratio:.2f}x", (x, lst.records_per_s), ha="center", va="bottom", fontsize=8
            )
    ax.set_xticks(xs, [r.label for r in rows], fontsize=7, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("records/s")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    fig.suptitle(
        "Kafka clients through the kop-dedup listener vs direct Pulsar and a real Kafka\n"
        f"(same machine, same run; {reps_label((r.reps for r in rows), 'side')}; ratio: "
        "listener / baseline)",
        fontsize=8,
    )
    save_figure(plt, fig, path)
