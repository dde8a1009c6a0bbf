"""What a load (:mod:`kop_dedup_tools.load`) is asked to play and what it reports: the
configuration, the report of what the producers were told, the slots and sequence runs
that name every delivered record, and the codes a producer retries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kop_dedup.protocol.records import SEQ_MODULUS

__all__ = [
    "RETRIABLE_CODES",
    "LoadConfig",
    "LoadError",
    "LoadReport",
    "Ranges",
    "Slot",
]

RETRIABLE_CODES = frozenset({3, 6, 7, 19, 51, 56})
"""Kafka codes a client retries with the same producer id, epoch and sequence."""

Slot = tuple[str, int, int]
"""(Kafka topic, partition, producer id): one sequence of batches."""
Ranges = tuple[tuple[int, int], ...]
"""(first extended sequence, count) runs, ascending."""


class LoadError(RuntimeError):
    """The load could not start (no producer id from any sidecar)."""


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """What to play. Per (producer, topic, partition): ``batches`` batches of ``records``."""

    urls: tuple[str, ...]
    topics: tuple[str, ...]
    partitions: int = 1
    producers: int = 4
    producer_ids: tuple[int, ...] = ()
    """Use these producer ids instead of asking ``/v1/init-producer-id`` (then
    ``producers`` is ignored)."""
    epoch: int = 0
    first_sequence: int = 0
    """Sequence of each partition's first record (a producer without state there may
    start anywhere; near 2**31 - 1 it exercises the wraparound)."""
    batches: int = 50
    records: int = 10
    in_flight: int = 5
    value_size: int = 32
    request_timeout_ms: int = 10_000
    """``timeoutMs`` of every produce request; the HTTP client waits 5 s longer."""
    delivery_timeout_s: float = 120.0
    """Per batch, from its first send: past it the batch is given up (fatal)."""
    duration_s: float | None = None
    """Start no new batch after this long (None: send them all)."""
    connections: int = 64
    token: str | None = None
    progress_every_s: float = 5.0
    """Print a progress line to stderr this often (0: never)."""

    def __post_init__(self) -> None:
        if not self.urls or not self.topics:
            raise ValueError("a load needs at least one sidecar URL and one topic")
        if min(self.partitions, self.records, self.in_flight, self.connections) < 1:
            raise ValueError("partitions, records, in_flight and connections must be >= 1")
        if not 0 <= self.first_sequence < SEQ_MODULUS:
            raise ValueError(f"first_sequence must be in 0..{SEQ_MODULUS - 1}")

    @property
    def lanes(self) -> int:
        """(producer, topic, partition) sequences the load plays."""
        n = len(self.producer_ids) or self.producers
        return n * len(self.topics) * self.partitions


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What the producers were told. ``delivered`` is what :func:`verify` must read back
    exactly once; ``uncertain`` batches were given up without a definite answer (they may
    or may not be stored)."""

    producer_ids: tuple[int, ...] = ()
    sent_batches: int = 0
    sent_records: int = 0
    acknowledged: int = 0
    duplicates: int = 0
    requests: int = 0
    retries: int = 0
    retry_reasons: dict[str, int] = field(default_factory=dict)
    fatal: dict[str, int] = field(default_factory=dict)
    desynced_producers: tuple[int, ...] = ()
    failovers: int = 0
    elapsed_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    """Per batch, first send to definite answer: p50, p99, max."""
    delivered: dict[Slot, Ranges] = field(default_factory=dict)
    uncertain: dict[Slot, Ranges] = field(default_factory=dict)
    finished: bool = False

    @property
    def answered(self) -> int:
        """Batches with a definite answer (0 or 46)."""
        return self.acknowledged + self.duplicates

    @property
    def delivered_records(self) -> int:
        return sum(n for runs in self.delivered.values() for _, n in runs)

    @property
    def records_per_s(self) -> float:
        return round(self.delivered_records / self.elapsed_s, 1) if self.elapsed_s else 0.0

    @property
    def ok(self) -> bool:
        return not self.fatal

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the counters, without the per-slot ranges."""
        d = {k: v for k, v in asdict(self).items() if k not in ("delivered", "uncertain")}
        d["delivered_records"] = self.delivered_records
        d["records_per_s"] = self.records_per_s
        d["uncertain_records"] = sum(n for runs in self.uncertain.values() for _, n in runs)
        return d
