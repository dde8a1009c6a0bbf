"""A Kafka fetch's read cut short (cancelled: a listener's shutdown cancels the fetches
still running) while its worker thread is inside the client's calls: the Pulsar reader
must be closed once that thread returned, never under it (a close while another thread
is inside ``read_next`` or ``has_message_available`` on the same reader races in the C++
client), as the state tables and the group pulls do (``tables.Discards``).

``EntryReader._take`` (``pulsar/fetching.py``) did not wait: cancelled, it marked the
reader closed and ``_pull``'s ``finally`` closed it at once, the thread still reading
(``closed with calls inside: [1]``). Nothing of Pulsar is replaced: the real reader
reads from the real broker.
"""

from __future__ import annotations

import asyncio

import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar import fetching
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.reader_pool import PoolLimits, ReaderPool
from tests.integration.kafka_consume import create, produce
from tests.slow_reads import SlowRead

pytestmark = pytest.mark.integration


def test_a_fetch_read_cancelled_mid_read_closes_its_reader_once_the_read_returned(
    pulsar, sidecar_kafka, monkeypatch
):
    topic = create(sidecar_kafka, 1)
    ptopic = f"persistent://public/kafka/{topic}-partition-0"
    produce(sidecar_kafka, topic, [(0, b"k", b"v%d" % i) for i in range(10)])
    slow = SlowRead(monkeypatch, fetching, "read_available", ptopic, hold_after_read=True)

    async def main() -> None:
        client = pulsar_async.Client(pulsar.service_url)
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        pool = ReaderPool(client, admin, PoolLimits(max_readers=4, idle_s=60))
        try:
            reader = await pool.take(ptopic, 0)
            pulling = asyncio.ensure_future(reader.read(1 << 20))
            await slow.inside()
            pulling.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pulling
            await slow.close_within(2)  # a close that does not wait comes now
            slow.release()
            pool.discard(reader)
        finally:
            slow.release()
            await pool.close()
            await admin.close()
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 90))
    assert slow.closes, "the reader was never closed"
    assert slow.closes == [0] * len(slow.closes), f"closed with calls inside: {slow.closes}"
