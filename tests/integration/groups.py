"""Helpers for the consumer-group tests: a client's calls, and reading answers back."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import httpx
import pulsar as pulsar_client

from tests.helpers import batch, new_pid

NS = "persistent://public/kafka"


def poll(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``check()`` until it is truthy (its value); AssertionError naming ``what`` past
    ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except httpx.HTTPError as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
        time.sleep(0.05)


def produce(
    api: httpx.Client, topic: str, n: int, *, partition: int = 0, per_batch: int = 1
) -> int:
    """``n`` records from a new producer id in batches of ``per_batch`` (one entry
    each); values name their sequence (0..n-1)."""
    pid = new_pid(api)
    batches = [
        batch(topic, pid, s, min(per_batch, n - s), partition=partition)
        for s in range(0, n, per_batch)
    ]
    r = api.post("/v1/produce", json={"batches": batches})
    assert [b["errorCode"] for b in r.json()["results"]] == [0] * len(batches), r.text
    return pid


def produce_raw(client: pulsar_client.Client, ptopic: str, values: list[str]) -> None:
    """Messages written straight to a partition topic with the Pulsar client (for
    topics the sidecar will not produce to, e.g. with deduplication off)."""
    producer = client.create_producer(ptopic, batching_enabled=False)
    try:
        for v in values:
            producer.send(f"raw:{v}".encode())
    finally:
        producer.close()


def configure(api: httpx.Client, group: str, **body: Any) -> dict[str, Any]:
    r = api.put(f"/v1/groups/{group}", json={"autoOffsetReset": "earliest", **body})
    assert r.status_code == 200, r.text
    return r.json()


def join(
    api: httpx.Client, group: str, topics: list[str], member: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"topics": topics}
    if member:
        body["memberId"] = member
    r = api.post(f"/v1/groups/{group}/members", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def pull(
    api: httpx.Client, group: str, member: str, n: int, wait_ms: int = 2000, attempts: int = 1
) -> dict[str, Any]:
    """A pull that must answer 200; ``attempts``: a 503 (retriable) is asked again, as a
    client does, up to that many times in all."""
    for attempt in range(1, attempts + 1):
        r = api.post(
            f"/v1/groups/{group}/members/{member}/pull", json={"maxRecords": n, "waitMs": wait_ms}
        )
        if r.status_code != 503 or attempt == attempts:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    return r.json()


def commit(api: httpx.Client, group: str, member: str, **body: Any) -> httpx.Response:
    return api.post(f"/v1/groups/{group}/members/{member}/commit", json=body)


def reset(api: httpx.Client, group: str, **body: Any) -> dict[str, Any]:
    r = api.post(f"/v1/groups/{group}/reset", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def values(answer: dict[str, Any]) -> list[str]:
    """The sequence each record's value names (``pid:epoch:seq`` or ``raw:seq``)."""
    return [base64.b64decode(r["value"]).decode().rsplit(":", 1)[1] for r in answer["records"]]


def offsets(answer: dict[str, Any]) -> list[int]:
    return [r["offset"] for r in answer["records"]]


def lag_rows(api: httpx.Client, group: str) -> list[dict[str, Any]]:
    r = api.get(f"/v1/groups/{group}/lag")
    assert r.status_code == 200, r.text
    return list(r.json()["partitions"])


def lag(api: httpx.Client, group: str) -> dict[tuple[str, int], dict[str, Any]]:
    """Clustering rows (or broadcast group-minimum rows) by (topic, partition)."""
    return {
        (p["topic"], p["partition"]): p
        for p in lag_rows(api, group)
        if p.get("member") in (None, "")
    }


def member_lag(api: httpx.Client, group: str, member: str) -> dict[tuple[str, int], dict[str, Any]]:
    """A broadcast member's rows by (topic, partition)."""
    return {
        (p["topic"], p["partition"]): p for p in lag_rows(api, group) if p.get("member") == member
    }
