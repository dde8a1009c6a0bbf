"""A producer name written by another holder while a channel was open: the channel's
sequence state is behind the broker's mark, and the answers must follow the broker.

The broker unloads the topic (as a broker restart or a pause past the keep-alive
would drop the connection); another writer takes the name before the sidecar's
Pulsar producer reconnects and stores sequences under it, as the partition's other
owner would; then the client goes on through the sidecar, whose producer has
reconnected by itself with the sequence state it had before.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from kop_dedup.protocol.records import to_pulsar
from kop_dedup.pulsar.wire import PROP_SEQUENCE
from tests.helpers import batch, new_pid, read_all, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"
WINDOW_MS = 4000


def produce(api: httpx.Client, *batches: dict[str, Any]) -> list[dict[str, Any]]:
    r = api.post("/v1/produce", json={"batches": list(batches)})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def codes(results: list[dict[str, Any]]) -> list[int]:
    return [r["errorCode"] for r in results]


def _take_name(admin_url: str, client: Any, ptopic: str, name: str) -> Any:
    """Unload the topic and hold ``name`` on it before the sidecar's producer
    reconnects; None when the sidecar got there first (the caller tries again)."""
    path = ptopic.removeprefix("persistent://")
    r = httpx.put(f"{admin_url}/admin/v2/persistent/{path}/unload", timeout=30)
    assert r.status_code == 204, r.text
    try:
        return client.create_producer(ptopic, producer_name=name, send_timeout_millis=5000)
    except Exception:  # ProducerBusy: the sidecar's producer reconnected first
        return None


def test_a_name_written_by_another_holder_is_answered_from_the_brokers_mark(
    pulsar, pulsar_reader_client
):
    """The sidecar stored 0..2; another holder of the name stored 3..4 and 5. A retry
    of 5 used to wait out the reorder window and get 45 (the channel still thought 2
    was the last stored), and so did the client's next batch, 6..7: both are answered
    from the broker's mark now, 46 and 0, without waiting for the window."""
    import pulsar as pulsar_client

    topic = uniq()
    ptopic = f"{NS}/{topic}-partition-0"
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys"), reorder_window_ms=WINDOW_MS) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pid = new_pid(api)
        assert codes(produce(api, batch(topic, pid, 0, 3))) == [0]
        client = pulsar_client.Client(pulsar.service_url)
        try:
            holder = wait_until(
                "another writer to take the name",
                lambda: _take_name(pulsar.admin_url, client, ptopic, f"kop-{pid}-0"),
                timeout=60,
            )
            for seq in (3, 4, 5):  # as the other owner would store 3, 4 and 5
                holder.send(b"", properties={PROP_SEQUENCE: str(seq)}, sequence_id=to_pulsar(seq))
            holder.close()
        finally:
            client.close()

        started = time.monotonic()
        retry = produce(api, batch(topic, pid, 5, 1))
        took_retry = time.monotonic() - started
        started = time.monotonic()
        following = produce(api, batch(topic, pid, 6, 2))
        took_next = time.monotonic() - started

        answers = (codes(retry), codes(following), round(took_retry, 1), round(took_next, 1))
        assert answers[:2] == ([46], [0]), (answers, retry, following)
        assert max(took_retry, took_next) < WINDOW_MS / 1000, answers
    stored = [m.properties()[PROP_SEQUENCE] for m in read_all(pulsar_reader_client, ptopic)]
    assert stored == [str(i) for i in range(8)]


def test_a_new_epoch_whose_start_another_holder_stored_goes_on_from_the_brokers_mark(
    pulsar, pulsar_reader_client
):
    """The channel of epoch 1 opened with no state (its batch 3 was refused: a new epoch
    must start at 0); another holder of the name then stored 0..2 of epoch 1. Batch 3
    again used to wait out the window and get 45 (no 0 in sight); it is stored now."""
    import pulsar as pulsar_client

    topic = uniq()
    ptopic = f"{NS}/{topic}-partition-0"
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys"), reorder_window_ms=WINDOW_MS) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pid = new_pid(api)
        assert codes(produce(api, batch(topic, pid, 0, 1))) == [0]
        assert codes(produce(api, batch(topic, pid, 3, 1, epoch=1))) == [45]
        client = pulsar_client.Client(pulsar.service_url)
        try:
            holder = wait_until(
                "another writer to take the name",
                lambda: _take_name(pulsar.admin_url, client, ptopic, f"kop-{pid}-1"),
                timeout=60,
            )
            for seq in (0, 1, 2):
                holder.send(b"", properties={PROP_SEQUENCE: str(seq)}, sequence_id=to_pulsar(seq))
            holder.close()
        finally:
            client.close()

        started = time.monotonic()
        answer = produce(api, batch(topic, pid, 3, 1, epoch=1))
        took = time.monotonic() - started
        assert (codes(answer), took < WINDOW_MS / 1000) == ([0], True), (answer, took)
    stored = [m.properties()[PROP_SEQUENCE] for m in read_all(pulsar_reader_client, ptopic)]
    assert stored == ["0", "0", "1", "2", "3"]
