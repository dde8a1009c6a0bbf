"""The registries in the system namespace against the real broker: compacted topics,
start-up reads, bounds."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.coordination.registry import Registry
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.tables import KeyedWriter
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def system_namespace(pulsar: Any) -> str:
    """A fresh system namespace, as a new cluster would have."""
    ns = f"public/kop-dedup-reg-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        assert admin.put(f"/admin/v2/namespaces/{ns}").status_code == 204
    return ns


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
        finally:
            await runtime.close()

    asyncio.run(scenario())
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        r = admin.get(f"/admin/v2/namespaces/public/{ns}/compactionThreshold")
    assert r.json() == 123_456
