"""The registries in the system namespace against the real broker: compacted topics,
start-up reads, bounds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.coordination.expiry import Bounds
from kop_dedup.coordination.registry import Registry, RegistryBounds
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.tables import KeyedWriter
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from kop_dedup_tools.registry_startup import delete_namespace, measure

pytestmark = pytest.mark.integration


@pytest.fixture
def system_namespace(pulsar: Any) -> Iterator[str]:
    """A fresh system namespace, as a new cluster would have; deleted afterwards."""
    ns = f"public/kop-dedup-reg-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        assert admin.put(f"/admin/v2/namespaces/{ns}").status_code == 204
    yield ns
    asyncio.run(delete_namespace(pulsar.admin_url, ns))


def test_a_start_that_reads_far_more_records_than_keys_compacts_so_the_next_reads_one_per_key(
    pulsar, system_namespace
):
    """Item 6: start-up time must not grow with history. Old code read every record ever
    written on every start (3,000 here for 100 producer ids)."""

    async def scenario() -> tuple[int, int, int, int]:
        client = pulsar_async.Client(
            pulsar.service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error)
        )
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        topic = f"persistent://{system_namespace}/producer-epochs"
        try:
            writer = KeyedWriter(client, topic)
            for start in range(0, 3000, 500):  # within the producer's pending queue
                await asyncio.gather(
                    *(
                        writer.send(str(i % 100), str(i // 100).encode())
                        for i in range(start, start + 500)
                    )
                )
            await writer.close()
            first = Registry(client, system_namespace, "kop", compact=admin.compact)
            await first.start()
            read_first, keys_first = first.epochs.records_read, len(first.epochs)
            highest = first.epochs.highest(7)
            await first.close()
            deadline = asyncio.get_running_loop().time() + 30
            while await admin.compaction_status(topic) != "SUCCESS":
                assert asyncio.get_running_loop().time() < deadline, "no compaction was asked for"
                await asyncio.sleep(0.1)
            second = Registry(client, system_namespace, "kop", compact=admin.compact)
            await second.start()
            assert second.epochs.highest(7) == highest == 29
            read_second = second.epochs.records_read
            await second.close()
            return read_first, keys_first, read_second, len(second.epochs)
        finally:
            await admin.close()
            await client.close()

    read_first, keys_first, read_second, keys_second = asyncio.run(scenario())
    assert (read_first, keys_first) == (3000, 100)
    assert (read_second, keys_second) == (100, 100)


def test_the_runtime_has_the_broker_compact_the_system_namespace(pulsar):
    ns = f"kop-dedup-rt-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        pulsar_service_url=pulsar.service_url,
        pulsar_admin_url=pulsar.admin_url,
        system_namespace=ns,
        registry_compaction_threshold_bytes=123_456,
    )

    async def scenario() -> None:
        runtime = Runtime(settings)
        try:
            await runtime.start()
            await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        finally:
            await runtime.close()

    try:
        asyncio.run(scenario())
        with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
            r = admin.get(f"/admin/v2/namespaces/public/{ns}/compactionThreshold")
        assert r.json() == 123_456
    finally:
        asyncio.run(delete_namespace(pulsar.admin_url, f"public/{ns}"))


class SettableClock:
    """Wall time until set to a given instant (epoch ms)."""

    def __init__(self) -> None:
        self.at_ms: int | None = None

    def __call__(self) -> float:
        return time.time() if self.at_ms is None else self.at_ms / 1000


async def _open(pulsar: Any) -> tuple[Any, PulsarAdmin]:
    client = pulsar_async.Client(
        pulsar.service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error)
    )
    return client, PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))


async def _compacted(admin: PulsarAdmin, topic: str) -> None:
    await admin.compact(topic)
    deadline = asyncio.get_running_loop().time() + 30
    while await admin.compaction_status(topic) != "SUCCESS":
        assert asyncio.get_running_loop().time() < deadline, "compaction did not finish"
        await asyncio.sleep(0.1)


def test_expired_epochs_are_tombstoned_so_a_fresh_start_neither_knows_nor_reads_them(
    pulsar, system_namespace
):
    """Item 6, memory and topic: an epoch raised more than the expiry ago is forgotten
    by the sidecar that sweeps, by every other one (the tombstone), and after compaction
    by the topic itself. Old code kept every epoch forever, in memory and on every start."""

    async def scenario() -> tuple[list[int | None], int, list[int | None], int]:
        client, admin = await _open(pulsar)
        topic = f"persistent://{system_namespace}/producer-epochs"
        bounds = RegistryBounds(epochs=Bounds(expiry_ms=86_400_000, max_entries=1000))
        try:
            clock = SettableClock()
            sweeper = Registry(client, system_namespace, "kop", bounds=bounds, clock=clock)
            await sweeper.epochs.load()
            for pid in (1, 2):
                await sweeper.epochs.raise_to(pid, 1)
            await sweeper.epochs.barrier()  # entries now carry the broker's publish times
            raised_2 = sweeper.epochs._map._entries.entry(2)[1]
            while time.time() * 1000 < raised_2 + 10:  # let the broker's clock move on
                await asyncio.sleep(0.002)
            await sweeper.epochs.raise_to(3, 1)
            await sweeper.epochs.barrier()
            raised_3 = sweeper.epochs._map._entries.entry(3)[1]
            assert raised_3 > raised_2 + 5
            clock.at_ms = raised_3 - 2 + 86_400_000  # a day after 1 and 2, not after 3
            other = Registry(client, system_namespace, "kop", bounds=bounds)
            await other.epochs.load()  # it knows 1, 2 and 3 (its clock has not moved)
            await sweeper.sweep()
            await sweeper.close()
            await other.epochs.barrier()
            seen_by_other = [other.epochs.highest(pid) for pid in (1, 2, 3)]
            await other.close()
            await _compacted(admin, topic)
            fresh = Registry(client, system_namespace, "kop", bounds=bounds)
            await fresh.epochs.load()
            after = [fresh.epochs.highest(pid) for pid in (1, 2, 3)]
            read = fresh.epochs.records_read
            await fresh.close()
            return seen_by_other, 0, after, read
        finally:
            await admin.close()
            await client.close()

    seen_by_other, _, after, read = asyncio.run(scenario())
    assert seen_by_other == [None, None, 1]
    assert after == [None, None, 1]
    assert read == 1  # compaction removed the expired producer ids and their tombstones


def test_an_epoch_written_out_of_order_is_written_again_so_compaction_keeps_the_highest(
    pulsar, system_namespace
):
    """Compaction keeps the latest record of a key; the registry means the highest
    epoch. Two sidecars raising one producer id at once can store 3 then 2: without
    the repair a start after compaction knew 2, and a zombie at epoch 2 could write."""

    async def scenario() -> tuple[int | None, int | None]:
        client, admin = await _open(pulsar)
        topic = f"persistent://{system_namespace}/producer-epochs"
        try:
            writer = KeyedWriter(client, topic)
            await writer.send("5", b"3")
            await writer.send("5", b"2")  # from a sidecar that had not seen 3
            await writer.close()
            reader = Registry(client, system_namespace, "kop")
            await reader.epochs.load()
            knows = reader.epochs.highest(5)
            repairing = reader.epochs._repairing
            assert repairing is not None
            await repairing
            await reader.close()
            await _compacted(admin, topic)
            fresh = Registry(client, system_namespace, "kop")
            await fresh.epochs.load()
            after = fresh.epochs.highest(5)
            await fresh.close()
            return knows, after
        finally:
            await admin.close()
            await client.close()

    assert asyncio.run(scenario()) == (3, 3)


def test_the_registry_startup_tool_measures_a_start_before_and_after_compaction(pulsar):
    namespace, _, _, runs = asyncio.run(
        measure(pulsar.service_url, pulsar.admin_url, records=3000, keys=100, runs=1)
    )
    assert [(r.phase, r.records_read, r.keys) for r in runs] == [
        ("before", 3000, 100),
        ("after", 100, 100),
    ]
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        assert admin.get(f"/admin/v2/namespaces/{namespace}").status_code == 404  # cleaned up
