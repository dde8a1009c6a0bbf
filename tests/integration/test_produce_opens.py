"""Opening Pulsar producer names: each name opens once, side by side with the others.

A wide produce (20 idempotent producers over 512 partitions: 10,240 names) opens a name
for each producer's first batch on each partition. Names open concurrently (each its own
creation task; ``KOP_DEDUP_MAX_OPEN_PRODUCERS`` bounds them with the open ones), so a
request naming many new names is answered in about the time of a few opens, not one
open per name; and each batch is answered at the offset the broker gave it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import pytest

from tests.helpers import batch, new_pid, uniq

pytestmark = pytest.mark.integration

NAMES = 96


def _timed(api: httpx.Client, *batches: dict[str, Any]) -> tuple[float, list[dict[str, Any]]]:
    started = time.monotonic()
    r = api.post("/v1/produce", json={"batches": list(batches)})
    elapsed = time.monotonic() - started
    assert r.status_code == 200, r.text
    return elapsed, r.json()["results"]


def test_many_new_names_open_side_by_side_not_one_after_another(api):
    topic = uniq("opens")
    _timed(api, batch(topic, new_pid(api), 0))  # the topic exists, its dedup policy is known
    one = []
    for _ in range(3):  # one new name: its open, its send, the answer
        elapsed, results = _timed(api, batch(topic, new_pid(api), 0))
        assert [r["errorCode"] for r in results] == [0]
        one.append(elapsed)
    pids = [new_pid(api) for _ in range(NAMES)]
    elapsed, results = _timed(api, *(batch(topic, pid, 0, 2) for pid in pids))
    assert [r["errorCode"] for r in results] == [0] * NAMES
    # one after another would take NAMES times one (measured: 96 names in 9x the time
    # of one, the sidecar's CPU per batch, not the opens); a third of that fails it
    assert elapsed < NAMES / 3 * statistics.median(one), (elapsed, one)
    # every name took its batch once: a retry of each is a duplicate
    _, again = _timed(api, *(batch(topic, pid, 0, 2) for pid in pids))
    assert [r["errorCode"] for r in again] == [46] * NAMES
