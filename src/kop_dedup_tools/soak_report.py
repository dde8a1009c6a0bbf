"""What a soak run found: the report, as text for the terminal and as JSON.

:class:`SoakReport` holds the seed and the schedule (to replay), the faults as applied
(with their times into the run), the copier restarts, the throughput of each pipeline,
and one :class:`~kop_dedup_tools.soak_check.CheckResult` per check and reader. ``ok`` is
False when any check found a violation or a pipeline never finished.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup_tools.soak_check import CheckResult
from kop_dedup_tools.soak_copiers import Restart

__all__ = ["AppliedFault", "PipelineFigures", "SoakReport"]


@dataclass(frozen=True, slots=True)
class AppliedFault:
    index: int
    kind: str
    params: dict[str, Any]
    at_s: float
    seconds: float
    """Until the cluster was back."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PipelineFigures:
    name: str
    copiers: int
    records: int
    """Input records the group committed."""
    seconds: float | None
    """From the copiers' start until the group had committed the whole input (None: it
    never did)."""

    @property
    def records_per_s(self) -> float | None:
        return round(self.records / self.seconds, 1) if self.seconds else None


@dataclass
class SoakReport:
    seed: int
    command: str
    workdir: str
    schedule: list[dict[str, Any]]
    input_records: int = 0
    faults: list[AppliedFault] = field(default_factory=list)
    cluster_events: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    hangs: list[Restart] = field(default_factory=list)
    """Copiers that printed nothing for too long, and were killed and started again."""
    pipelines: list[PipelineFigures] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    """Pipelines that did not finish within the drain time (what they had committed)."""
    answers: dict[str, int] = field(default_factory=dict)
    """The LSO watcher's answers by source."""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.stalled and all(c.ok for c in self.checks)

    def check(self, name: str) -> list[CheckResult]:
        """The results of one check (``lost``, ``lso``...), one per reader."""
        return [c for c in self.checks if c.name.split(" (")[0].startswith(name)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seed": self.seed,
            "command": self.command,
            "workdir": self.workdir,
            "seconds": round(self.seconds, 1),
            "input_records": self.input_records,
            "schedule": self.schedule,
            "faults": [asdict(f) for f in self.faults],
            "cluster_events": self.cluster_events,
            "restarts": [asdict(r) for r in self.restarts],
            "hangs": [asdict(r) for r in self.hangs],
            "pipelines": [{**asdict(p), "records_per_s": p.records_per_s} for p in self.pipelines],
            "checks": [c.to_dict() for c in self.checks],
            "stalled": self.stalled,
            "answers": self.answers,
            "notes": self.notes,
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def text(self) -> str:
        lines = [
            f"soak {'PASSED' if self.ok else 'FAILED'} (seed {self.seed}) in {self.seconds:.0f}s"
        ]
        lines.append(f"  replay: {self.command}")
        lines.append(f"  logs: {self.workdir}")
        lines.append(f"  input: {self.input_records} records")
        lines.append(f"  faults applied: {len(self.faults)}")
        for f in self.faults:
            params = ", ".join(f"{k}={v}" for k, v in f.params.items())
            failed = f"  FAILED: {f.error}" if f.error else ""
            lines.append(
                f"    {f.at_s:7.1f}s #{f.index} {f.kind} ({params}) back after "
                f"{f.seconds:.1f}s{failed}"
            )
        by_status = Counter(
            "caught up (exit 0)" if r.status == 0 else f"exit {r.status}" for r in self.restarts
        )
        lines.append(
            f"  copier restarts: {len(self.restarts)}"
            + (
                f" ({', '.join(f'{n} {k}' for k, n in sorted(by_status.items()))})"
                if by_status
                else ""
            )
        )
        lines += [f"    HUNG {h.at_s:7.1f}s {h.copier}: {h.reason}" for h in self.hangs]
        for p in self.pipelines:
            rate = f"{p.records_per_s} records/s" if p.records_per_s else "never finished"
            took = f"{p.seconds:.0f}s" if p.seconds else "-"
            lines.append(f"  {p.name}: {p.copiers} copiers, {p.records} records in {took}: {rate}")
        if self.answers:
            lines.append(
                "  LSO answers watched: " + ", ".join(f"{n} {k}" for k, n in self.answers.items())
            )
        lines.append("  checks:")
        for c in self.checks:
            mark = "ok  " if c.ok else "FAIL"
            lines.append(f"    {mark} {c.name}: {c.violations} violations of {c.checked} checked")
            lines += [f"         e.g. {e}" for e in c.examples]
        lines += [f"  STALLED: {s}" for s in self.stalled]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
