"""What the transaction coordinator did (this sidecar, since start): ``/v1/stats`` and
the Prometheus counters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kop_dedup.coordination.transactions.copier import Copier
from kop_dedup.coordination.transactions.local_copy import LocalCopy

__all__ = ["TxnStats"]


@dataclass(slots=True)
class TxnStats:
    """What the coordinator did (this sidecar, since start)."""

    commits: int = 0
    aborts: int = 0
    timeouts: int = 0
    fenced: int = 0
    check_backs: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("COMMIT", "ROLLBACK", "UNKNOWN"), 0)
    )
    copy_state_lost: int = 0
    copy_unresolved: int = 0
    """Attempts at a copy that could not be resolved (``CopyUnresolved``); the gauge
    ``txn_copy_unresolved`` counts the decisions unresolved now."""
    copy_partitions_dropped: int = 0
    """Partitions dropped from a commit's copy: their topic was deleted since the decision."""
    apply_retries: int = 0
    """Attempts to apply a decision that failed and were tried again."""
    applied_ms: list[float] = field(default_factory=list)
    """Decision to applied, milliseconds (the last 1,000)."""
    local: LocalCopy | None = None
    copier: Copier | None = None

    def applied(self, ms: float) -> None:
        self.applied_ms.append(ms)
        del self.applied_ms[:-1000]

    def to_dict(self) -> dict[str, object]:
        ordered = sorted(self.applied_ms)

        def pct(q: float) -> float | None:
            return round(ordered[int(q * (len(ordered) - 1))], 2) if ordered else None

        return {
            "commits": self.commits,
            "aborts": self.aborts,
            "timeouts": self.timeouts,
            "fenced": self.fenced,
            "checkBacks": dict(self.check_backs),
            "copyStateLost": self.copy_state_lost,
            "copyUnresolvedAttempts": self.copy_unresolved,
            "copyPartitionsDropped": self.copy_partitions_dropped,
            "applyRetries": self.apply_retries,
            "appliedMsP50": pct(0.5),
            "appliedMsP99": pct(0.99),
            "localCopy": None if self.local is None else self.local.to_dict(),
            "copyProducers": None
            if self.copier is None
            else {"open": self.copier.open_producers(), "created": self.copier.created},
        }

    def counters(self) -> list[tuple[str, str, Sequence[tuple[Mapping[str, str], float]]]]:
        """Prometheus counter families (see observability.metrics.render)."""
        return [
            (
                "txn_completed_total",
                "Transactions this sidecar applied, by decision.",
                [({"decision": "commit"}, self.commits), ({"decision": "abort"}, self.aborts)],
            ),
            (
                "txn_timeouts_total",
                "Transactions aborted or checked back on timeout.",
                [({}, self.timeouts)],
            ),
            (
                "txn_fenced_total",
                "Open transactions fenced by a new init-producer-id.",
                [({}, self.fenced)],
            ),
            (
                "txn_check_backs_total",
                "Check-backs to applications, by answer.",
                [({"answer": a}, n) for a, n in sorted(self.check_backs.items())],
            ),
            (
                "txn_apply_retries_total",
                "Attempts to apply a decision that failed and were tried again.",
                [({}, self.apply_retries)],
            ),
            (
                "txn_copy_partitions_dropped_total",
                "Partitions dropped from a commit's copy: their topic was deleted since.",
                [({}, self.copy_partitions_dropped)],
            ),
            (
                "txn_copy_state_lost_total",
                "Recoveries that found a copy's producer name forgotten by the broker.",
                [({}, self.copy_state_lost)],
            ),
        ]
