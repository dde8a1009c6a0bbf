"""The Spark audit over a topic written by both transports: records produced by an
unmodified Kafka client through the listener and over HTTP are each found once, nothing
lost, at the offsets each producer was told, and a Kafka consumer's committed offset
splits the data where the offsets say."""

from __future__ import annotations

import base64
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
