"""Byte-rate client quotas enforced as Kafka does: past ``producer_byte_rate`` a
Produce answer carries ``throttle_time_ms`` and the connection reads no further request
until it has passed; ``consumer_byte_rate`` the same for Fetch; a role without a quota
(none of its own, none by default) is never throttled."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kafka.protocol.admin import AlterClientQuotasRequest as Alter
from kafka.protocol.metadata import ApiVersionsRequest

from kop_dedup.protocol.records import rec
from tests.helpers import uniq
from tests.integration.kafka_consume import fetch_request
from tests.kafka_wire import WireClient, produce_request
from tests.roles import logged_in, roles_sidecar
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

RATE = 1_000  # bytes a second: 12,000 bytes over Kafka's 10 s window is 20% over
_E = Alter.EntryData


@pytest.fixture(scope="module")
def sc(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadSidecar]:
    with roles_sidecar(pulsar, tmp_path_factory, "rate") as s:
        yield s


def _login(sc: ThreadSidecar, token: str) -> WireClient:
    return logged_in(sc.kafka_bootstrap, token)


def _set(c: WireClient, user: str, key: str, value: float) -> None:
    entry = _E(
        entity=[_E.EntityData(entity_type="user", entity_name=user)],
        ops=[_E.OpData(key=key, value=value, remove=False)],
    )
    answer = c.call(Alter(entries=[entry], validate_only=False), 1)
    assert answer.entries[0].error_code == 0, answer


def _produce(c: WireClient, topic: str) -> Any:
    request = produce_request(topic, 0, [rec(b"x" * 12_000)])
    answer = c.call(request, 7)
    assert answer.responses[0].partition_responses[0].error_code == 0, answer
    return answer


def _fetch(c: WireClient, topic: str) -> Any:
    return c.call(fetch_request(topic, {0: 0}, max_wait_ms=100), 12)


def _next_request_s(c: WireClient) -> float:
    started = time.monotonic()
    assert c.call(ApiVersionsRequest(), 0).error_code == 0
    return time.monotonic() - started


def test_a_role_past_its_byte_rates_is_throttled_and_another_role_is_not(sc):
    topic = uniq("rate")
    with _login(sc, "tok-root") as root:
        _set(root, "alice", "producer_byte_rate", RATE)
        _set(root, "alice", "consumer_byte_rate", RATE)
    with httpx.Client(base_url=sc.settings.pulsar_admin_url, timeout=30) as admin:
        for role in ("alice", "bob"):  # an operator's grants: both may produce and consume
            path = f"/admin/v2/namespaces/public/{sc.settings.namespace}/permissions/{role}"
            admin.post(path, json=["produce", "consume"]).raise_for_status()
        path = f"/admin/v2/persistent/public/{sc.settings.namespace}/{topic}/partitions"
        admin.put(path, json=1).raise_for_status()
    with _login(sc, "tok-alice") as alice, _login(sc, "tok-bob") as bob:
        throttled = _produce(alice, topic).throttle_time_ms
        assert 1_000 <= throttled <= 11_000, throttled
        assert _next_request_s(alice) >= throttled / 1000 * 0.9  # the connection was muted
        assert _produce(bob, topic).throttle_time_ms == 0  # bob has no quota
        fetched = _fetch(alice, topic)
        assert fetched.throttle_time_ms > 0, fetched
        assert _fetch(bob, topic).throttle_time_ms == 0
