"""What the audit takes as stable: each audited partition's last stable offset (LSO),
noted before the data is read.

A committed transaction is copied into its partitions after EndTxn was answered, batch
by batch; a copy in progress while the audit reads shows part of the transaction, which
is no loss. So before the data is read the audit notes (:func:`stable_snapshot`):

1. each audited partition's last entry (the admin API's ``lastMessageId``): what comes
   after it may be a copy in progress;
2. then the transaction log, read to its end: a transaction being copied
   (PrepareCommit) may lie in part after its decision's ``dataStart`` position (its
   copy's first entry is written after the decision is durable, so after that entry).

A record after the earliest of those entries in its partition lies at or after the
partition's LSO: it is *not yet stable* (:func:`mark_unstable`). A transaction with such
a record, or one the log did not have complete when it was read (or, its transactional
id unknown to the log then, one decided after the note was taken) is reported *not yet
stable* instead of incomplete or undecided (:mod:`kop_dedup.spark.transactions`). The
duplicate and aborted-record checks read every record. (Clocks are assumed in step: a
decision's ``at`` is its sidecar's clock, the note's time the audit's.)

>>> snapshot = stable_snapshot(["orders"], service_url=..., admin_url=...)
>>> records = mark_unstable(kafka_records(raw), snapshot)   # adds the ``unstable`` column
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from kop_dedup.clock import now_ms
from kop_dedup.pulsar.snapshot import read_latest

__all__ = ["BEFORE_ALL", "StableSnapshot", "mark_unstable", "stable_snapshot"]

Entry = tuple[int, int]
BEFORE_ALL: Entry = (-1, -1)
"""A bound every stored entry lies after (a partition empty, or a decision that saw it so)."""
_PREPARE_COMMIT = "PrepareCommit"
_COMPLETE = ("CompleteCommit", "CompleteAbort")
_SKEW_MS = 60_000
"""How much earlier than the note a record published after it may say it was (the
publish time is its producer's clock)."""


@dataclass(frozen=True)
class StableSnapshot:
    """The note taken before the data is read (see the module docstring)."""

    taken_ms: int
    bounds: dict[tuple[str, int], Entry] = field(default_factory=dict)
    """(Kafka topic, partition) -> the entry after which records are not yet stable."""
    transactions: dict[str, tuple[int, bool]] = field(default_factory=dict)
    """Transactional id -> (ordinal, complete) as the log had it."""
    copying: set[tuple[str, int]] = field(default_factory=set)
    """The partitions a transaction was being copied into."""


def _get(admin_url: str, path: str) -> Any:
    r = httpx.get(f"{admin_url.rstrip('/')}/admin/v2/persistent/{path}", timeout=30)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.json()


def _partitions(admin_url: str, path: str) -> int:
    body = _get(admin_url, f"{path}/partitions")
    return 0 if body is None else int(body.get("partitions", 0))


def _last_entry(admin_url: str, path: str) -> Entry:
    body = _get(admin_url, f"{path}/lastMessageId")
    if body is None or int(body.get("ledgerId", -1)) < 0:
        return BEFORE_ALL
    return int(body["ledgerId"]), int(body["entryId"])


def _entry(text: str | None) -> Entry:
    """A decision's ``dataStart`` (``"ledger:entry"``; None: the partition was empty)."""
    if not text:
        return BEFORE_ALL
    ledger, entry = text.split(":")[:2]
    return int(ledger), int(entry)


def _newer(data: bytes, kept: bytes) -> bool:
    """A transaction log record replaces the one kept unless its version is lower."""
    return int(json.loads(data).get("version", 0)) >= int(json.loads(kept).get("version", 0))


def stable_snapshot(
    topics: list[str],
    *,
    service_url: str,
    admin_url: str,
    tenant: str = "public",
    namespace: str = "kafka",
    system_namespace: str,
) -> StableSnapshot:
    """The note of :mod:`this module <kop_dedup.spark.stable>` for the Kafka ``topics``:
    their partitions' last entries first, then the transaction log."""
    taken = now_ms()
    bounds: dict[tuple[str, int], Entry] = {}
    for topic in topics:
        path = f"{tenant}/{namespace}/{topic}"
        for p in range(_partitions(admin_url, path)):
            bounds[topic, p] = _last_entry(admin_url, f"{path}-partition-{p}")
    log_path = f"{tenant}/{system_namespace}/transaction-log"
    count = _partitions(admin_url, log_path)
    raw = read_latest(service_url, f"persistent://{log_path}", count, newer=_newer) if count else {}
    transactions: dict[str, tuple[int, bool]] = {}
    copying: set[tuple[str, int]] = set()
    for tid, data in raw.items():
        doc = json.loads(data)
        state = str(doc.get("state"))
        transactions[tid] = (int(doc.get("ordinal", 0)), state in _COMPLETE)
        if state != _PREPARE_COMMIT:
            continue
        for part in doc.get("partitions") or []:
            key = (str(part.get("topic")), int(part.get("partition", -1)))
            if key in bounds:
                bounds[key] = min(bounds[key], _entry(part.get("dataStart")))
                copying.add(key)
    return StableSnapshot(taken, bounds, transactions, copying)


def mark_unstable(records: Any, snapshot: StableSnapshot) -> Any:
    """``records`` (shaped like :func:`kop_dedup.spark.audit.kafka_records`) with an
    ``unstable`` column: true for a record after its partition's bound. A record's
    position is decoded (a Python function) only where the bound may lie before it: in
    a partition a transaction was being copied into, or published since shortly before
    the note was taken (a record after a partition's last entry then came later)."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415
    from pyspark.sql import types as T  # noqa: N812, PLC0415

    from kop_dedup.spark.groups import message_id_decoder  # noqa: PLC0415

    decode = message_id_decoder()
    bounds = {f"{t}\x00{p}": b for (t, p), b in snapshot.bounds.items()}

    def after(topic: str | None, partition: int | None, message_id: str | None) -> bool:
        bound = bounds.get(f"{topic}\x00{partition}")
        at = decode(message_id)
        return bound is not None and at is not None and (at[0], at[1]) > bound

    copying = F.lit(False)  # noqa: FBT003
    for topic, partition in sorted(snapshot.copying):
        copying = copying | ((F.col("topic") == topic) & (F.col("partition") == partition))
    since = F.unix_millis("publish_time") >= snapshot.taken_ms - _SKEW_MS
    maybe = F.coalesce(copying | since, F.lit(True))  # noqa: FBT003
    placed = records.where(maybe).withColumn(
        "unstable", F.udf(after, T.BooleanType())("topic", "partition", "message_id")
    )
    return records.where(~maybe).withColumn("unstable", F.lit(False)).unionByName(placed)  # noqa: FBT003
