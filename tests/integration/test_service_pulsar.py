"""The produce service against the real broker, below HTTP, where timing must be exact.

A deadline can pass while Pulsar creates a producer (a slow or paused broker).
Over HTTP that race depends on the broker's mood; here the deadline is made
shorter than any creation, so the race is lost every time.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from kop_dedup import errors
from kop_dedup.protocol.records import KafkaBatch, KafkaRecord
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from tests.helpers import read_all, uniq

pytestmark = pytest.mark.integration


def one_record(topic: str, pid: int, seq: int) -> KafkaBatch:
    record = KafkaRecord(key=None, value=f"{pid}:{seq}".encode())
    return KafkaBatch(topic, 0, pid, 0, seq, seq, (record,))


def test_a_producer_creation_that_outlives_its_batch_is_adopted_not_orphaned(
    pulsar, pulsar_reader_client
):
    """Cancelling a creation half-way left the name registered at the broker with nobody
    holding it: every retry was refused ProducerBusy (6) until the connection dropped."""
    topic = uniq("adopt")

    async def scenario() -> tuple[int, list[int]]:
        runtime = Runtime(
            Settings(pulsar_service_url=pulsar.service_url, pulsar_admin_url=pulsar.admin_url)
        )
        await runtime.start()
        await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        try:
            service = runtime.service
            pid = await runtime.registry.allocator.allocate()
            warm = await service.produce(one_record(topic, -1, 0), time.monotonic() + 30)
            assert warm.error_code == 0  # the topic exists and is loaded: only creation is slow
            ptopic = service.naming.partition_topic(topic, 0)
            channel = service.channels.lease((ptopic, pid, 0), topic)
            with pytest.raises(errors.RequestTimedOut):
                await service.channels.ensure_open(channel, time.monotonic() + 0.0001)
            service.channels.release(channel)
            codes = []
            for seq in range(3):
                result = await service.produce(one_record(topic, pid, seq), time.monotonic() + 30)
                codes.append(result.error_code)
            return pid, codes
        finally:
            await runtime.close()

    pid, codes = asyncio.run(scenario())
    assert codes == [0, 0, 0]
    stored = read_all(pulsar_reader_client, f"persistent://public/kafka/{topic}-partition-0")
    assert [m.data().decode() for m in stored] == ["-1:0", *(f"{pid}:{s}" for s in range(3))]
