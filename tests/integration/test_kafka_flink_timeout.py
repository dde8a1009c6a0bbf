"""Flink's KafkaSink asks ``transaction.timeout.ms`` of one hour: refused with 50 as
Kafka refuses it (``transaction.max.timeout.ms``, 15 minutes) until the maximum is raised,
and once it is, the journals keep their records at least twice the maximum whatever
``JOURNAL_RETENTION_MINUTES`` says."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaException

from tests.kafka_conformance import Target
from tests.sidecar import ThreadSidecar

pytestmark = [pytest.mark.integration]

_HOUR_MS = 3_600_000


def test_flinks_hour_long_transactions_need_the_maximum_raised(pulsar: Any, sidecar_kafka):
    default = Target("sidecar", sidecar_kafka)
    producer = default.producer(
        transactional_id=default.unique("flink"), transaction_timeout_ms=_HOUR_MS
    )
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(30)
    assert refused.value.args[0].code() == 50  # INVALID_TRANSACTION_TIMEOUT, as Kafka

    day = 24 * _HOUR_MS
    with ThreadSidecar(pulsar, max_transaction_timeout_ms=day, journal_retention_minutes=60) as sc:
        target = Target("sidecar", sc.kafka_bootstrap)
        topic = target.create_topic(partitions=1)
        producer = target.producer(
            transactional_id=target.unique("flink"), transaction_timeout_ms=_HOUR_MS
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        target.produce(topic, [(0, None, b"in-an-hour-long-transaction")], producer=producer)
        producer.commit_transaction(30)
        assert [r.value for r in target.read(topic, 1)[0]] == [b"in-an-hour-long-transaction"]
        system = f"{sc.settings.tenant}/{sc.settings.system_namespace}"
    journal = f"{system}/txn-journal.0.{topic}"  # the partition's journal
    kept = httpx.get(f"{pulsar.admin_url}/admin/v2/persistent/{journal}/retention", timeout=30)
    assert kept.json()["retentionTimeInMinutes"] == 2 * 24 * 60  # twice the maximum, not 60
