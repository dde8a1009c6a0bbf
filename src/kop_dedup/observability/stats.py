"""Counters and a latency histogram, as JSON for REST and as Prometheus text.

Outcomes are counted per Kafka topic and per producer id. Prometheus gets
per-topic series only (producer ids are unbounded label values); the REST
endpoint answers per producer id.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from kop_dedup.errors import KafkaError

__all__ = ["OUTCOMES", "Counters", "Stats"]

OUTCOMES = ("accepted", "duplicate", "out_of_order", "fenced", "invalid", "failed")
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(slots=True)
class Counters:
    batches: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))

    def add(self, outcome: str, records: int) -> None:
        self.batches[outcome] += 1
        self.records[outcome] += records

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {"batches": dict(self.batches), "records": dict(self.records)}


def outcome_for(error_code: int) -> str:
    """Which counter a Kafka error code falls in."""
    return {
        0: "accepted",
        46: "duplicate",
        45: "out_of_order",
        47: "fenced",
        90: "fenced",
        87: "invalid",
        10: "invalid",
        17: "invalid",
        3: "invalid",
        42: "invalid",
    }.get(error_code, "failed")


class Stats:
    def __init__(self) -> None:
        self.started = time.time()
        self.total = Counters()
        self.by_topic: dict[str, Counters] = {}
        self.by_producer: dict[int, Counters] = {}
        self._latency_counts = [0] * (len(_BUCKETS_S) + 1)
        self._latency_sum = 0.0
        self.http_requests = 0
        self.state_lost = 0

    def record(
        self,
        topic: str,
        producer_id: int,
        producer_epoch: int,  # noqa: ARG002 - interim: the stats rework counts it
        error: KafkaError | None,
        records: int,
        seconds: float,
    ) -> None:
        outcome = outcome_for(0 if error is None else error.errno)
        self.total.add(outcome, records)
        self.by_topic.setdefault(topic, Counters()).add(outcome, records)
        if producer_id >= 0:
            self.by_producer.setdefault(producer_id, Counters()).add(outcome, records)
        self._latency_counts[bisect.bisect_left(_BUCKETS_S, seconds)] += 1
        self._latency_sum += seconds

    def dedup_state_lost(
        self,
        topic: str,  # noqa: ARG002 - interim: the stats rework labels it
        producer_id: int,  # noqa: ARG002
        producer_epoch: int,  # noqa: ARG002
        first: int,  # noqa: ARG002
        last: int,  # noqa: ARG002
    ) -> None:
        self.state_lost += 1

    def totals(self) -> dict[str, object]:
        return {
            "uptimeSeconds": round(time.time() - self.started, 3),
            **self.total.to_dict(),
            "topics": len(self.by_topic),
            "producers": len(self.by_producer),
        }

    def prometheus(self, gauges: dict[str, float]) -> str:
        lines = [
            "# HELP kop_dedup_batches_total Kafka batches by outcome and topic.",
            "# TYPE kop_dedup_batches_total counter",
        ]
        for topic, c in sorted(self.by_topic.items()):
            lines.extend(
                f'kop_dedup_batches_total{{topic="{topic}",outcome="{o}"}} {c.batches[o]}'
                for o in OUTCOMES
            )
        lines += [
            "# HELP kop_dedup_records_total Kafka records by outcome and topic.",
            "# TYPE kop_dedup_records_total counter",
        ]
        for topic, c in sorted(self.by_topic.items()):
            lines.extend(
                f'kop_dedup_records_total{{topic="{topic}",outcome="{o}"}} {c.records[o]}'
                for o in OUTCOMES
            )
        lines += [
            "# HELP kop_dedup_batch_latency_seconds Time to answer one batch.",
            "# TYPE kop_dedup_batch_latency_seconds histogram",
        ]
        cumulative = 0
        for bound, n in zip((*_BUCKETS_S, float("inf")), self._latency_counts, strict=True):
            cumulative += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'kop_dedup_batch_latency_seconds_bucket{{le="{le}"}} {cumulative}')
        lines.append(f"kop_dedup_batch_latency_seconds_sum {self._latency_sum}")
        lines.append(f"kop_dedup_batch_latency_seconds_count {cumulative}")
        for name, value in sorted(gauges.items()):
            lines += [f"# TYPE kop_dedup_{name} gauge", f"kop_dedup_{name} {value}"]
        return "\n".join(lines) + "\n"
