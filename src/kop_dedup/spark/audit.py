"""The audit: read topics through the Pulsar Spark connector, prove exactly-once.

>>> spark = spark_session()
>>> report = audit(spark, ["orders"], service_url="pulsar://127.0.0.1:6650",
...                admin_url="http://127.0.0.1:8080")
>>> report.ok, report.records, report.duplicates, report.missing, report.txn_incomplete

Each Pulsar message becomes a Kafka record again (see kop_dedup.pulsar.wire) with its
idempotence key (topic, partition, producer id, epoch, sequence). A key read
more than once is a duplicate; a sequence missing between the lowest and the
highest read for one (topic, partition, producer id, epoch) is a gap. Batches
without a producer id (-1) are counted but carry no sequence to check.
Sequences that wrap from 2147483647 to 0 within one producer epoch are
unwrapped before gaps are counted.

Records of transactions (they carry ``kafka.txn.id``) count in the duplicate check
but not in the gap check: an aborted transaction's sequences are never copied, so
its producer's sequences have holes by design. They are checked by transaction
instead, against the coordinator's decisions (:mod:`kop_dedup.spark.transactions`).

With ``groups``, each consumer group's offsets on the audited topics are read from a
sidecar first, and the records between them counted in the data read: consumed,
inflight, ready, lag (:mod:`kop_dedup.spark.groups`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup.pulsar.wire import (
    PROP_EPOCH,
    PROP_HEADERS,
    PROP_KEY_ENCODING,
    PROP_PARTITION,
    PROP_PRODUCER_ID,
    PROP_SEQUENCE,
    PROP_TIMESTAMP,
    PROP_VALUE_NULL,
)
from kop_dedup.spark.groups import check_groups, read_group, render_groups
from kop_dedup.spark.progress import Progress
from kop_dedup.spark.stable import StableSnapshot, mark_unstable, stable_snapshot
from kop_dedup.spark.transactions import (
    SYSTEM_NAMESPACE,
    TXN_COLUMNS,
    TxnSummary,
    check_transactions,
    decisions_topic,
    read_decisions,
    txn_columns,
)

__all__ = [
    "TXN_COLUMNS",
    "AuditReport",
    "audit",
    "check",
    "check_with_decisions",
    "kafka_records",
    "read_topics",
]

KEY = ["topic", "partition", "producer_id", "epoch", "sequence"]
GROUP = ["topic", "partition", "producer_id", "epoch"]
_WRAP = SEQ_MODULUS
_QUARTER = 1 << 29
_EXAMPLES = 10


@dataclass(frozen=True)
class AuditReport:
    records: int
    distinct: int
    duplicates: int
    """Extra copies: records read minus distinct idempotence keys (idempotent records only)."""
    missing: int
    """Sequences absent inside the range read, summed over producer epochs and partitions."""
    non_idempotent: int
    per_topic: dict[str, int]
    producers: int
    duplicate_examples: list[dict[str, Any]] = field(default_factory=list)
    gap_examples: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    txn_records: int = 0
    """Records of committed transactions (or claiming to be): in the duplicate check,
    not in the gap check."""
    txn_committed: int = 0
    txn_aborted: int = 0
    txn_incomplete: int = 0
    """Committed transactions not wholly present in the audited partitions."""
    txn_aborted_visible: int = 0
    """Aborted transactions with records visible."""
    txn_undecided_visible: int = 0
    """Transactions with records visible but no decision."""
    txn_partly_audited: int = 0
    """Committed transactions that also wrote to topics this audit did not read."""
    txn_decision_expired: int = 0
    """Transactions visible without a decision, copied before the oldest decision kept
    (retention may have dropped theirs): checked by their markers alone."""
    decisions_topic: str | None = None
    """The decisions topic read; None when it does not exist (decisions not checked)."""
    txn_not_yet_stable: int = 0
    """Transactions at or after their partition's last stable offset, or not complete
    when the audit began (being copied): not checked for completeness or a decision."""
    not_yet_stable_records: int = 0
    """Records at or after their partition's last stable offset when the audit began
    (:mod:`kop_dedup.spark.stable`; 0 when no note was taken)."""
    txn_examples: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    """Each consumer group reported: group, mode, generation, source, not_audited."""
    group_partitions: list[dict[str, Any]] = field(default_factory=list)
    """Per group partition (and broadcast member): its offsets and the records read
    in each range (consumed, inflight, ready, lag, later)."""
    group_mismatches: int = 0
    """Ranges whose records read differ from the offsets' difference."""
    group_examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.duplicates == 0
            and self.missing == 0
            and self.txn_incomplete == 0
            and self.txn_aborted_visible == 0
            and self.txn_undecided_visible == 0
            and self.group_mismatches == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def render(self) -> str:
        rate = self.records / self.seconds if self.seconds else 0.0
        lines = [
            f"audit: {'OK' if self.ok else 'FAILED'}",
            (
                f"  records read        {self.records}  "
                f"({rate:,.0f} records/s over {self.seconds:.1f}s)"
            ),
            f"  distinct (topic, partition, producer, epoch, sequence)  {self.distinct}",
            f"  duplicates          {self.duplicates}",
            f"  missing sequences   {self.missing}",
            f"  non-idempotent      {self.non_idempotent}",
            f"  producer epochs     {self.producers}",
        ]
        lines += [f"  topic {t}: {n} records" for t, n in sorted(self.per_topic.items())]
        txns = f"{self.txn_committed} committed, {self.txn_aborted} aborted"
        lines += [
            f"  transactions        {txns} ({self.txn_records} transactional records)",
            f"  decisions           {self.decisions_topic or 'none (no decisions topic)'}",
            f"  txn incomplete      {self.txn_incomplete}",
            f"  txn aborted visible {self.txn_aborted_visible}",
            f"  txn undecided visible  {self.txn_undecided_visible}",
            f"  txn partly audited  {self.txn_partly_audited}",
            f"  txn decision expired  {self.txn_decision_expired}",
            (
                f"  not yet stable      {self.txn_not_yet_stable} transactions, "
                f"{self.not_yet_stable_records} records (at or after the LSO: being copied)"
            ),
        ]
        for ex in self.duplicate_examples:
            lines.append(f"  DUPLICATE {json.dumps(ex, default=str)}")
        for ex in self.gap_examples:
            lines.append(f"  GAP {json.dumps(ex, default=str)}")
        for ex in self.txn_examples:
            kind = str(ex.get("kind", "")).upper()
            rest = {k: v for k, v in ex.items() if k != "kind"}
            lines.append(f"  {kind} {json.dumps(rest, default=str)}")
        if self.groups:
            lines += render_groups(
                self.groups, self.group_partitions, self.group_mismatches, self.group_examples
            )
        return "\n".join(lines)


def full_topic(topic: str, tenant: str, namespace: str) -> str:
    return topic if "://" in topic else f"persistent://{tenant}/{namespace}/{topic}"


def read_topics(
    spark: Any,
    topics: list[str],
    *,
    service_url: str,
    admin_url: str,
    tenant: str = "public",
    namespace: str = "kafka",
    stream: bool = False,
) -> Any:
    """The connector's DataFrame over every partition of ``topics``, earliest to latest."""
    reader = spark.readStream if stream else spark.read
    reader = (
        reader.format("pulsar")
        .option("service.url", service_url)
        .option("admin.url", admin_url)
        .option("topics", ",".join(full_topic(t, tenant, namespace) for t in topics))
        .option("startingOffsets", "earliest")
    )
    if not stream:
        reader = reader.option("endingOffsets", "latest")
    return reader.load()


def kafka_records(raw: Any) -> Any:
    """Connector rows -> Kafka records with their idempotence metadata."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    props = F.col("__messageProperties")
    enc = props[PROP_KEY_ENCODING]
    topic_re = r"^.*/(.+)-partition-(\d+)$"
    return raw.select(
        F.regexp_extract("__topic", topic_re, 1).alias("topic"),
        F.coalesce(
            props[PROP_PARTITION].cast("int"),
            F.regexp_extract("__topic", topic_re, 2).cast("int"),
        ).alias("partition"),
        F.coalesce(props[PROP_PRODUCER_ID].cast("long"), F.lit(-1)).alias("producer_id"),
        F.coalesce(props[PROP_EPOCH].cast("int"), F.lit(-1)).alias("epoch"),
        props[PROP_SEQUENCE].cast("long").alias("sequence"),
        F.when(enc == "null", F.lit(None).cast("binary"))
        .when(enc == "empty", F.lit(b"").cast("binary"))
        .when(enc == "base64", F.unbase64(F.col("__key").cast("string")))
        .otherwise(F.col("__key"))
        .alias("key"),
        F.when(props[PROP_VALUE_NULL] == "true", F.lit(None).cast("binary"))
        .otherwise(F.col("value"))
        .alias("value"),
        props[PROP_HEADERS].alias("headers_json"),
        F.coalesce(
            props[PROP_TIMESTAMP].cast("long"),
            (F.col("__eventTime").cast("double") * 1000).cast("long"),
        ).alias("timestamp"),
        F.hex("__messageId").alias("message_id"),
        F.col("__publishTime").alias("publish_time"),
        *txn_columns(props),
    )


def check_with_decisions(
    spark: Any,
    records: Any,
    *,
    topics: set[str],
    service_url: str,
    admin_url: str,
    tenant: str,
    system_namespace: str,
    seconds: float = 0.0,
    snapshot: StableSnapshot | None = None,
) -> AuditReport:
    """:func:`check` against the coordinator's decisions read now: call it after the
    records were read (a decision is appended after its copy, so the decisions read
    then cover every copy already read)."""
    decisions = read_decisions(
        spark,
        service_url=service_url,
        admin_url=admin_url,
        tenant=tenant,
        system_namespace=system_namespace,
    )
    return check(
        records,
        decisions=decisions,
        topics=topics,
        decisions_source=decisions_topic(tenant, system_namespace),
        seconds=seconds,
        snapshot=snapshot,
    )


def check(
    records: Any,
    *,
    decisions: Any = None,
    topics: set[str] | None = None,
    decisions_source: str | None = None,
    seconds: float = 0.0,
    snapshot: StableSnapshot | None = None,
) -> AuditReport:
    """Count duplicates and gaps in a DataFrame shaped like :func:`kafka_records`, and
    check its transactions against ``decisions`` (a DataFrame from
    :func:`kop_dedup.spark.transactions.read_decisions` of ``decisions_source``; None:
    no decisions topic) for the Kafka ``topics`` audited (default: those read)."""
    from pyspark.sql import Window  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    kinds = ["string", "long", "int", "long", "int", "timestamp"]
    for name, kind in zip([*TXN_COLUMNS, "publish_time"], kinds, strict=True):
        if name not in records.columns:  # a stream key table written before transactions
            records = records.withColumn(name, F.lit(None).cast(kind))
    records = records.cache()
    beyond = F.col("unstable").cast("int") if "unstable" in records.columns else F.lit(0)
    rows = records.groupBy("topic").agg(F.count("*").alias("n"), F.sum(beyond).alias("u"))
    counted = rows.collect()
    per_topic = {r["topic"]: r["n"] for r in counted}
    total = sum(per_topic.values())
    idem = records.where((F.col("producer_id") >= 0) & F.col("sequence").isNotNull())
    keyed = (
        idem.groupBy(*KEY)
        .agg(
            F.count("*").alias("copies"),
            F.collect_list("message_id").alias("message_ids"),
            F.max(F.col("txn_ordinal").isNotNull().cast("int")).alias("transactional"),
        )
        .cache()
    )
    sizes = keyed.agg(
        F.count("*").alias("distinct"),
        F.sum("copies").alias("total"),
        F.countDistinct(*GROUP).alias("producers"),
    ).first()
    distinct, idem_total, producers = sizes["distinct"], sizes["total"] or 0, sizes["producers"]
    dup_rows = keyed.where("copies > 1").orderBy(*KEY).limit(_EXAMPLES).collect()

    # unwrap: a group that holds sequences near both ends of the int32 range wrapped
    bounds = keyed.groupBy(*GROUP).agg(F.min("sequence").alias("lo"), F.max("sequence").alias("hi"))
    wrapped = (F.col("lo") < _QUARTER) & (F.col("hi") >= _WRAP - _QUARTER)
    seqs = (
        # an aborted transaction's sequences are never copied: gaps there are by design
        keyed.where(F.col("transactional") == 0)
        .select(*KEY)
        .join(bounds, GROUP)
        .select(
            *GROUP,
            "sequence",
            F.when(wrapped & (F.col("sequence") < _QUARTER), F.col("sequence") + _WRAP)
            .otherwise(F.col("sequence"))
            .alias("ext"),
        )
    )
    w = Window.partitionBy(*GROUP).orderBy("ext")
    gaps = (
        seqs.withColumn("prev", F.lag("ext").over(w))
        .where(F.col("ext") - F.col("prev") > 1)
        .select(
            *GROUP,
            ((F.col("prev") + 1) % _WRAP).alias("missing_from"),
            ((F.col("ext") - 1) % _WRAP).alias("missing_to"),
            (F.col("ext") - F.col("prev") - 1).alias("missing"),
        )
        .cache()
    )
    missing = gaps.agg(F.sum("missing")).first()[0] or 0
    gap_rows = gaps.orderBy(*GROUP, "missing_from").limit(_EXAMPLES).collect()
    txn = check_transactions(
        records,
        decisions,
        set(per_topic) if topics is None else topics,
        source=decisions_source,
        snapshot=snapshot,
    )
    report = AuditReport(
        records=total,
        distinct=distinct,
        duplicates=int(idem_total - distinct),
        missing=int(missing),
        non_idempotent=total - int(idem_total),
        per_topic=per_topic,
        producers=producers,
        duplicate_examples=[
            {**{k: r[k] for k in KEY}, "copies": r["copies"], "messageIds": r["message_ids"]}
            for r in dup_rows
        ],
        gap_examples=[r.asDict() for r in gap_rows],
        seconds=seconds,
        not_yet_stable_records=sum(int(r["u"] or 0) for r in counted),
        **_txn_fields(txn),
    )
    keyed.unpersist()
    gaps.unpersist()
    records.unpersist()
    return report


def _txn_fields(txn: TxnSummary) -> dict[str, Any]:
    return {
        "txn_records": txn.records,
        "txn_committed": txn.committed,
        "txn_aborted": txn.aborted,
        "txn_incomplete": txn.incomplete,
        "txn_aborted_visible": txn.aborted_visible,
        "txn_undecided_visible": txn.undecided_visible,
        "txn_partly_audited": txn.partly_audited,
        "txn_decision_expired": txn.decision_expired,
        "txn_not_yet_stable": txn.not_yet_stable,
        "decisions_topic": txn.decisions_topic,
        "txn_examples": txn.examples,
    }


def kafka_topic(topic: str) -> str:
    """The Kafka topic name of a topic given to the audit (a full Pulsar name's last part)."""
    return topic.rsplit("/", 1)[-1]


def audit(
    spark: Any,
    topics: list[str],
    *,
    service_url: str,
    admin_url: str,
    tenant: str = "public",
    namespace: str = "kafka",
    system_namespace: str = SYSTEM_NAMESPACE,
    parquet_path: str | None = None,
    progress: bool = True,
    groups: Sequence[str] = (),
    group_url: str | None = None,
    group_token: str | None = None,
) -> AuditReport:
    """Read ``topics`` (all partitions, earliest to latest) and check them, their
    transactions against the decisions in ``system_namespace``; with ``groups``, report
    each group's offsets on them, read from the sidecar at ``group_url`` before the data
    (:class:`~kop_dedup.spark.groups.GroupReportError` when that fails)."""
    started = time.monotonic()
    kafka_topics = [kafka_topic(t) for t in topics]
    snapshots = [
        read_group(
            group_url or "http://127.0.0.1:8090",
            group,
            kafka_topics,
            admin_url=admin_url,
            tenant=tenant,
            namespace=namespace,
            token=group_token,
        )
        for group in groups
    ]
    # before the data: what is stable then is whole in what is read next
    stable = stable_snapshot(
        kafka_topics,
        service_url=service_url,
        admin_url=admin_url,
        tenant=tenant,
        namespace=namespace,
        system_namespace=system_namespace,
    )
    with Progress(spark, progress):
        raw = read_topics(
            spark,
            topics,
            service_url=service_url,
            admin_url=admin_url,
            tenant=tenant,
            namespace=namespace,
        )
        records = mark_unstable(kafka_records(raw), stable)
        if parquet_path:
            records.write.mode("overwrite").parquet(parquet_path)
            records = spark.read.parquet(parquet_path)
        # the data first: a decision is appended after its copy, so the decisions read
        # next cover every copy already read
        records = records.cache()
        records.count()
        group_rows, group_mismatches = check_groups(records, snapshots)
        report = check_with_decisions(
            spark,
            records,
            topics=set(kafka_topics),
            service_url=service_url,
            admin_url=admin_url,
            tenant=tenant,
            system_namespace=system_namespace,
            snapshot=stable,
        )
        records.unpersist()
    return AuditReport(
        **{
            **asdict(report),
            "seconds": time.monotonic() - started,
            "groups": [
                {
                    "group": s.group,
                    "mode": s.mode,
                    "generation": s.generation,
                    "source": s.source,
                    "not_audited": s.not_audited,
                }
                for s in snapshots
            ],
            "group_partitions": group_rows,
            "group_mismatches": len(group_mismatches),
            "group_examples": group_mismatches[:10],
        }
    )
