"""What ``kop-dedup bench --kafka --groups`` measured and how it is shown: the cells of
each side, one aggregation (each side's best repetition by records/s, the rule of every
benchmark mode), the rows, the table, the plot and ``kafka-groups.json``.

Two measures:

============  ====================================================================
measure       sides
============  ====================================================================
``consume``   ``direct`` (a Pulsar consumer per member on its partitions, the
              ``--groups`` baseline), ``listener`` (a group of confluent-kafka
              consumers through the sidecar's listener), ``kafka`` (the same group,
              a real Kafka); a :class:`KafkaGroupCell` each
``ctp``       ``listener`` and ``kafka``: consume-transform-produce copiers
              (read_committed in, transactional out); a :class:`CtpCell` each
============  ====================================================================

A consume row's **ratio** is the listener over the direct side (the issue's target:
:data:`TARGET`); both rows' **vs_kafka** is the listener over the real Kafka.

>>> print(write_kafka_group_results(out, consume, ctp, broker, setup))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_groups_results import GroupCell
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
    "TARGET",
    "ConsumeRow",
    "CtpCell",
    "CtpRow",
    "KafkaGroupCell",
    "plot_kafka_groups",
    "render_kafka_groups_table",
    "summarize_consume",
    "summarize_ctp",
    "write_kafka_group_results",
]

TARGET = 0.5
"""The issue's target for a consume row's ratio (listener over direct)."""


@dataclass(frozen=True, slots=True)
class KafkaGroupCell(GroupCell):
    """A group of Kafka consumers reading a whole topic: a pull is a ``consume()`` that
    gave records, its commit asynchronous (the latency: sent to answered)."""

    join_s: float | None = None
    """From the first subscribe to a stable group (not in the rate)."""
    client_cpu_pct: float | None = None
    """The measuring process's CPU over the cell (it holds every member)."""


@dataclass(frozen=True, slots=True)
class CtpCell(Timed):
    """Consume-transform-produce copiers for a window."""

    mode: str
    """The side: ``listener`` or ``kafka``."""
    copiers: int
    txn_records: int
    rep: int
    records: int
    """Records of committed transactions."""
    transactions: int
    seconds: float
    drained: bool
    """The whole input was copied before the window ended."""
    p50_ms: float
    """A transaction from its begin (its first record consumed) to its commit answered."""
    p99_ms: float
    committed_ok: bool
    """The group's committed offsets add up to the records copied."""
    join_s: float | None = None
    sidecar_cpu_pct: float | None = None
    client_cpu_pct: float | None = None


def _ratio(subject: Timed | None, base: Timed | None) -> float | None:
    if subject is None or base is None or not base.records_per_s:
        return None
    return round(subject.records_per_s / base.records_per_s, 3)


@dataclass(frozen=True, slots=True)
class ConsumeRow:
    """One members count: each side's best repetition."""

    members: int
    reps: int
    cells: dict[str, GroupCell] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return _ratio(self.cells.get("listener"), self.cells.get("direct"))

    @property
    def vs_kafka(self) -> float | None:
        return _ratio(self.cells.get("listener"), self.cells.get("kafka"))

    @property
    def met(self) -> bool | None:
        return None if self.ratio is None else self.ratio >= TARGET

    def to_json(self) -> dict[str, Any]:
        return {
            "members": self.members,
            "reps": self.reps,
            **{s: (c.to_dict() if (c := self.cells.get(s)) else None) for s in _CONSUME},
            "ratio": self.ratio,
            "target": TARGET,
            "met": self.met,
            "vs_kafka": self.vs_kafka,
        }


@dataclass(frozen=True, slots=True)
class CtpRow:
    """One copiers count and transaction size: each side's best repetition."""

    copiers: int
    txn_records: int
    reps: int
    cells: dict[str, CtpCell] = field(default_factory=dict)

    @property
    def vs_kafka(self) -> float | None:
        return _ratio(self.cells.get("listener"), self.cells.get("kafka"))

    def to_json(self) -> dict[str, Any]:
        return {
            "copiers": self.copiers,
            "txn_records": self.txn_records,
            "reps": self.reps,
            **{s: (c.to_dict() if (c := self.cells.get(s)) else None) for s in _CTP},
            "vs_kafka": self.vs_kafka,
        }


_CONSUME = ("direct", "listener", "kafka")
_CTP = ("listener", "kafka")


def summarize_consume(cells: list[GroupCell]) -> list[ConsumeRow]:
    """Per members count and side, the repetition with the most records/s."""
    return [
        ConsumeRow(members, reps, best)
        for (members,), reps, best in best_of(cells, lambda c: (c.members,))
    ]


def summarize_ctp(cells: list[CtpCell]) -> list[CtpRow]:
    """Per (copiers, transaction size) and side, the repetition with the most records/s."""
    return [
        CtpRow(copiers, txn, reps, best)
        for (copiers, txn), reps, best in best_of(cells, lambda c: (c.copiers, c.txn_records))
    ]


def _rate(cell: Timed | None) -> str:
    return f"{cell.records_per_s:>10,.0f}" if cell else f"{'-':>10}"


def _num(value: float | None, width: int = 6, fmt: str = ".1f") -> str:
    return f"{value:>{width}{fmt}}" if value is not None else f"{'-':>{width}}"


def _consume_line(r: ConsumeRow) -> str:
    d, lst, k = (r.cells.get(s) for s in _CONSUME)
    ks = k if isinstance(k, KafkaGroupCell) else None
    ls = lst if isinstance(lst, KafkaGroupCell) else None
    verdict = "" if r.met is None else ("  met" if r.met else "  MISSED")
    return (
        f"{r.members:>7} | {_rate(d)} | {_rate(lst)} {_num(lst.commit_p99_ms if lst else None)} "
        f"{_num(lst.cpu_pct if lst else None, 7, '.0f')} {_num(ls.join_s if ls else None, 5)} | "
        f"{_num(r.ratio, 5, '.2f')} {f'>={TARGET:.1f}':>6} | {_rate(k)} "
        f"{_num(ks.join_s if ks else None, 5)} | {_num(r.vs_kafka, 8, '.2f')}{verdict}"
    )


def _ctp_line(r: CtpRow) -> str:
    lst, k = (r.cells.get(s) for s in _CTP)
    return (
        f"{r.copiers:>7} | {_rate(lst)} {_num(lst.p50_ms if lst else None)} "
        f"{_num(lst.p99_ms if lst else None)} "
        f"{_num(lst.sidecar_cpu_pct if lst else None, 7, '.0f')} | {_rate(k)} "
        f"{_num(k.p50_ms if k else None)} {_num(k.p99_ms if k else None)} | "
        f"{_num(r.vs_kafka, 8, '.2f')}"
    )


def render_kafka_groups_table(consume: list[ConsumeRow], ctp: list[CtpRow]) -> str:
    """Two tables, each with a heading that says what its figures are; a consume row
    says whether the listener met the target."""
    reps = reps_label([r.reps for r in consume] + [r.reps for r in ctp] or [1], "side")
    head = (
        f"{'members':>7} | {'direct':>10} | {'listener':>10} {'com99':>6} {'sc cpu%':>7} "
        f"{'join':>5} | {'ratio':>5} {'target':>6} | {'kafka':>10} {'join':>5} | "
        f"{'vs kafka':>8}"
    )
    lines = [
        (
            f"group consume, records/s to read the whole topic ({reps}); com99: an asynchronous "
            "commit's p99 in ms; join: seconds to a stable group (not in the rate); direct: "
            "a Pulsar consumer per member"
        ),
        head,
        "-" * len(head),
        *map(_consume_line, consume),
    ]
    if ctp:
        head = (
            f"{'copiers':>7} | {'listener':>10} {'p50':>6} {'p99':>6} {'sc cpu%':>7} | "
            f"{'kafka':>10} {'p50':>6} {'p99':>6} | {'vs kafka':>8}"
        )
        lines += [
            "",
            (
                f"consume-transform-produce, read_committed in, transactions of "
                f"{ctp[0].txn_records} records out, committed records/s; latencies per "
                "transaction in ms"
            ),
            head,
            "-" * len(head),
            *map(_ctp_line, ctp),
        ]
    return "\n".join(lines)


def write_kafka_group_results(
    out: Path,
    consume: list[GroupCell],
    ctp: list[CtpCell],
    broker: dict[str, Any],
    setup: dict[str, Any],
) -> str:
    """kafka-groups.json (the setup, every repetition, the summary) and kafka-groups.png;
    the table to print."""
    consume_rows, ctp_rows = summarize_consume(consume), summarize_ctp(ctp)
    write_json(
        out / "kafka-groups.json",
        broker,
        setup=setup,
        aggregation=AGGREGATION.replace("mode", "side"),
        summary={
            "consume": [r.to_json() for r in consume_rows],
            "ctp": [r.to_json() for r in ctp_rows],
        },
        cells={"consume": [c.to_dict() for c in consume], "ctp": [c.to_dict() for c in ctp]},
    )
    plot_kafka_groups(consume_rows, ctp_rows, out / "kafka-groups.png")
    table = render_kafka_groups_table(consume_rows, ctp_rows)
    return f"{table}\n\nwrote {out / 'kafka-groups.json'} and {out / 'kafka-groups.png'}"


_LABELS = {
    "direct": "direct Pulsar consumers",
    "listener": "Kafka clients through the listener",
    "kafka": "Kafka clients, real Apache Kafka",
}
_COLOURS = {"direct": "C0", "listener": "C1", "kafka": "C2"}


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _panel(
    ax: Any,
    bars: list[tuple[str, dict[str, Timed]]],
    ratios: list[float | None],
    sides: tuple[str, ...],
    title: str,
    *,
    log: bool,
) -> None:
    """One panel: per x label, a bar of each side's records/s (each side its colour in
    both panels); a ratio over the listener's bar where there is one."""
    xs = list(range(len(bars)))
    width = 0.8 / len(sides)
    for i, side in enumerate(sides):
        offset = (i - (len(sides) - 1) / 2) * width
        values = [c.records_per_s if (c := cells.get(side)) else 0 for _, cells in bars]
        ax.bar(
            [x + offset for x in xs],
            values,
            width=width,
            label=_LABELS[side],
            color=_COLOURS[side],
        )
    for x, (_, cells), ratio in zip(xs, bars, ratios, strict=True):
        if ratio is not None and (lst := cells.get("listener")) is not None:
            ax.annotate(f"{ratio:.2f}x", (x, lst.records_per_s), ha="center", va="bottom")
    ax.set_xticks(xs, [label for label, _ in bars])
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("records/s")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)


def plot_kafka_groups(consume: list[ConsumeRow], ctp: list[CtpRow], path: Path) -> None:
    """Records/s of each side per members count (the ratio on the listener's bar), and
    of each side per copiers count."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    _panel(
        axes[0],
        [(_count(r.members, "member"), dict(r.cells)) for r in consume],
        [r.ratio for r in consume],
        _CONSUME,
        "group consume (log scale; ratio: listener / direct)",
        log=True,
    )
    _panel(
        axes[1],
        [(_count(r.copiers, "copier"), dict(r.cells)) for r in ctp],
        [None for _ in ctp],
        _CTP,
        f"consume-transform-produce, transactions of {ctp[0].txn_records if ctp else '-'}",
        log=False,
    )
    reps = reps_label([r.reps for r in consume] + [r.reps for r in ctp] or [1], "side")
    fig.suptitle(
        "Kafka consumer groups through the kop-dedup listener vs direct Pulsar and a real "
        f"Kafka (same machine, same run; {reps})",
        fontsize=8,
    )
    save_figure(plt, fig, path)
