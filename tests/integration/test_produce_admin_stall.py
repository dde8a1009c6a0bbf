"""Produce while Pulsar's admin API stops answering (a stalled broker's REST, its calls
held until httpx gives up) for a topic whose partition count must be asked of it: the
answer is a code clients retry, given by the request's deadline, never
UNKNOWN_SERVER_ERROR or a 500. (A stalled offset lookup after the batch is stored:
tests/integration/test_kafka_produce_offsets_stalled.py.)

The admin URL goes through :class:`tests.tcp_proxy.StallingProxy`; the Pulsar client
(publishing, deduplication) is not stalled."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from kop_dedup.protocol.records import rec
from tests.helpers import batch, new_pid, uniq
from tests.kafka_wire import WireClient, produce_request
from tests.sidecar import ThreadSidecar
from tests.tcp_proxy import StallingProxy

pytestmark = pytest.mark.integration

RETRIABLE = {6, 7, 19, 56}
_DEADLINE_MS = 3000
_ANSWERED_WITHIN_S = 8.0
"""Well under the admin client's own timeout (10 s): the answer follows the request's
deadline, not how long a stalled admin call takes to fail."""


@pytest.fixture(scope="module")
def stalling(pulsar) -> Iterator[tuple[ThreadSidecar, StallingProxy]]:
    upstream = pulsar.admin_url.removeprefix("http://").rstrip("/")
    with StallingProxy(upstream) as proxy:
        broker = SimpleNamespace(service_url=pulsar.service_url, admin_url=proxy.url)
        with ThreadSidecar(broker, system_namespace=uniq("sys")) as sc:
            try:
                yield sc, proxy
            finally:
                proxy.flow()


def _produce(c: WireClient, topic: str, pid: int, seq: int, values: list[bytes]) -> tuple:
    request = produce_request(
        topic, 0, [rec(v) for v in values], producer_id=pid, epoch=0, base_sequence=seq
    )
    request.timeout_ms = _DEADLINE_MS
    started = time.monotonic()
    answer = c.call(request, 9).responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset, time.monotonic() - started


def test_a_produce_whose_partitions_cannot_be_read_is_retriable(stalling):
    sc, proxy = stalling
    topic = uniq()  # never seen: its partition count must be asked of the admin API
    with httpx.Client(base_url=sc.url, timeout=60) as api:
        pid = new_pid(api)
        proxy.stall()
        try:
            with WireClient(sc.kafka_bootstrap) as c:
                code, _, took = _produce(c, topic, pid, 0, [b"x"])
            assert code in RETRIABLE, code
            assert took < _ANSWERED_WITHIN_S
            started = time.monotonic()
            r = api.post(
                "/v1/produce",
                json={"batches": [batch(topic, pid, 0, 1)], "timeoutMs": _DEADLINE_MS},
            )
            took = time.monotonic() - started
        finally:
            proxy.flow()
    assert r.status_code == 200, r.text  # not a 500: the batch's answer says what to do
    assert r.json()["results"][0]["errorCode"] in RETRIABLE, r.text
    assert took < _ANSWERED_WITHIN_S
