"""What every ``kop-dedup bench`` mode measures, in one shape: a **cell** is one timed run
of one **workload** (what is done: a kind, how many clients, how many records at a time,
paced or not) against one **target** (who does it: ``direct`` Pulsar, the ``sidecar``,
the Kafka ``listener``, a real ``kafka``, ...). Its figures: records/s, latency p50 and
p99, the sidecar's CPU per record (psutil, over the cell), its memory where measured,
and a mode's own figures in ``extra``.

Every repetition is kept; a **row** shows, per workload, each target's best repetition
by records/s (each target on its own: the least disturbed run on a shared machine) and
compares them as the run's :class:`Compare` says: the subject over its baseline (the
``ratio``, against a ``goal`` where the issue sets one), over the reference (a real
Kafka: ``vs_reference``), and, for a paced workload, the latency it adds.

>>> w = Workload("produce", clients=8, size=100)
>>> cells = [Cell(w, "direct", 1, 80_000, 1.0, 5.5, 10.3),
...          Cell(w, "sidecar", 1, 66_000, 1.0, 7.0, 12.1, sidecar_cpu_s=0.9)]
>>> [row] = summarize(cells, Compare("sidecar"))
>>> row.ratio, row.cells["sidecar"].cpu_us_per_record
(0.825, 13.64)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AGGREGATION",
    "KINDS",
    "Cell",
    "Compare",
    "Row",
    "Workload",
    "extras",
    "reps_label",
    "summarize",
]

AGGREGATION = "best repetition by records/s, chosen for each target on its own"

KINDS: dict[str, tuple[str, str]] = {
    "produce": ("produce, batch {size}, {clients} prod", "a batch, sent to acknowledged"),
    "rounds": ("txn rounds of {size}, {clients} prod", "a produce request (100 records)"),
    "pull": ("pull {size} + commit, {clients} member{s}", "a pull and its commit"),
    "e2e": ("produce -> pull, {clients} member{s}", "a record, sent to pulled"),
    "fetch": ("fetch, {clients} consumer{s}", ""),
    "fetch-parts": ("fetch {size} partitions, {clients} consumer{s}", ""),
    "txn": ("txn of {size}, {clients} prod", "a transaction, begin to commit answered"),
    "consume": ("group consume, {clients} member{s}", "a consume() or batch receive"),
    "ctp": ("copy, txn of {size}, {clients} copier{s}", "a transaction, begin to commit"),
    "idle-states": ("idle producer states, {clients} at a time", ""),
}
"""Each kind of workload: its row label and what one latency sample is."""


@dataclass(frozen=True, slots=True)
class Workload:
    """What a cell does: ``kind`` (a :data:`KINDS` key), ``clients`` (producers,
    members, consumers, copiers), ``size`` (records per batch, pull, transaction or
    round) and, for a paced run, ``rate`` (records/s over all clients)."""

    kind: str
    clients: int
    size: int
    rate: float | None = None

    @property
    def label(self) -> str:
        text = KINDS.get(self.kind, (f"{self.kind} {{size}}, {{clients}} client{{s}}", ""))[0]
        text = text.format(size=self.size, clients=self.clients, s="" if self.clients == 1 else "s")
        return text if self.rate is None else f"{text}, paced at {self.rate:,.0f} rec/s"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "clients": self.clients, "size": self.size, "rate": self.rate}


def extras(**figures: Any) -> dict[str, Any]:
    """A cell's own figures, without the ones that were not measured (None)."""
    return {k: v for k, v in figures.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Cell:
    """One timed run of one workload against one target (repetition ``rep``, from 1)."""

    workload: Workload
    target: str
    rep: int
    records: int
    seconds: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    sidecar_cpu_s: float | None = None
    """The sidecar processes' CPU seconds over the cell (None: no sidecar in it)."""
    rss_mb: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_record(self) -> float | None:
        if self.sidecar_cpu_s is None or not self.records:
            return None
        return round(self.sidecar_cpu_s / self.records * 1e6, 2)

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload.to_json(),
            "target": self.target,
            "rep": self.rep,
            "records": self.records,
            "seconds": self.seconds,
            "records_per_s": round(self.records_per_s, 1),
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "sidecar_cpu_s": self.sidecar_cpu_s,
            "cpu_us_per_record": self.cpu_us_per_record,
            "rss_mb": self.rss_mb,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cell:
        fields = {k: data.get(k) for k in ("p50_ms", "p99_ms", "sidecar_cpu_s", "rss_mb")}
        return cls(
            Workload(**data["workload"]),
            data["target"],
            data["rep"],
            data["records"],
            data["seconds"],
            **fields,
            extra=dict(data.get("extra") or {}),
        )

    def progress(self) -> str:
        """The progress line of a finished cell."""
        figures = [f"{self.records_per_s:>9,.0f} rec/s"]
        if self.p50_ms is not None and self.p99_ms is not None:
            figures.append(f"p50 {self.p50_ms:.1f} p99 {self.p99_ms:.1f} ms")
        if self.cpu_us_per_record is not None:
            figures.append(f"sidecar cpu {self.cpu_us_per_record:.1f} us/rec")
        checks = ("drained", "gaps", "committed_ok", "unread_rounds", "first_record_ms")
        figures += [f"{k} {self.extra[k]}" for k in checks if k in self.extra]
        return f"bench: {self.workload.label}, {self.target} rep {self.rep}: " + ", ".join(figures)


@dataclass(frozen=True, slots=True)
class Compare:
    """What a run's rows compare: the ``subject`` over its ``baseline`` (the ratio) and
    over the ``reference`` (a real Kafka). ``baseline_of`` gives a kind the baseline of
    another row: ``{"txn": ("produce", "listener")}`` compares transactions with the
    listener of the produce row of as many clients. ``goals``: the least ratio the issue
    asks of a kind."""

    subject: str
    baseline: str | None = "direct"
    reference: str | None = None
    baseline_of: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    goals: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "baseline": self.baseline,
            "reference": self.reference,
            "baseline_of": {k: list(v) for k, v in self.baseline_of.items()},
            "goals": dict(self.goals),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Compare:
        of = {k: (v[0], v[1]) for k, v in (data.get("baseline_of") or {}).items()}
        return cls(
            data["subject"],
            data.get("baseline"),
            data.get("reference"),
            of,
            dict(data.get("goals") or {}),
        )


def _ratio(subject: Cell | None, base: Cell | None) -> float | None:
    if subject is None or base is None or not base.records_per_s:
        return None
    return round(subject.records_per_s / base.records_per_s, 3)


def _added(subject: Cell | None, base: Cell | None, q: str) -> float | None:
    a, b = (None if c is None else getattr(c, q) for c in (subject, base))
    return None if a is None or b is None else round(a - b, 2)


@dataclass(frozen=True, slots=True)
class Row:
    """One workload: each target's best repetition, and the comparisons."""

    workload: Workload
    reps: int
    """Repetitions the best was chosen from (the fewest of the targets')."""
    cells: Mapping[str, Cell]
    compare: Compare
    baseline: Cell | None = None

    @property
    def subject(self) -> Cell | None:
        return self.cells.get(self.compare.subject)

    @property
    def ratio(self) -> float | None:
        """The subject's records/s over the baseline's (3 decimals, as the JSON keeps
        it and the table shows it)."""
        return _ratio(self.subject, self.baseline)

    @property
    def vs_reference(self) -> float | None:
        ref = self.compare.reference
        return _ratio(self.subject, self.cells.get(ref) if ref else None)

    @property
    def goal(self) -> float | None:
        return None if self.workload.rate else self.compare.goals.get(self.workload.kind)

    @property
    def met(self) -> bool | None:
        return None if self.goal is None or self.ratio is None else self.ratio >= self.goal

    @property
    def added_ms(self) -> tuple[float | None, float | None]:
        """The subject's p50 and p99 minus the baseline's: what a paced row compares."""
        return (
            _added(self.subject, self.baseline, "p50_ms"),
            _added(self.subject, self.baseline, "p99_ms"),
        )

    def to_json(self) -> dict[str, Any]:
        added = self.added_ms
        return {
            "workload": self.workload.to_json(),
            "label": self.workload.label,
            "reps": self.reps,
            "cells": {t: c.to_json() for t, c in self.cells.items()},
            "baseline_records_per_s": (
                None if self.baseline is None else round(self.baseline.records_per_s, 1)
            ),
            "ratio": self.ratio,
            "goal": self.goal,
            "met": self.met,
            "vs_reference": self.vs_reference,
            "added_p50_ms": added[0],
            "added_p99_ms": added[1],
        }


def summarize(cells: Iterable[Cell], compare: Compare) -> list[Row]:
    """The one aggregation (table, plot and JSON summary): per workload, in the order the
    cells came, each target's repetition with the most records/s; each row's baseline."""
    groups: dict[Workload, dict[str, list[Cell]]] = {}
    for c in cells:
        groups.setdefault(c.workload, {}).setdefault(c.target, []).append(c)
    best = {
        w: {t: max(runs, key=lambda c: c.records_per_s) for t, runs in targets.items()}
        for w, targets in groups.items()
    }

    def baseline(w: Workload) -> Cell | None:
        if w.kind not in compare.baseline_of:
            return best[w].get(compare.baseline) if compare.baseline else None
        kind, target = compare.baseline_of[w.kind]
        same = (
            b for v, b in best.items() if (v.kind, v.clients, v.rate) == (kind, w.clients, None)
        )
        return next((b[target] for b in same if target in b), None)

    return [
        Row(w, min(len(runs) for runs in groups[w].values()), best[w], compare, baseline(w))
        for w in groups
    ]


def reps_label(rows: Iterable[Row]) -> str:
    """What the figures are: one repetition, or the best of how many."""
    counts = sorted({r.reps for r in rows})
    if counts in ([], [1]):
        return "one repetition per target"
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"best of {n} repetitions by records/s, each target on its own"
