"""The audit as a Structured Streaming query that keeps checking new data.

Each micro-batch's idempotence keys are merged into a key table kept as
Parquet under the checkpoint directory (so a restarted query resumes with
what it had seen, as the connector resumes from its checkpointed offsets),
and the whole table is checked again: the report after every batch covers
everything read so far.

>>> reports = run_stream(spark, ["orders"], service_url=..., admin_url=...,
...                      checkpoint="/tmp/audit-ckpt", trigger_seconds=5, max_batches=3)
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kop_dedup.spark.audit import KEY, AuditReport, check, kafka_records, read_topics

__all__ = ["run_stream"]


def run_stream(
    spark: Any,
    topics: list[str],
    *,
    service_url: str,
    admin_url: str,
    checkpoint: str,
    tenant: str = "public",
    namespace: str = "kafka",
    trigger_seconds: float = 10.0,
    max_batches: int | None = None,
    timeout: float | None = None,
    on_report: Callable[[int, AuditReport], None] | None = None,
) -> list[AuditReport]:
    """Run until ``max_batches`` non-empty micro-batches were checked (or ``timeout``)."""
    root = Path(checkpoint)
    table = root / "keys"
    reports: list[AuditReport] = []
    done = threading.Event()

    def merge(batch: Any, batch_id: int) -> None:
        records = kafka_records(batch).select(*KEY, "message_id")
        if records.isEmpty():
            return
        started = time.monotonic()
        seen = spark.read.parquet(str(table)) if table.exists() else None
        merged = records if seen is None else seen.unionByName(records)
        staging = root / f"keys-{batch_id}"
        merged.write.mode("overwrite").parquet(str(staging))
        if table.exists():
            shutil.rmtree(table)
        staging.rename(table)
        everything = spark.read.parquet(str(table))
        report = check(everything, seconds=time.monotonic() - started)
        reports.append(report)
        if on_report is not None:
            on_report(batch_id, report)
        print(
            f"audit stream batch {batch_id}: {report.records} records so far, "
            f"{report.duplicates} duplicates, {report.missing} missing",
            file=sys.stderr,
        )
        if max_batches is not None and len(reports) >= max_batches:
            done.set()

    raw = read_topics(
        spark,
        topics,
        service_url=service_url,
        admin_url=admin_url,
        tenant=tenant,
        namespace=namespace,
        stream=True,
    )
    query = (
        raw.writeStream.foreachBatch(merge)
        .option("checkpointLocation", str(root / "offsets"))
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.is_set():
            if query.exception() is not None:
                raise RuntimeError(f"the audit stream failed: {query.exception()}")
            if deadline is not None and time.monotonic() > deadline:
                break
            done.wait(0.5)
    finally:
        query.stop()
    return reports
