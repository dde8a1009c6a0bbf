"""The broker is a real Pulsar with deduplication on, and its state survives a restart."""

from __future__ import annotations

import random
import time

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


def test_a_topic_deleted_beside_another_never_holds_the_others_last_message_id(pulsar_control):
    """GetLastMessageId (a reader's ``has_message_available``, behind every read_committed
    end and ListOffsets) is answered at once for a topic whose neighbour in the namespace
    was deleted just before it loaded. With Pulsar's transactions on (the launcher's
    setting before), the neighbour's deletion left the topic's transaction-buffer
    recovery hung and the request unanswered in about 1 of 8 tries (found by
    ``kop-dedup edges`` and a red CI run)."""
    base = pulsar_control.admin_url
    client = pulsar_client.Client(
        pulsar_control.service_url,
        operation_timeout_seconds=10,
        logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error),
    )
    slow: list[tuple[int, float]] = []
    try:
        with httpx.Client(base_url=base, timeout=30) as admin:
            for attempt in range(30):
                ns = f"public/neighbours-{random.randrange(1 << 40):x}"
                assert admin.put(f"/admin/v2/namespaces/{ns}").status_code < 300
                for name in ("kept", "gone"):
                    r = admin.put(f"/admin/v2/persistent/{ns}/{name}/partitions", json=1)
                    assert r.status_code < 300, r.text
                producer = client.create_producer(f"persistent://{ns}/gone-partition-0")
                producer.send(b"g")
                producer.close()
                r = admin.delete(
                    f"/admin/v2/persistent/{ns}/gone/partitions", params={"force": "true"}
                )
                assert r.status_code < 300, r.text
                started = time.monotonic()
                producer = client.create_producer(f"persistent://{ns}/kept-partition-0")
                producer.send(b"k")
                producer.close()
                reader = client.create_reader(
                    f"persistent://{ns}/kept-partition-0", pulsar_client.MessageId.earliest
                )
                try:
                    assert reader.has_message_available()
                except pulsar_client.Timeout:
                    pass
                finally:
                    reader.close()
                took = time.monotonic() - started
                if took > 5:
                    slow.append((attempt, round(took, 1)))
    finally:
        client.close()
    assert slow == [], f"(try, seconds) whose last message id took over 5 s: {slow}"
