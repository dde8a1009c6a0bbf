"""End to end: produce through the sidecar with retries and reordering, audit with Spark."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pulsar as pulsar_client
import pytest

from kop_dedup.protocol.records import SEQ_MODULUS, KafkaRecord
from kop_dedup.pulsar.wire import encode_key, encode_properties
from kop_dedup_tools.topics import create_topic
from tests.helpers import (
    batch,
    new_pid,
    raw_producer,
    uniq,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    # PySpark 3.5's DataFrame.collect() never closes the socket it reads the rows from
    # (pyspark/rdd.py _create_local_socket keeps only the socket's file): each collect
    # leaves one to the garbage collector, which warns. Only that leak is let through.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]


def send_with_retries(url: str, batches: list[dict[str, Any]]) -> dict[int, int]:
    """Send like a Kafka client with retries: windows of up to 5 batches in flight,
    each window shuffled over separate connections, every batch sent 1-3 times,
    and some acknowledged batches retried again later. Counts answers by code."""
    answers: dict[int, int] = {}
    problems: list[str] = []
    lock = threading.Lock()

    def send(b: dict[str, Any]) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            result = c.post("/v1/produce", json={"batches": [b]}).json()["results"][0]
        code = result["errorCode"]
        with lock:
            answers[code] = answers.get(code, 0) + 1
            if code not in (0, 46):
                problems.append(f"{b['baseSequence']}: {result['errorMessage']}")

    # a worker per request: every copy is in flight at once, none queues behind another
    with ThreadPoolExecutor(15) as pool:
        for start in range(0, len(batches), 5):
            window = batches[start : start + 5]
            plan = [b for b in window for _ in range(random.choice([1, 2, 3]))]
            random.shuffle(plan)
            list(pool.map(send, plan))
        list(pool.map(send, random.sample(batches, 2)))  # late retries of stored batches
    assert not problems, problems
    return answers


def test_audit_proves_exactly_once_through_the_sidecar(spark, pulsar, sidecar, api):
    from kop_dedup.spark.audit import audit

    random.seed(7)
    topics = [uniq("audit"), uniq("audit")]
    for t in topics:
        create_topic(pulsar.admin_url, t, partitions=2)
    pids = [new_pid(api) for _ in range(3)]
    expected = 0
    for pid in pids:
        for topic in topics:
            for partition in (0, 1):
                batches = [batch(topic, pid, i * 5, 5, partition=partition) for i in range(6)]
                expected += 30
                answers = send_with_retries(sidecar.url, batches)
                assert set(answers) <= {0, 46}, answers
                assert answers.get(0) == 6
    report = audit(
        spark,
        topics,
        service_url=pulsar.service_url,
        admin_url=pulsar.admin_url,
        progress=False,
    )
    print(report.render())
    assert report.records == expected
    assert report.distinct == expected
    assert report.duplicates == 0
    assert report.missing == 0
    assert report.per_topic == dict.fromkeys(topics, expected // 2)
    assert report.producers == len(pids) * len(topics) * 2
    assert report.ok


def send_raw(producer: Any, pid: int, seq: int, value: bytes) -> None:
    record = KafkaRecord(key=b"k", value=value)
    key, enc = encode_key(record.key)
    props = encode_properties(
        record, producer_id=pid, epoch=0, sequence=seq, partition=0, key_encoding=enc
    )
    producer.send(value, properties=props, partition_key=key, sequence_id=seq + 1)


def test_audit_finds_a_duplicate_written_around_dedup_and_exits_nonzero(spark, pulsar, api):
    from kop_dedup.spark.audit import audit

    topic = uniq("dup")
    create_topic(pulsar.admin_url, topic, partitions=1)
    pid = new_pid(api)
    r = api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 4)]}).json()
    assert r["results"][0]["errorCode"] == 0
    client = pulsar_client.Client(pulsar.service_url)
    try:
        # a different producer name: broker dedup cannot know it is the same record
        rogue = raw_producer(client, topic, f"rogue-{pid}")
        send_raw(rogue, pid, 2, b"copy of sequence 2")
        rogue.close()
    finally:
        client.close()
    report = audit(
        spark, [topic], service_url=pulsar.service_url, admin_url=pulsar.admin_url, progress=False
    )
    assert report.records == 5
    assert report.duplicates == 1
    assert report.missing == 0
    assert not report.ok
    [example] = report.duplicate_examples
    assert (example["producer_id"], example["sequence"], example["copies"]) == (pid, 2, 2)

    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "kop_dedup",
            "audit",
            topic,
            "--json",
            "--quiet",
            "--master",
            "local[1]",
            "--service-url",
            pulsar.service_url,
            "--admin-url",
            pulsar.admin_url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert cli.returncode == 1, cli.stderr[-2000:]
    assert json.loads(cli.stdout)["duplicates"] == 1


def test_audit_finds_a_gap_and_decodes_records(spark, pulsar):
    from kop_dedup.spark.audit import check, kafka_records, read_topics

    topic = uniq("gap")
    create_topic(pulsar.admin_url, topic, partitions=1)
    client = pulsar_client.Client(pulsar.service_url)
    try:
        p = raw_producer(client, topic, "kop-424242-0")
        for seq in (0, 1, 2, 5, 6):  # 3 and 4 never arrive
            send_raw(p, 424242, seq, f"v{seq}".encode())
        p.close()
    finally:
        client.close()
    records = kafka_records(
        read_topics(spark, [topic], service_url=pulsar.service_url, admin_url=pulsar.admin_url)
    )
    report = check(records)
    assert report.missing == 2
    assert report.duplicates == 0
    assert report.gap_examples[0]["missing_from"] == 3
    assert report.gap_examples[0]["missing_to"] == 4
    rows = records.orderBy("sequence").collect()
    assert [bytes(r["value"]) for r in rows] == [b"v0", b"v1", b"v2", b"v5", b"v6"]
    assert all(bytes(r["key"]) == b"k" for r in rows)


def test_audit_reads_null_keys_headers_and_wrapped_sequences(spark, pulsar, api):
    from kop_dedup.spark.audit import check, kafka_records, read_topics

    topic = uniq("wrap")
    pid = new_pid(api)
    top = SEQ_MODULUS - 1
    first = batch(topic, pid, top - 1, 2)
    first["records"][1]["key"] = None
    first["records"][0]["headers"] = [{"key": "h", "value": "AAE="}]
    for b in (first, batch(topic, pid, 0, 2)):
        assert api.post("/v1/produce", json={"batches": [b]}).json()["results"][0]["errorCode"] == 0
    records = kafka_records(
        read_topics(spark, [topic], service_url=pulsar.service_url, admin_url=pulsar.admin_url)
    )
    report = check(records)
    assert (report.records, report.duplicates, report.missing) == (4, 0, 0)
    rows = {r["sequence"]: r for r in records.collect()}
    assert rows[top]["key"] is None
    assert bytes(rows[top - 1]["key"]) == str.encode(f"k{top - 1}")
    assert json.loads(rows[top - 1]["headers_json"]) == [["h", "AAE="]]


def test_streaming_audit_sees_a_duplicate_appended_between_triggers(spark, pulsar, api, tmp_path):
    from kop_dedup.spark.stream import run_stream

    topic = uniq("stream")
    create_topic(pulsar.admin_url, topic, partitions=1)
    pid = new_pid(api)
    assert (
        api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 3)]}).json()["results"][0][
            "errorCode"
        ]
        == 0
    )

    def after_first(batch_id: int, report: Any) -> None:
        if report.duplicates == 0:  # first batch: append a duplicate around dedup
            client = pulsar_client.Client(pulsar.service_url)
            try:
                rogue = raw_producer(client, topic, f"rogue-stream-{pid}")
                send_raw(rogue, pid, 1, b"again")
                rogue.close()
            finally:
                client.close()

    reports = run_stream(
        spark,
        [topic],
        service_url=pulsar.service_url,
        admin_url=pulsar.admin_url,
        checkpoint=str(tmp_path / "ckpt"),
        trigger_seconds=1,
        max_batches=2,
        timeout=180,
        on_report=after_first,
    )
    assert len(reports) == 2
    assert (reports[0].records, reports[0].duplicates) == (3, 0)
    assert (reports[1].records, reports[1].duplicates) == (4, 1)
