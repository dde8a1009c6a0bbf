"""Kafka's ProducerPerformance and TransactionalMessageCopier (from ``kafka-tools``) as
subprocesses, their output parsed into typed results; how a tool runs (its JVM, the
deadline, the files it writes) is in :mod:`tests.kafka_tools`.

What they print (4.1.2):

* ProducerPerformance (text, not JSON): every 5 s ``N records sent, R records/sec (M
  MB/sec), A ms avg latency, X ms max latency.``; at the end the same with ``, P ms
  50th, P ms 95th, P ms 99th, P ms 99.9th.``; failed sends print stack traces to stderr
  and are not counted.
* TransactionalMessageCopier: ``{"transactionalId", "stage", "time", "totalProcessed",
  "consumed", "remaining"}`` with stage ``ProcessLoop`` before each poll,
  ``RebalanceComplete`` (group mode) and ``ShutdownComplete`` (its shutdown hook). It
  copies records to the same partition number of the output topic, commits the
  consumed positions in each transaction, and exits once it has copied up to the input
  partition's end offset as of its start (``--max-messages -1``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kop_dedup_tools import kafka_jars
from tests.kafka_tools import ToolProcess, ToolRun, properties_file, run_tool, start_tool

__all__ = [
    "CopierReport",
    "CopierStatus",
    "PerfLine",
    "PerfReport",
    "copier_report",
    "perf_report",
    "run_producer_performance",
    "run_transactional_message_copier",
    "start_transactional_message_copier",
]


# -- ProducerPerformance -------------------------------------------------------------

_PERF = re.compile(
    r"^(?P<records>\d+) records sent, (?P<rate>[\d.]+) records/sec \((?P<mb>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency"
    r"(?:, (?P<p50>\d+) ms 50th, (?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, "
    r"(?P<p999>\d+) ms 99\.9th)?\.$"
)


@dataclass(frozen=True, slots=True)
class PerfLine:
    records: int
    records_per_sec: float
    mb_per_sec: float
    avg_latency_ms: float
    max_latency_ms: float
    percentiles_ms: tuple[int, int, int, int] | None
    """50th, 95th, 99th, 99.9th: only on the final line."""


@dataclass(frozen=True, slots=True)
class PerfReport:
    windows: tuple[PerfLine, ...]
    total: PerfLine | None
    """The final line (None when it died first); ``records`` counts acked sends only."""
    run: ToolRun | None = None


def perf_report(lines: Iterable[str], run: ToolRun | None = None) -> PerfReport:
    windows: list[PerfLine] = []
    total = None
    for line in lines:
        m = _PERF.match(line.strip())
        if m is None:
            continue
        pct = (
            (int(m["p50"]), int(m["p95"]), int(m["p99"]), int(m["p999"]))
            if m["p50"] is not None
            else None
        )
        parsed = PerfLine(
            int(m["records"]),
            float(m["rate"]),
            float(m["mb"]),
            float(m["avg"]),
            float(m["max"]),
            pct,
        )
        if pct is None:
            windows.append(parsed)
        else:
            total = parsed
    return PerfReport(tuple(windows), total, run)


def run_producer_performance(
    bootstrap: str,
    topic: str,
    workdir: Path,
    *,
    num_records: int,
    record_size: int = 100,
    throughput: int = -1,
    props: Mapping[str, object] | None = None,
    transactional_id: str | None = None,
    transaction_duration_ms: int | None = None,
    timeout: float = 180.0,
) -> PerfReport:
    """``num_records`` of ``record_size`` random bytes (acks=all, idempotent unless
    ``props`` say otherwise), flat out unless ``throughput`` >= 0."""
    config = {"bootstrap.servers": bootstrap, "acks": "all", **(props or {})}
    args = [
        *("--topic", topic, "--num-records", str(num_records)),
        *("--record-size", str(record_size), "--throughput", str(throughput)),
        *("--producer.config", str(properties_file(workdir, "perf", config))),
    ]
    if transactional_id is not None:
        args += ["--transactional-id", transactional_id]
    if transaction_duration_ms is not None:
        args += ["--transaction-duration-ms", str(transaction_duration_ms)]
    run = run_tool(kafka_jars.PRODUCER_PERFORMANCE, args, workdir, timeout)
    return perf_report(run.other_lines, run)


# -- TransactionalMessageCopier ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CopierStatus:
    transactional_id: str
    stage: str
    time: str
    total_processed: int
    consumed: int
    remaining: int


@dataclass(frozen=True, slots=True)
class CopierReport:
    statuses: tuple[CopierStatus, ...]
    shutdown_complete: bool
    run: ToolRun | None = None

    @property
    def total_processed(self) -> int:
        """Records copied in committed transactions (the last status says)."""
        return self.statuses[-1].total_processed if self.statuses else 0


def copier_report(events: Iterable[Mapping[str, Any]], run: ToolRun | None = None) -> CopierReport:
    statuses = tuple(
        CopierStatus(
            e["transactionalId"],
            e["stage"],
            e["time"],
            int(e["totalProcessed"]),
            int(e["consumed"]),
            int(e["remaining"]),
        )
        for e in events
        if "stage" in e
    )
    return CopierReport(statuses, any(s.stage == "ShutdownComplete" for s in statuses), run)


def start_transactional_message_copier(
    bootstrap: str,
    input_topic: str,
    input_partition: int,
    output_topic: str,
    transactional_id: str,
    group: str,
    workdir: Path,
    *,
    max_messages: int = -1,
    transaction_size: int = 200,
    transaction_timeout_ms: int = 60000,
    use_group_metadata: bool = True,
    group_mode: bool = False,
    random_aborts: bool = False,
) -> ToolProcess:
    """A copier of ``input_partition`` (or, in group mode, of the partitions its group
    assigns it) into the same partition of ``output_topic``, in transactions of up to
    ``transaction_size`` records that also commit the consumed offsets for ``group``."""
    args = [
        *("--broker-list", bootstrap, "--transactional-id", transactional_id),
        *("--input-topic", input_topic, "--input-partition", str(input_partition)),
        *("--output-topic", output_topic, "--consumer-group", group),
        *("--max-messages", str(max_messages), "--transaction-size", str(transaction_size)),
        *("--transaction-timeout", str(transaction_timeout_ms)),
    ]
    args += ["--use-group-metadata"] if use_group_metadata else []
    args += ["--group-mode"] if group_mode else []
    args += ["--enable-random-aborts"] if random_aborts else []
    return start_tool(kafka_jars.TRANSACTIONAL_MESSAGE_COPIER, args, workdir)


def run_transactional_message_copier(
    bootstrap: str,
    input_topic: str,
    input_partition: int,
    output_topic: str,
    transactional_id: str,
    group: str,
    workdir: Path,
    *,
    timeout: float = 120.0,
    **options: Any,
) -> CopierReport:
    """Copy until the input partition's end offset as of the start, then exit."""
    with start_transactional_message_copier(
        bootstrap,
        input_topic,
        input_partition,
        output_topic,
        transactional_id,
        group,
        workdir,
        **options,
    ) as tool:
        run = tool.wait(timeout)
    return copier_report(run.events, run)
