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
import threading
import time
from typing import Any

import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar import fetching
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.reader_pool import PoolLimits, ReaderPool
from tests.integration.kafka_consume import create, produce

pytestmark = pytest.mark.integration


def test_a_fetch_read_cancelled_mid_read_closes_its_reader_once_the_read_returned(
    pulsar, sidecar_kafka, monkeypatch
):
    topic = create(sidecar_kafka, 1)
    ptopic = f"persistent://public/kafka/{topic}-partition-0"
    produce(sidecar_kafka, topic, [(0, b"k", b"v%d" % i) for i in range(10)])
    taken, released = threading.Event(), threading.Event()
    lock = threading.Lock()
    inside = [0]
    closes: list[int] = []
    read = fetching.read_available

    def slow(*args: Any) -> Any:  # a read that takes its time inside the client's calls
        with lock:
            inside[0] += 1
        try:
            out = read(*args)
            if not taken.is_set():
                taken.set()
                released.wait(30)
            return out
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(fetching, "read_available", slow)
    close = pulsar_async.Reader.close

    async def closing(reader: Any) -> None:
        if ptopic in reader.topic():
            with lock:
                closes.append(inside[0])
        await close(reader)

    monkeypatch.setattr(pulsar_async.Reader, "close", closing)

    async def main() -> None:
        client = pulsar_async.Client(pulsar.service_url)
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        pool = ReaderPool(client, admin, PoolLimits(max_readers=4, idle_s=60))
        try:
            reader = await pool.take(ptopic, 0)
            pulling = asyncio.ensure_future(reader.read(1 << 20))
            assert await asyncio.to_thread(taken.wait, 30), "no read came"
            pulling.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pulling
            deadline = time.monotonic() + 2  # a close that does not wait comes now
            while not closes and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            released.set()
            pool.discard(reader)
        finally:
            released.set()
            await pool.close()
            await admin.close()
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 90))
    assert closes, "the reader was never closed"
    assert closes == [0] * len(closes), f"closed with calls inside: {closes}"
