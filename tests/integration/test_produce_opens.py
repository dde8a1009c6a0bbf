"""Opening Pulsar producer names: each name opens once, side by side with the others.

A wide produce (20 idempotent producers over 512 partitions: 10,240 names) opens a name
for each producer's first batch on each partition. Names open concurrently (each its own
creation task; ``KOP_DEDUP_MAX_OPEN_PRODUCERS`` bounds them with the open ones), so a
request naming many new names is answered in about the time of a few opens, not one
open per name; and each batch is answered at the offset the broker gave it, the first
answers of a fresh partition with one entry-index lookup between them (they asked one
each: 1,280 lookups for 20 names on 64 partitions, 12-14 s, about 90 names a second:
the "opening" that bounded a wide produce's warm-up).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import pytest

from kop_dedup.protocol.records import KafkaBatch, KafkaRecord
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.produced import ProducedOffsets
from kop_dedup.pulsar.producers import Publisher
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


def test_the_first_answers_of_a_fresh_partition_take_one_offset_lookup(pulsar):
    """20 names' first batches on each of 16 fresh partitions, answered together as
    the Kafka listener answers them (the receipt, then the base offset)."""
    partitions, names = 16, 20
    topic = uniq("firsts")
    httpx.put(
        f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/partitions",
        json=partitions,
        timeout=30,
    ).raise_for_status()

    async def main() -> tuple[ProducedOffsets, list[int]]:
        publisher = Publisher(pulsar.service_url, send_timeout_ms=30_000)
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        offsets = ProducedOffsets(admin)
        full = f"persistent://public/kafka/{topic}"
        try:
            producers = await asyncio.gather(
                *(
                    publisher.create(f"{full}-partition-{p}", f"firsts-{n}", capacity=10)
                    for p in range(partitions)
                    for n in range(names)
                )
            )

            async def one(i: int, producer: Any) -> int:
                record = KafkaRecord(key=None, value=b"x")
                first = KafkaBatch(topic, i // names, -1, -1, -1, -1, (record,))
                receipt = await producer.send_batch(first, 0)
                return await offsets.base_offset(producer.topic, receipt.message_id, 1)

            got = await asyncio.gather(*(one(i, p) for i, p in enumerate(producers)))
            return offsets, list(got)
        finally:
            await publisher.close()
            await admin.close()

    offsets, got = asyncio.run(main())
    for p in range(partitions):  # every partition's 20 entries at offsets 0..19
        assert sorted(got[p * names : (p + 1) * names]) == list(range(names))
    assert offsets.looked_up == partitions, (offsets.looked_up, offsets.derived)
