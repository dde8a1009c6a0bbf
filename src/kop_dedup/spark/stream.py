"""The audit as a Structured Streaming query that keeps checking new data.

Each micro-batch's idempotence keys are merged into a key table kept as
Parquet under the checkpoint directory (so a restarted query resumes with
what it had seen, as the connector resumes from its checkpointed offsets),
and the whole table is checked again, its transactions against the decisions
read after the batch: the report after every batch covers everything read so far.
A transaction being applied while a batch is read (copied, its decision not yet
appended) is reported undecided in that batch's report and settles in a later one.

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

from kop_dedup.spark.audit import (
    KEY,
    TXN_COLUMNS,
    AuditReport,
    check_with_decisions,
    kafka_records,
    kafka_topic,
    read_topics,
)
from kop_dedup.spark.transactions import SYSTEM_NAMESPACE

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
    system_namespace: str = SYSTEM_NAMESPACE,
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
    audited = {kafka_topic(t) for t in topics}

    def merge(batch: Any, batch_id: int) -> None:
        records = kafka_records(batch).select(*KEY, *TXN_COLUMNS, "message_id", "publish_time")
        if records.isEmpty():
            return
        started = time.monotonic()
        seen = spark.read.parquet(str(table)) if table.exists() else None
        merged = records if seen is None else seen.unionByName(records, allowMissingColumns=True)
        staging = root / f"keys-{batch_id}"
        merged.write.mode("overwrite").parquet(str(staging))
        if table.exists():
            shutil.rmtree(table)
        staging.rename(table)
        everything = spark.read.parquet(str(table))
        report = check_with_decisions(
            spark,
            everything,
            topics=audited,
            service_url=service_url,
            admin_url=admin_url,
            tenant=tenant,
            system_namespace=system_namespace,
            seconds=time.monotonic() - started,
        )
        reports.append(report)
        if on_report is not None:
            on_report(batch_id, report)
        print(
            f"audit stream batch {batch_id}: {report.records} records so far, "
            f"{report.duplicates} duplicates, {report.missing} missing, "
            f"{report.txn_incomplete + report.txn_aborted_visible + report.txn_undecided_visible}"
            " transaction violations",
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
