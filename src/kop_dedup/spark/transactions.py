"""The transactional half of the audit: committed = wholly visible once, aborted = invisible.

A committed transaction's records are copied into the data topics with markers (see
:mod:`kop_dedup.coordination.transactions.copier`): every record carries the
transaction's ordinal, which with its producer id (one transactional id's alone) names
the transaction; the first record of each batch (a batch is stored whole or not at all)
also carries the transactional id, the batch's index, the transaction's record count in
that partition and its partition count. The coordinator also appends every decision,
keyed ``<transactionalId>/<ordinal>``, as JSON to ``<tenant>/<system namespace>/
transaction-decisions`` (written once the decision is applied, before CompleteCommit).

>>> decisions = read_decisions(spark, service_url=..., admin_url=...)  # None: no topic
>>> summary = check_transactions(records, decisions, topics={"orders"})
>>> summary.incomplete, summary.aborted_visible, summary.undecided_visible

What is checked, per transaction (producer id, ordinal) that touches an audited topic:

* every audited partition holds exactly its records, counted once (distinct
  idempotence keys, so a duplicated copy is a duplicate, not an incomplete
  transaction): the COMMIT decision's count there, else ``kafka.txn.records``;
* when every partition it wrote to lies in an audited topic, the partitions holding
  its records are all of them (the decision's non-empty partitions, else
  ``kafka.txn.partitions``); otherwise it is *partly audited* (not a violation).
  Without the decisions topic the audit cannot know a transaction's topics: one seen
  in fewer partitions than ``kafka.txn.partitions`` is counted partly audited;
* no record of an ABORT decision is visible;
* no visible transactional record lacks a decision (only when the decisions topic
  exists).

A transaction in the middle of being applied (copied in part, its decision not yet
appended) is no violation: given the note taken before the data was read
(:mod:`kop_dedup.spark.stable`), a transaction with a record at or after its partition's
last stable offset, or not complete in the log when the note was taken, is counted
*not yet stable* instead of incomplete or undecided. Without the note (a check of rows
given by hand) every transaction is checked: audit a quiescent system then.

The decisions topic keeps its records for a while only (the sidecar's
``journal_retention_minutes``, a day by default): a transaction first copied before the
oldest decision still there may have lost its decision to retention. It is counted
*decision expired*, not undecided, and checked by its markers alone, as without a
decisions topic. (The copy's publish time, the broker's clock, is compared with the
decision's ``at``, the sidecar's: clocks are assumed in step to well under a second.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from kop_dedup.coordination.transactions.copier import PROP_TXN_BATCH
from kop_dedup.coordination.transactions.journal import (
    PROP_TXN_ID,
    PROP_TXN_ORDINAL,
    PROP_TXN_PARTITIONS,
    PROP_TXN_RECORDS,
)
from kop_dedup.spark.stable import StableSnapshot

__all__ = [
    "DECISIONS_TOPIC",
    "SYSTEM_NAMESPACE",
    "TXN_COLUMNS",
    "TxnSummary",
    "check_transactions",
    "decisions_topic",
    "read_decisions",
    "txn_columns",
]

SYSTEM_NAMESPACE = "kop-dedup-system"
"""The sidecar's default ``system_namespace`` (see kop_dedup.settings)."""
DECISIONS_TOPIC = "transaction-decisions"
"""The decisions topic's name in the system namespace (as kop_dedup.runtime names it)."""

TXN_COLUMNS = ["txn_id", "txn_ordinal", "txn_batch", "txn_records", "txn_partitions"]
IDS = ["producer_id", "txn_ordinal"]
"""What names a transaction: its producer id (one transactional id's) and ordinal."""
_EXAMPLES = 10

_DECISION_SCHEMA = (
    "transactionalId STRING, ordinal LONG, producerId LONG, producerEpoch INT, "
    "decision STRING, partitions ARRAY<STRUCT<topic: STRING, partition: INT, records: LONG>>, "
    "groups ARRAY<STRING>, at LONG"
)


@dataclass(frozen=True)
class TxnSummary:
    records: int = 0
    """Records read that carry a transactional id (counted in the duplicate check too)."""
    committed: int = 0
    """COMMIT decisions touching an audited topic; without decisions, transactions seen."""
    aborted: int = 0
    """ABORT decisions touching an audited topic."""
    incomplete: int = 0
    """Committed transactions not wholly present (a partition short, or more, or absent)."""
    partly_audited: int = 0
    """Committed transactions that also wrote to topics not audited."""
    aborted_visible: int = 0
    """Aborted transactions with records visible."""
    undecided_visible: int = 0
    """Transactions with records visible and no decision (0 without the decisions topic)."""
    decision_expired: int = 0
    """Transactions visible, without a decision, copied before the oldest decision kept."""
    not_yet_stable: int = 0
    """Transactions at or after their partition's last stable offset, or not complete in
    the log when the audit began: not checked for completeness or a decision."""
    decisions_topic: str | None = None
    """The decisions topic read; None when it does not exist (decision checks skipped)."""
    examples: list[dict[str, Any]] = field(default_factory=list)


def decisions_topic(tenant: str = "public", system_namespace: str = SYSTEM_NAMESPACE) -> str:
    return f"persistent://{tenant}/{system_namespace}/{DECISIONS_TOPIC}"


def txn_columns(props: Any) -> list[Any]:
    """The markers of a copied transactional record as columns (null when absent)."""
    return [
        props[PROP_TXN_ID].alias("txn_id"),
        props[PROP_TXN_ORDINAL].cast("long").alias("txn_ordinal"),
        props[PROP_TXN_BATCH].cast("int").alias("txn_batch"),
        props[PROP_TXN_RECORDS].cast("long").alias("txn_records"),
        props[PROP_TXN_PARTITIONS].cast("int").alias("txn_partitions"),
    ]


def _exists(admin_url: str, topic: str) -> bool:
    path = topic.removeprefix("persistent://")
    r = httpx.get(f"{admin_url}/admin/v2/persistent/{path}/partitions", timeout=30)
    if r.status_code == 404:
        return False
    r.raise_for_status()
    return int(r.json().get("partitions", 0)) > 0


def read_decisions(
    spark: Any,
    *,
    service_url: str,
    admin_url: str,
    tenant: str = "public",
    system_namespace: str = SYSTEM_NAMESPACE,
) -> Any:
    """The decisions, one row per (transaction, partition) with the records copied there
    (a decision without partitions has one row with a null topic); None when the
    decisions topic does not exist. Read it after the data: a decision is appended after
    its copy, so every copy read has its decision in the topic by then."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    topic = decisions_topic(tenant, system_namespace)
    if not _exists(admin_url, topic):
        return None
    raw = (
        spark.read.format("pulsar")
        .option("service.url", service_url)
        .option("admin.url", admin_url)
        .option("topics", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    doc = F.from_json(F.col("value").cast("string"), _DECISION_SCHEMA)
    return (
        raw.select(doc.alias("d"))
        .where(F.col("d.transactionalId").isNotNull() & F.col("d.ordinal").isNotNull())
        .select(
            F.col("d.producerId").alias("producer_id"),
            F.col("d.ordinal").alias("txn_ordinal"),
            F.col("d.transactionalId").alias("txn_id"),
            F.col("d.decision").alias("decision"),
            F.col("d.at").alias("at"),
            F.explode_outer("d.partitions").alias("p"),
        )
        .select(
            *IDS,
            "txn_id",
            "decision",
            "at",
            F.col("p.topic").alias("topic"),
            F.col("p.partition").alias("partition"),
            F.col("p.records").alias("records"),
        )
        # a recovery that applies a decision again appends it again
        .dropDuplicates([*IDS, "topic", "partition"])
    )


def _per_partition(records: Any, decisions: Any, topics: set[str]) -> Any:
    """One row per (transaction, topic, partition): visible there, and expected."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    beyond = F.max(F.col("unstable").cast("int")) if "unstable" in records.columns else F.lit(0)

    parts = (
        records.where(F.col("txn_ordinal").isNotNull())
        .groupBy(*IDS, "topic", "partition")
        .agg(
            F.first("txn_id", ignorenulls=True).alias("txn_id"),
            F.count("*").alias("rows"),
            F.countDistinct("producer_id", "epoch", "sequence").alias("visible"),
            F.max("txn_records").alias("marked_records"),
            F.max("txn_partitions").alias("marked_partitions"),
            F.unix_millis(F.min("publish_time")).alias("first_seen"),
            beyond.alias("beyond"),
        )
    )
    if decisions is None:
        return parts.select(
            "*",
            F.lit(None).cast("string").alias("decision"),
            F.lit(None).cast("long").alias("decided_records"),
            F.lit(None).cast("long").alias("decided_partitions"),
            F.lit(None).cast("long").alias("decided_audited"),
            F.lit(None).cast("long").alias("decided_nonempty"),
            F.lit(None).cast("long").alias("horizon"),
            F.lit(None).cast("long").alias("decided_at"),
        )
    audited = F.col("topic").isin(sorted(topics))
    per_txn = decisions.groupBy(*IDS).agg(
        F.first("txn_id", ignorenulls=True).alias("decided_id"),
        F.first("decision", ignorenulls=True).alias("decision"),
        F.count("topic").alias("decided_partitions"),
        F.sum(F.when(audited, 1).otherwise(0)).alias("decided_audited"),
        F.sum(F.when(F.col("records") > 0, 1).otherwise(0)).alias("decided_nonempty"),
        F.max("at").alias("decided_at"),
    )
    decided = decisions.where(audited).select(
        *IDS, "topic", "partition", F.col("records").alias("decided_records")
    )
    # the oldest decision kept: retention drops the oldest first
    horizon = decisions.agg(F.min("at").alias("horizon"))
    return (
        parts.join(decided, [*IDS, "topic", "partition"], "full_outer")
        .join(per_txn, IDS, "left")
        .crossJoin(horizon)
        .withColumn("txn_id", F.coalesce(F.col("decided_id"), F.col("txn_id")))
        .drop("decided_id")
    )


def _with_snapshot(txns: Any, snapshot: StableSnapshot | None) -> Any:
    """``txns`` with the log's word on each when the note was taken (``snap_ordinal``,
    ``snap_complete``: null for an id the log did not have)."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    if snapshot is None or not snapshot.transactions:
        return txns.withColumn("snap_ordinal", F.lit(None).cast("long")).withColumn(
            "snap_complete", F.lit(None).cast("boolean")
        )
    snap = txns.sparkSession.createDataFrame(
        [(tid, o, c) for tid, (o, c) in snapshot.transactions.items()],
        "snap_id string, snap_ordinal long, snap_complete boolean",
    )
    joined = txns.join(F.broadcast(snap), txns["txn_id"] == snap["snap_id"], "left")
    return joined.drop("snap_id")


def _not_yet_stable(snapshot: StableSnapshot | None, decided: Any) -> Any:
    """A transaction not to be judged yet (see the module docstring): a record of it at
    or after its partition's LSO, or not complete in the log when the note was taken,
    or unknown to the log then and decided since."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    false = F.lit(False)  # noqa: FBT003
    if snapshot is None:
        return false
    ordinal, then = F.col("txn_ordinal"), F.col("snap_ordinal")
    known = then.isNotNull()
    complete = (ordinal < then) | ((ordinal == then) & F.col("snap_complete"))
    pending = known & ~F.coalesce(complete, false)
    late = ~known & decided & F.coalesce(F.col("decided_at") >= snapshot.taken_ms, false)
    return F.coalesce(F.col("beyond") > 0, false) | pending | late


def check_transactions(
    records: Any,
    decisions: Any,
    topics: set[str],
    *,
    source: str | None = None,
    snapshot: StableSnapshot | None = None,
) -> TxnSummary:
    """Check the transactions in ``records`` (shaped like audit.kafka_records) against
    ``decisions`` (:func:`read_decisions` of the topic ``source``, or None) for the
    Kafka ``topics`` audited; ``snapshot``: the note taken before the data was read
    (what is not yet stable is not checked)."""
    from pyspark.sql import Window  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    known = decisions is not None
    if known:
        decisions = decisions.cache()  # read three ways below: one scan of the topic
    true, false = F.lit(True), F.lit(False)  # noqa: FBT003
    visible = F.coalesce(F.col("visible"), F.lit(0))
    expected = F.when(F.col("decision") == "COMMIT", F.col("decided_records")).otherwise(
        F.col("marked_records")
    )
    parts = _per_partition(records, decisions, topics).select(
        *IDS,
        "txn_id",
        "topic",
        "partition",
        "decision",
        F.coalesce(F.col("rows"), F.lit(0)).alias("rows"),
        visible.alias("visible"),
        expected.alias("expected"),
        # a partition the COMMIT decision does not name (expected null) is wrong too
        F.coalesce(visible != expected, true).alias("wrong"),
        "marked_partitions",
        "decided_partitions",
        "decided_audited",
        "decided_nonempty",
        "first_seen",
        "horizon",
        "beyond",
        "decided_at",
    )
    txns = parts.groupBy(*IDS).agg(
        F.first("txn_id", ignorenulls=True).alias("txn_id"),
        F.first("decision", ignorenulls=True).alias("decision"),
        F.sum("rows").alias("rows"),
        F.sum("visible").alias("visible"),
        F.sum(F.when(F.col("visible") > 0, 1).otherwise(0)).alias("visible_partitions"),
        F.sum(F.when(F.col("wrong"), 1).otherwise(0)).alias("wrong_partitions"),
        F.max("marked_partitions").alias("marked_partitions"),
        F.first("decided_partitions", ignorenulls=True).alias("decided_partitions"),
        F.first("decided_audited", ignorenulls=True).alias("decided_audited"),
        F.first("decided_nonempty", ignorenulls=True).alias("decided_nonempty"),
        F.min("first_seen").alias("first_seen"),
        F.first("horizon", ignorenulls=True).alias("horizon"),
        F.max("beyond").alias("beyond"),
        F.first("decided_at", ignorenulls=True).alias("decided_at"),
        F.sort_array(F.collect_list(F.struct("topic", "partition", "visible", "expected"))).alias(
            "partitions"
        ),
    )

    txns = _with_snapshot(txns, snapshot)

    def flag(condition: Any) -> Any:
        return F.coalesce(condition, false)

    decided = F.col("decision").isNotNull()
    # no decision, but copied before the oldest decision kept: it may have expired
    expired = F.lit(known) & ~decided & flag(F.col("first_seen") < F.col("horizon"))
    # without its decision, a visible transaction is taken as committed (its markers say
    # what it holds) when the decision cannot be known
    committed = flag(F.col("decision") == "COMMIT") | (~decided & (F.lit(not known) | expired))
    aborted = flag(F.col("decision") == "ABORT")
    # wholly audited: every partition it wrote to lies in an audited topic
    whole = flag(
        F.when(decided, F.col("decided_audited") == F.col("decided_partitions")).otherwise(
            F.col("visible_partitions") >= F.col("marked_partitions")
        )
    )
    want_partitions = F.when(decided, F.col("decided_nonempty")).otherwise(
        F.col("marked_partitions")
    )
    unstable = _not_yet_stable(snapshot, decided)
    incomplete = (
        committed
        & ~unstable
        & (
            (F.col("wrong_partitions") > 0)
            | flag(whole & (F.col("visible_partitions") != want_partitions))
            # the copies' partition count against the decision's
            | flag(decided & (F.col("marked_partitions") != F.col("decided_partitions")))
        )
    )
    kinds = {
        "incomplete": incomplete,
        "aborted-visible": aborted & (F.col("visible") > 0),
        "undecided-visible": F.lit(known)
        & ~decided
        & ~expired
        & ~unstable
        & (F.col("visible") > 0),
        "partly-audited": committed & ~whole,
        "decision-expired": expired & (F.col("visible") > 0),
        "not-yet-stable": unstable & ((F.col("visible") > 0) | decided),
    }
    names = {kind: kind.replace("-", "_") for kind in kinds}
    flags = txns.select(
        *IDS,
        "txn_id",
        "decision",
        "rows",
        "visible",
        "partitions",
        committed.alias("committed"),
        aborted.alias("aborted"),
        *(condition.alias(names[kind]) for kind, condition in kinds.items()),
    ).cache()
    counted = ["committed", "aborted", *names.values()]
    row = flags.agg(
        F.sum("rows").alias("records"), *(F.sum(F.col(c).cast("int")).alias(c) for c in counted)
    ).first()
    kind = F.explode(
        F.filter(
            F.array(*(F.when(F.col(names[k]), F.lit(k)) for k in kinds)),
            lambda k: k.isNotNull(),
        )
    )
    w = Window.partitionBy("kind").orderBy(*IDS)
    flagged = any(row[c] for c in names.values())
    examples = (
        flags.select(kind.alias("kind"), *IDS, "txn_id", "decision", "visible", "partitions")
        .withColumn("n", F.row_number().over(w))
        .where(F.col("n") <= _EXAMPLES)
        .orderBy("kind", *IDS)
        .collect()
        if flagged
        else []  # no Spark job for nothing to show
    )
    flags.unpersist()
    if known:
        decisions.unpersist()
    counts = {c: int(row[c] or 0) for c in counted}
    return TxnSummary(
        records=int(row["records"] or 0),
        **counts,
        decisions_topic=source if known else None,
        examples=[
            {
                "kind": r["kind"],
                "transactionalId": r["txn_id"],
                "producerId": r["producer_id"],
                "ordinal": r["txn_ordinal"],
                "decision": r["decision"],
                "visible": r["visible"],
                "partitions": [p.asDict() for p in r["partitions"][:_EXAMPLES]],
            }
            for r in examples
        ],
    )
