"""The bound on Pulsar producers held (KOP_DEDUP_MAX_OPEN_PRODUCERS), with librdkafka.

More idempotent producer names than the bound (3 producers x 6 partitions = 18 names,
bound 4): every record is stored once, in order, at the offset its producer was told,
and the broker never sees more than 4 of the sidecar's producers on the topic at once.
The sidecar used to open a producer for every name a batch held (it closed only idle
ones past the bound): 512 partitions x 20 producers meant 10,240 producers.
"""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers import read_all, uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

BOUND, PARTITIONS, PRODUCERS, RECORDS = 4, 6, 3, 240


def _publishers(admin: httpx.Client, topic: str) -> int:
    """The producers the broker has on the topic's partitions right now."""
    r = admin.get(f"/admin/v2/persistent/public/kafka/{topic}/partitioned-stats?perPartition=true")
    r.raise_for_status()
    return sum(len(p.get("publishers", [])) for p in r.json()["partitions"].values())


def test_more_idempotent_names_than_the_bound_store_once_and_never_hold_more(
    pulsar, pulsar_reader_client
):
    topic = f"kb-{uuid.uuid4().hex[:10]}"
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys"), max_open_producers=BOUND) as sc,
        httpx.Client(base_url=pulsar.admin_url, timeout=10) as admin,
    ):
        bootstrap = sc.kafka_bootstrap
        kadmin = AdminClient({"bootstrap.servers": bootstrap})
        for future in kadmin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
            future.result(timeout=30)
        seen: list[int] = []
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                seen.append(_publishers(admin, topic))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        delivered: list[tuple[int, int, bytes]] = []
        failures: list[object] = []

        def report(err, msg):
            if err is not None:
                failures.append(err)
            else:
                delivered.append((msg.partition(), msg.offset(), msg.value()))

        producers = [
            Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "batch.num.messages": 20,
                }
            )
            for _ in range(PRODUCERS)
        ]
        try:
            for i in range(RECORDS):
                for n, producer in enumerate(producers):
                    producer.produce(
                        topic, f"{n}-{i}".encode(), partition=i % PARTITIONS, on_delivery=report
                    )
                    producer.poll(0)
            for producer in producers:
                assert producer.flush(120) == 0
        finally:
            done.set()
            watcher.join(5)
        with httpx.Client(base_url=sc.url, timeout=10) as api:
            stats = api.get("/v1/stats").json()
    assert failures == []
    assert len(delivered) == RECORDS * PRODUCERS
    assert seen
    assert max(seen) <= BOUND, max(seen)
    assert 0 < stats["peakHeldProducers"] <= BOUND, stats
    assert stats["maxOpenProducers"] == BOUND
    for p in range(PARTITIONS):
        mine = sorted((off, val) for part, off, val in delivered if part == p)
        stored = [
            m.data()
            for m in read_all(
                pulsar_reader_client,
                f"persistent://public/kafka/{topic}-partition-{p}",
                expect=len(mine),
            )
        ]
        assert stored == [v for _, v in mine]
        assert [off for off, _ in mine] == list(range(len(mine)))
