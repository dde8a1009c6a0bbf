"""The Spark audit over a topic written by both transports: records produced by an
unmodified Kafka client through the listener and over HTTP are each found once, nothing
lost, at the offsets each producer was told, and a Kafka consumer's committed offset
splits the data where the offsets say. Spark's own Kafka source, reading through the
listener, finds exactly the records the audit's Pulsar connector reads."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from tests.helpers import batch, new_pid
from tests.integration.kafka_consume import confluent_consumer, confluent_read, create, produce

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    # PySpark 3.5's DataFrame.collect() leaves its socket to the garbage collector (see
    # test_audit.py): only that leak is let through.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

KAFKA_BEFORE, HTTP_BATCHES, HTTP_BATCH, KAFKA_AFTER = 30, 4, 5, 20


def _kafka_records(tag: str, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(0, f"k-{tag}{i}".encode(), f"kafka-{tag}{i}".encode()) for i in range(n)]


def test_records_produced_over_kafka_and_http_are_audited_once_at_the_offsets_each_was_told(
    spark: Any, pulsar: Any, sidecar: Any, api: Any
) -> None:
    from kop_dedup.spark.audit import audit, kafka_records, read_topics
    from kop_dedup.spark.groups import message_id_decoder

    bootstrap = sidecar.kafka_bootstrap
    topic = create(bootstrap, 1, stem="audit-kh")
    before = produce(bootstrap, topic, _kafka_records("a", KAFKA_BEFORE))
    pid = new_pid(api)
    http_batches = [batch(topic, pid, b * HTTP_BATCH, HTTP_BATCH, tag="http-") for b in range(4)]
    answers = []
    for body in http_batches:
        answer = api.post("/v1/produce", json={"batches": [body]}).json()["results"][0]
        assert answer["errorCode"] == 0, answer
        answers.append(answer)
    after = produce(bootstrap, topic, _kafka_records("b", KAFKA_AFTER))
    http_count = HTTP_BATCHES * HTTP_BATCH
    total = KAFKA_BEFORE + http_count + KAFKA_AFTER

    # the Kafka producer was told offsets on both sides of the HTTP records
    assert [g.offset for g in before] == list(range(KAFKA_BEFORE))
    first_after = KAFKA_BEFORE + http_count
    assert [g.offset for g in after] == list(range(first_after, total))

    # a Kafka consumer (assign, no group membership) fetches everything once, in order:
    # the HTTP records at the offsets between, then commits at the first HTTP record
    group = f"audit-kh-{pid}"
    consumer = confluent_consumer(bootstrap, **{"group.id": group})
    try:
        got = confluent_read(consumer, [TopicPartition(topic, 0, OFFSET_BEGINNING)], total)
        consumer.commit(offsets=[TopicPartition(topic, 0, KAFKA_BEFORE)], asynchronous=False)
    finally:
        consumer.close()
    assert [g.offset for g in got] == list(range(total))
    http_values = [r["value"] for b in http_batches for r in b["records"]]
    fetched_http = got[KAFKA_BEFORE:first_after]
    assert [g.value for g in fetched_http] == [base64.b64decode(v) for v in http_values]
    offset_of_value = {g.value: g.offset for g in got}

    # the Spark audit: every record once, nothing missing, both producers; the group's
    # committed offset (from the Kafka consumer) splits the data where the offsets say
    report = audit(
        spark,
        [topic],
        service_url=pulsar.service_url,
        admin_url=pulsar.admin_url,
        progress=False,
        groups=[group],
        group_url=sidecar.url,
    )
    print(report.render())
    assert (report.records, report.distinct) == (total, total)
    assert (report.duplicates, report.missing, report.non_idempotent) == (0, 0, 0)
    assert report.per_topic == {topic: total}
    assert report.producers == 3  # each Kafka producer (one per produce call) and the HTTP one
    assert report.group_mismatches == 0
    [row] = [r for r in report.group_partitions if r["topic"] == topic]
    assert (row["committed"], row["end"], row["consumed"], row["lag"]) == (
        KAFKA_BEFORE,
        total,
        KAFKA_BEFORE,
        http_count + KAFKA_AFTER,
    )
    assert report.ok

    # each HTTP answer's messageId is the position (in the data Spark read) of the batch's
    # first record, which the Kafka consumer fetched at that batch's offset
    decode = message_id_decoder()
    rows = kafka_records(
        read_topics(spark, [topic], service_url=pulsar.service_url, admin_url=pulsar.admin_url)
    ).collect()
    by_position = {decode(r["message_id"]): bytes(r["value"]) for r in rows}
    for b, answer in enumerate(answers):
        ledger, entry, *_ = (int(part) for part in answer["messageId"].split(":"))
        value = by_position[(ledger, entry, 0)]
        assert value == base64.b64decode(http_batches[b]["records"][0]["value"])
        assert offset_of_value[value] == KAFKA_BEFORE + b * HTTP_BATCH


# -- Spark's own Kafka source through the listener -----------------------------------------

SPARK_PARTITIONS, SPARK_IDEMPOTENT, SPARK_TXN = 2, 15, 6  # records per partition

Record = tuple[int, int, bytes, bytes, int]  # partition, offset, key, value, timestamp (ms)


def _spark_kafka_read(spark: Any, bootstrap: str, topic: str) -> list[Record]:
    """Every record Spark's Kafka source (spark-sql-kafka-0-10: a batch read, earliest to
    latest, read_committed) reads through the listener at ``bootstrap``."""
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .selectExpr("topic", "partition", "offset", "key", "value", "unix_millis(timestamp) AS ms")
        .collect()
    )
    assert {r["topic"] for r in rows} == {topic}
    return sorted(
        (r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"]), r["ms"]) for r in rows
    )


def _pulsar_read(spark: Any, pulsar: Any, topic: str) -> tuple[list[Record], set[bytes]]:
    """The records of the topic as the audit reads them (the Pulsar connector, through
    :func:`read_topics` and :func:`kafka_records`), and the values of those that carry a
    committed transaction's markers. A record's offset is its place in its partition in
    Pulsar's order (ledger, entry, batch index): the broker's entry index, on a topic that
    has held nothing else."""
    from kop_dedup.spark.audit import kafka_records, read_topics
    from kop_dedup.spark.groups import message_id_decoder

    decode = message_id_decoder()
    rows = (
        kafka_records(
            read_topics(spark, [topic], service_url=pulsar.service_url, admin_url=pulsar.admin_url)
        )
        .select("partition", "key", "value", "timestamp", "message_id", "txn_ordinal")
        .collect()
    )
    by_partition: dict[int, list[tuple[Any, bytes, bytes, int]]] = {}
    for r in rows:
        by_partition.setdefault(r["partition"], []).append(
            (decode(r["message_id"]), bytes(r["key"]), bytes(r["value"]), r["timestamp"])
        )
    records = sorted(
        (p, offset, key, value, ms)
        for p, stored in by_partition.items()
        for offset, (_, key, value, ms) in enumerate(sorted(stored))
    )
    return records, {bytes(r["value"]) for r in rows if r["txn_ordinal"] is not None}


def test_sparks_kafka_source_reads_through_the_listener_what_the_pulsar_audit_reads(
    spark: Any, pulsar: Any, sidecar: Any
) -> None:
    """An idempotent producer, then an aborted and a committed transaction, through the
    listener; Spark's Kafka source (through the listener) and the audit's Pulsar connector
    read (of the Pulsar topic) find the same records at the same offsets: those the
    idempotent producer was told, then the committed transaction's, never the aborted
    one's. The audit itself (its duplicate and transaction checks) runs in the test above;
    here only its reader, to keep Spark's jobs few."""
    from tests.integration.kafka_txn import (
        high_watermarks,
        sent_records,
        transactional_producer,
        txn_id,
    )

    bootstrap = sidecar.kafka_bootstrap
    topic = create(bootstrap, SPARK_PARTITIONS, stem="audit-spark-kafka")
    sent = [
        (p, f"k{p}-{i}".encode(), f"idem-{p}-{i}".encode())
        for i in range(SPARK_IDEMPOTENT)
        for p in range(SPARK_PARTITIONS)
    ]
    told = produce(bootstrap, topic, sent)
    producer = transactional_producer(bootstrap, txn_id("spark-kafka"))
    producer.init_transactions(30)
    producer.begin_transaction()
    aborted = sent_records(producer, topic, SPARK_PARTITIONS, SPARK_TXN, "aborted-")
    producer.abort_transaction(30)
    producer.begin_transaction()
    committed = sent_records(producer, topic, SPARK_PARTITIONS, SPARK_TXN, "committed-")
    producer.commit_transaction(30)
    assert producer.errors == []
    per_partition = SPARK_IDEMPOTENT + SPARK_TXN
    ends = dict.fromkeys(range(SPARK_PARTITIONS), per_partition)
    deadline = time.monotonic() + 30  # the committed records are readable once copied
    while (marks := high_watermarks(bootstrap, topic, SPARK_PARTITIONS)) != ends:
        assert time.monotonic() < deadline, marks
        time.sleep(0.1)

    through_listener = _spark_kafka_read(spark, bootstrap, topic)
    in_pulsar, marked = _pulsar_read(spark, pulsar, topic)
    assert len(through_listener) == SPARK_PARTITIONS * per_partition
    assert through_listener == in_pulsar

    # the idempotent producer's records at the offsets it was told, then the committed
    # transaction's in the order sent (and marked as a transaction's in Pulsar); the
    # aborted one's nowhere
    told_records = sorted((g.partition, g.offset, g.key, g.value) for g in told)
    assert [(p, o) for p, o, *_ in told_records] == [
        (p, o) for p in range(SPARK_PARTITIONS) for o in range(SPARK_IDEMPOTENT)
    ]
    committed_records = sorted(
        (p, SPARK_IDEMPOTENT + i, key, value)
        for p in range(SPARK_PARTITIONS)
        for i, (key, value) in enumerate((k, v) for q, k, v in committed if q == p)
    )
    assert [r[:4] for r in through_listener] == sorted(told_records + committed_records)
    assert marked == {v for _, _, v in committed}
    assert not {v for _, _, v in aborted} & {r[3] for r in through_listener}
