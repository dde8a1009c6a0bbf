"""The broker is a real Pulsar with deduplication on, and its state survives a restart."""

from __future__ import annotations

import random

import httpx
import pulsar as pulsar_client
import pytest

pytestmark = pytest.mark.integration


def test_admin_api_lists_the_standalone_cluster(pulsar):
    clusters = httpx.get(f"{pulsar.admin_url}/admin/v2/clusters", timeout=10).json()
    assert "standalone" in clusters


def test_resent_sequence_is_duplicate_before_and_after_broker_restart(pulsar_control, unique_topic):
    topic = f"persistent://public/default/{unique_topic}"
    name = f"kop-{random.randrange(1 << 40)}-0"
    logger = pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Warn)

    client = pulsar_client.Client(pulsar_control.service_url, logger=logger)
    producer = client.create_producer(topic, producer_name=name, batching_enabled=False)
    for seq in (1, 2, 3):
        msg_id = producer.send(f"m{seq}".encode(), sequence_id=seq)
        assert msg_id.ledger_id() >= 0
    dup = producer.send(b"m2-again", sequence_id=2)
    assert (dup.ledger_id(), dup.entry_id()) == (-1, -1)
    producer.close()
    client.close()

    pulsar_control.restart()

    client = pulsar_client.Client(pulsar_control.service_url, logger=logger)
    try:
        producer = client.create_producer(topic, producer_name=name, batching_enabled=False)
        assert producer.last_sequence_id() == 3
        dup = producer.send(b"m3-again", sequence_id=3)
        assert (dup.ledger_id(), dup.entry_id()) == (-1, -1)
        producer.close()
        reader = client.create_reader(topic, pulsar_client.MessageId.earliest)
        seen = []
        while reader.has_message_available():
            seen.append(reader.read_next(10_000).data())
        reader.close()
        assert seen == [b"m1", b"m2", b"m3"]
    finally:
        client.close()
