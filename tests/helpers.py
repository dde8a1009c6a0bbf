"""Helpers shared by integration tests: JSON batches, reading topics back, waiting for
observable state (never a bare sleep)."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pulsar as pulsar_client

from kop_dedup.cluster.placement import place
from kop_dedup.coordination.partitions import partition_of
from kop_dedup.protocol.records import SEQ_MODULUS

T = TypeVar("T")


def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


def one_batch(**over: Any) -> dict[str, Any]:
    """A JSON batch of one record (value ``v``) of producer 17 at sequence 0 on ``t``-0;
    fields in ``over`` replace the defaults."""
    return {
        "topic": "t",
        "partition": 0,
        "producerId": 17,
        "producerEpoch": 0,
        "baseSequence": 0,
        "lastSequence": 0,
        "records": [{"value": b64(b"v")}],
        **over,
    }


def batch(
    topic: str,
    pid: int,
    base: int,
    n: int = 1,
    *,
    epoch: int = 0,
    partition: int = 0,
    tag: str = "",
) -> dict[str, Any]:
    """A JSON batch of ``n`` records whose values name their sequence."""
    return {
        "topic": topic,
        "partition": partition,
        "producerId": pid,
        "producerEpoch": epoch,
        "baseSequence": base,
        "lastSequence": (base + n - 1) % SEQ_MODULUS,
        "records": [
            {
                "key": b64(f"k{(base + i) % SEQ_MODULUS}"),
                "value": b64(f"{tag}{pid}:{epoch}:{(base + i) % SEQ_MODULUS}"),
            }
            for i in range(n)
        ],
    }


def read_all(
    client: pulsar_client.Client,
    topic: str,
    *,
    expect: int | None = None,
    timeout: float = 10.0,
) -> list[pulsar_client.Message]:
    """Every message on a partition topic, from the earliest, in order."""
    reader = client.create_reader(topic, pulsar_client.MessageId.earliest)
    out: list[pulsar_client.Message] = []
    try:
        while reader.has_message_available():
            out.append(reader.read_next(int(timeout * 1000)))
    finally:
        reader.close()
    if expect is not None:
        assert len(out) == expect, f"expected {expect} messages on {topic}, read {len(out)}"
    return out


def new_pid(api: httpx.Client) -> int:
    r = api.post("/v1/init-producer-id", json={})
    r.raise_for_status()
    body = r.json()
    assert body["errorCode"] == 0, body
    return int(body["producerId"])


RETRIABLE_INIT = frozenset({6, 7, 15, 16, 51, 56})
"""Answers to init-producer-id a client retries (docs/http/produce.md: broker trouble 6/7/56, a
coordinator moving 15/16, the last transaction still being applied 51)."""


def init_txn(api: httpx.Client, tid: str, timeout: float = 30.0, **extra: Any) -> tuple[int, int]:
    """(producer id, epoch) for ``tid``, retrying what a client retries; any other
    answer fails the test with the body (never a -1 carried into the next request)."""
    deadline = time.monotonic() + timeout
    while True:
        r = api.post("/v1/init-producer-id", json={"transactionalId": tid, **extra})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        if body["errorCode"] in RETRIABLE_INIT and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        assert body["errorCode"] == 0, body
        return int(body["producerId"]), int(body["producerEpoch"])


def uniq(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def same_partition_ids(count: int) -> tuple[str, str]:
    """Two fresh transactional ids of one transaction-log partition (of ``count``)."""
    first = uniq("tx")
    p = partition_of(first, count)
    while True:
        second = uniq("tx")
        if partition_of(second, count) == p:
            return first, second


def newcomer_owning(present: int, log: str, count: int, partition: int) -> int:
    """A node id that, joining a cluster of node ``present`` alone, becomes the owner of
    ``partition`` of ``log`` (``count`` partitions): a takeover a test can make happen."""
    candidate = present + 1
    while place(log, count, [present, candidate])[partition] != candidate:
        candidate += 1
    return candidate


def newcomer_owning_none(present: int, things: list[tuple[str, int, int]]) -> int:
    """A node id that, joining a cluster of node ``present`` alone, owns none of
    ``things`` ((log, partitions, partition) each): what it is sent is forwarded."""
    candidate = present + 1
    while any(place(log, n, [present, candidate])[p] == candidate for log, n, p in things):
        candidate += 1
    return candidate


def topic_led_by(sc: Any, partitions: int = 1) -> str:
    """A fresh topic name whose partitions ``sc`` (a :class:`tests.sidecar.ThreadSidecar`)
    leads in its cluster as it stands (so that what the test counts there is counted
    there, whichever node the client reached)."""
    cluster = sc.runtime.cluster
    while True:
        name = uniq()
        if all(cluster.is_me(cluster.leader(name, p, partitions)) for p in range(partitions)):
            return name


def log_writers(sc: Any, p: int) -> list[str]:
    """The producers the broker lists on partition ``p`` of the transaction log, asked
    through sidecar ``sc`` (a :class:`tests.sidecar.ThreadSidecar`)."""
    parts = sc.runtime.transactions.state.parts
    found: dict[int, list[str]] = sc.call(sc.runtime.admin.partition_writers(parts.topic))
    return found.get(p, [])


def wait_until(what: str, check: Callable[[], T], timeout: float = 20.0) -> T:
    """Poll ``check`` until it answers something true, and return that; AssertionError
    naming ``what`` (and the last answer) past ``timeout``. An HTTP error counts as a
    false answer (a sidecar restarting)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
        except httpx.HTTPError as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(0.01)


def gauges(api: httpx.Client) -> dict[str, float]:
    """The sidecar's unlabelled ``kop_dedup_*`` samples from GET /metrics."""
    out = {}
    for line in api.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("kop_dedup_") and "{" not in name and value:
            out[name] = float(value)
    return out


def waiting_batches(api: httpx.Client) -> int:
    """Batches inside the sidecar waiting for their turn (a gap, earlier ones in flight)."""
    return int(gauges(api)["kop_dedup_waiting_batches"])


def delete_namespace(admin_url: str, namespace: str) -> None:
    """Delete ``tenant/namespace`` and its topics, partitioned ones included (a namespace
    is refused while any remain, and a forced namespace delete is off by default)."""
    with httpx.Client(base_url=admin_url, timeout=60) as admin:
        for topic in admin.get(f"/admin/v2/persistent/{namespace}/partitioned").json():
            path = topic.removeprefix("persistent://")
            admin.delete(f"/admin/v2/persistent/{path}/partitions", params={"force": "true"})
        for topic in admin.get(f"/admin/v2/namespaces/{namespace}/topics").json():
            path = topic.removeprefix("persistent://")
            admin.delete(f"/admin/v2/persistent/{path}", params={"force": "true"})
        r = admin.delete(f"/admin/v2/namespaces/{namespace}")
        if r.status_code >= 400:
            print(f"could not delete the namespace {namespace}: {r.status_code} {r.text}")


def raw_producer(client: pulsar_client.Client, topic: str, name: str) -> Any:
    """A Pulsar producer of ``topic``'s partition 0 in ``public/kafka`` that goes around
    the sidecar (to write what an audit must find)."""
    return client.create_producer(
        f"persistent://public/kafka/{topic}-partition-0",
        producer_name=name,
        batching_enabled=False,
    )
