"""Retention that keeps what Kafka keeps, on a real broker.

A sidecar starting on a namespace with no retention policy gives it Kafka's
``log.retention.*``; one whose policy an operator set shorter is reported with the
command that fixes it (or refused). Then the issue's repro, on a namespace with
Pulsar's own default retention (0 minutes, 0 MB): records produced over Kafka and never
consumed, the topic unloaded three times (each unload rolls its ledger, as a broker
restart or a bundle move does) with one record after each, then enough entries for the
broker's deduplication snapshot to move its cursor (the only durable cursor of a topic
Kafka consumers read, every ``brokerDeduplicationEntriesInterval``, 1000, entries):
the closed ledgers are then deleted unless a retention policy keeps them. A topic
created with ``retention.ms`` keeps every record; its sibling without one loses them,
as the issue saw (the control shows the roll-overs really delete)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec

from kop_dedup.coordination.topics import RetentionTooShort, TopicManager
from kop_dedup.protocol.retention import Retention, Verdict
from kop_dedup.settings import Settings
from tests.helpers import uniq
from tests.kafka_admin_wire import configs_of, create_topic, describe_configs
from tests.kafka_conformance import Target
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = [pytest.mark.integration]

_WEEK_MS = 7 * 24 * 3_600_000
_SNAPSHOT_ENTRIES = 1000  # brokerDeduplicationEntriesInterval, Pulsar's default


@pytest.fixture(scope="module")
def namespace(pulsar: Any) -> str:
    """A fresh namespace with no retention policy (deduplication on)."""
    ns = f"public/ret-{uuid.uuid4().hex[:8]}"
    assert httpx.put(f"{pulsar.admin_url}/admin/v2/namespaces/{ns}", json={}).status_code == 204
    return ns


@pytest.fixture(scope="module")
def retention_sidecar(pulsar: Any, namespace: str) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(
        pulsar, namespace=namespace.split("/")[1], system_namespace=uniq("sys")
    ) as sc:
        yield sc


def _retention(pulsar: Any, path: str) -> Any:
    resp = httpx.get(f"{pulsar.admin_url}/admin/v2/{path}/retention", timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json() if resp.content else None


def _set_namespace_retention(pulsar: Any, ns: str, minutes: int, mb: int) -> None:
    body = {"retentionTimeInMinutes": minutes, "retentionSizeInMB": mb}
    r = httpx.post(f"{pulsar.admin_url}/admin/v2/namespaces/{ns}/retention", json=body)
    assert r.status_code == 204, r.text


def test_a_start_gives_a_namespace_without_a_policy_kafkas_retention(
    pulsar, namespace, retention_sidecar
):
    assert _retention(pulsar, f"namespaces/{namespace}") == {
        "retentionTimeInMinutes": 10080,
        "retentionSizeInMB": -1,
    }


def test_a_shorter_namespace_policy_is_reported_or_refused(pulsar, namespace, retention_sidecar):
    runtime = retention_sidecar.runtime
    _set_namespace_retention(pulsar, namespace, 0, 0)  # Pulsar's own default, set explicitly
    try:
        assert retention_sidecar.call(runtime.topics.prepare_namespace(namespace)) is Verdict.SHORT
        strict = TopicManager(runtime.admin, Settings(kafka_retention_check="refuse"))
        with pytest.raises(RetentionTooShort, match="pulsar-admin namespaces set-retention"):
            retention_sidecar.call(strict.prepare_namespace(namespace))
        # never overwritten: the operator's policy stays
        assert _retention(pulsar, f"namespaces/{namespace}") == {
            "retentionTimeInMinutes": 0,
            "retentionSizeInMB": 0,
        }
    finally:
        _set_namespace_retention(pulsar, namespace, 10080, -1)


def _roll_over(pulsar: Any, target: Target, ns: str, topic: str) -> None:
    """The issue's repro: 100 records, then three unloads with one record after each,
    then the entries that make the broker snapshot its deduplication state."""
    target.produce(topic, [(0, None, f"first-{i}".encode()) for i in range(100)])
    for n in range(3):
        r = httpx.put(f"{pulsar.admin_url}/admin/v2/persistent/{ns}/{topic}/unload", timeout=30)
        assert r.status_code == 204, r.text
        target.produce(topic, [(0, None, f"after-unload-{n}".encode())])
    target.produce(
        topic,
        [(0, None, b"filler") for _ in range(_SNAPSHOT_ENTRIES + 50)],
        producer=_one_per_entry(target),
    )


def _one_per_entry(target: Target) -> Producer:
    """A producer that sends each record in a batch (a Pulsar entry) of its own."""
    return Producer(target.config(**{"batch.num.messages": 1, "linger.ms": 0}))


def _until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _earliest(target: Target, topic: str) -> int:
    admin = target.admin()
    futures = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()})
    return next(iter(futures.values())).result(timeout=30).offset


def test_never_consumed_records_survive_rollovers_under_pulsars_default_retention(
    pulsar, namespace, retention_sidecar
):
    target = Target("sidecar", retention_sidecar.kafka_bootstrap)
    kept, lost = target.unique("kept"), target.unique("lost")
    with WireClient(target.bootstrap) as c:
        assert create_topic(c, kept, 1, {"retention.ms": str(_WEEK_MS)}).error_code == 0
        assert create_topic(c, lost, 1).error_code == 0
    # the topic's own policy, as Pulsar applies it
    assert _retention(pulsar, f"persistent/{namespace}/{kept}") == Retention(10080, -1).to_pulsar()
    assert _retention(pulsar, f"persistent/{namespace}/{lost}") is None
    _set_namespace_retention(pulsar, namespace, 0, 0)  # Pulsar's default: 0 minutes, 0 MB
    try:
        with WireClient(target.bootstrap) as c:  # what applies, and where it comes from
            assert configs_of(describe_configs(c, kept, ["retention.ms"])) == {
                "retention.ms": (str(_WEEK_MS), 1)  # the topic's own
            }
            _until(
                lambda: (
                    configs_of(describe_configs(c, lost, ["retention.ms"]))
                    == {"retention.ms": ("0", 3)}
                ),  # the namespace's: DYNAMIC_DEFAULT_BROKER_CONFIG
                "DescribeConfigs to show the namespace's retention",
            )
        for topic in (kept, lost):
            _roll_over(pulsar, target, namespace, topic)
        # the control: every closed ledger goes, the current one (the last record after
        # an unload, and the entries after it) stays: the issue saw 102..103. The broker
        # also snapshots on a timer (brokerDeduplicationSnapshotIntervalSeconds), which
        # can trim part of it first and restart the entry count: more entries until then
        deadline = time.monotonic() + 60
        while (earliest := _earliest(target, lost)) != 102:
            assert earliest < 102, earliest
            assert time.monotonic() < deadline, f"the roll-overs deleted up to {earliest}"
            target.produce(lost, [(0, None, b"filler")] * 100, producer=_one_per_entry(target))
            time.sleep(0.2)
        assert _earliest(target, kept) == 0
        records = target.read(kept, 1, settle=False)[0]
        values = [r.value for r in records[:103]]
        assert values[:100] == [f"first-{i}".encode() for i in range(100)]
        assert values[100:] == [f"after-unload-{n}".encode() for n in range(3)]
        assert [r.offset for r in records] == list(range(len(records)))
    finally:
        _set_namespace_retention(pulsar, namespace, 10080, -1)
