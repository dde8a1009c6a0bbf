"""Kafka 4.1's own operator tools as judges of the admin APIs: kafka-topics (create with
configs, describe, alter partitions), kafka-configs (describe, alter, and a refusal),
kafka-consumer-groups --list, kafka-transactions list/describe, kafka-delete-records
then kafka-get-offsets --time -2, run from the Kafka jars against the sidecar's
listener; what they did is checked through Pulsar's admin API too (the topics'
retention and compaction policies, the partition count)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.kafka_cli import (
    CONFIGS,
    DELETE_RECORDS,
    GET_OFFSETS,
    GROUPS,
    TOPICS,
    TRANSACTIONS,
    run_tools,
)
from tests.kafka_conformance import Target

pytestmark = [pytest.mark.integration]


def _pulsar(pulsar: Any, path: str) -> Any:
    resp = httpx.get(f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{path}", timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json() if resp.content else None


def test_kafkas_operator_tools_against_the_listener(pulsar, sidecar_kafka, tmp_path):
    b = sidecar_kafka
    target = Target("sidecar", b)
    topic, compacted = target.unique("tools"), target.unique("tools-c")
    # a topic with records to delete, a consumer group, an open transaction
    records = target.create_topic(partitions=1)
    target.produce(records, [(0, None, f"v{i}".encode()) for i in range(10)])
    group = target.unique("tools-g")
    consumer = Consumer(target.config(**{"group.id": group, "enable.auto.commit": False}))
    consumer.commit(offsets=[TopicPartition(records, 0, 3)], asynchronous=False)
    consumer.close()
    tid = target.unique("tools-tx")
    producer = target.producer(transactional_id=tid)
    producer.init_transactions(30)
    producer.begin_transaction()
    target.produce(records, [(0, None, b"in-a-transaction")], producer=producer)
    offsets = tmp_path / "delete.json"
    offsets.write_text(
        json.dumps({"version": 1, "partitions": [{"topic": records, "partition": 0, "offset": 4}]})
    )
    s = ("--bootstrap-server", b)
    topic_configs = ("--entity-type", "topics", "--entity-name", topic)
    done = run_tools(
        [
            (
                TOPICS,
                [
                    *s,
                    "--create",
                    "--topic",
                    topic,
                    "--partitions",
                    "1",
                    "--config",
                    "retention.ms=3600000",
                    "--config",
                    "cleanup.policy=delete",
                ],
            ),
            (TOPICS, [*s, "--create", "--topic", compacted, "--config", "cleanup.policy=compact"]),
            (TOPICS, [*s, "--describe", "--topic", topic]),
            (TOPICS, [*s, "--alter", "--topic", topic, "--partitions", "3"]),
            (TOPICS, [*s, "--describe", "--topic", topic]),
            (CONFIGS, [*s, "--describe", *topic_configs]),
            (CONFIGS, [*s, "--alter", *topic_configs, "--add-config", "retention.ms=7200000"]),
            (CONFIGS, [*s, "--describe", *topic_configs]),
            (CONFIGS, [*s, "--alter", *topic_configs, "--add-config", "segment.bytes=2097152"]),
            (GROUPS, [*s, "--list"]),
            (TRANSACTIONS, [*s, "list"]),
            (TRANSACTIONS, [*s, "describe", "--transactional-id", tid]),
            (DELETE_RECORDS, [*s, "--offset-json-file", str(offsets)]),
            (GET_OFFSETS, [*s, "--topic", records, "--time", "-2"]),
        ],
        tmp_path,
    )
    producer.abort_transaction(30)
    (create, create_c, before, grow, after, described, altered, again, refused, groups,
     txns, txn, deleted, earliest) = done  # fmt: skip
    for result in (create, create_c, before, grow, after, described, altered, again, groups, txns,
                   txn, deleted, earliest):  # fmt: skip
        assert result.exit == 0, (result.argv, result.text)
    assert f"Created topic {topic}." in create.text
    assert "PartitionCount: 1" in before.text
    assert "retention.ms=3600000" in before.text
    assert "PartitionCount: 3" in after.text
    assert "retention.ms=3600000 sensitive=false" in described.text
    assert "retention.ms=7200000 sensitive=false" in again.text
    assert refused.exit != 0
    assert "segment.bytes cannot be changed" in refused.error_text
    assert group in groups.lines
    assert any(tid in line and "Ongoing" in line for line in txns.lines), txns.text
    assert any(tid in line and "Ongoing" in line for line in txn.lines), txn.text
    assert f"partition: {records}-0\tlow_watermark: 4" in deleted.text
    assert earliest.lines == (f"{records}:0:4",)
    # what Pulsar was told
    assert _pulsar(pulsar, f"{topic}/retention") == {
        "retentionTimeInMinutes": 120,
        "retentionSizeInMB": -1,
    }
    assert _pulsar(pulsar, f"{topic}/partitions")["partitions"] == 3
    assert _pulsar(pulsar, f"{compacted}/retention") == {
        "retentionTimeInMinutes": -1,
        "retentionSizeInMB": -1,
    }
    assert _pulsar(pulsar, f"{compacted}/compactionThreshold") > 0
