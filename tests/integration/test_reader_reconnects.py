"""A reader whose connection to the broker drops, on a real broker: each record is read
once, at its offset.

The sidecar's readers are opened with ``start_message_id_inclusive`` (they start at a
record's own position). The C++ client keeps that flag when it subscribes again after a
reconnection: it restarts at the last message it handed out and hands it out a second
time. Counting that message twice shifted every later offset by one, so a Kafka consumer
took a record it had read for the next one and skipped a record further on (the
20-fault soak: one record stored twice and one lost in each copy pipeline). An unload of
the topic drops the reader's connection here as a broker restart does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.reader_pool import PoolLimits, ReaderPool
from kop_dedup.pulsar.reading import PartitionReader
from tests.integration.kafka_consume import create, produce
from tests.integration.kafka_txn import transactional_producer, txn_id

pytestmark = pytest.mark.integration


def _values(tag: str, first: int, n: int) -> list[tuple[int, bytes, bytes]]:
    return [(0, b"k", f"{tag}-{i:03d}".encode()) for i in range(first, first + n)]


async def _reconnected(pulsar: Any, ptopic: str, reader: Any) -> None:
    """Unload ``ptopic`` (its readers' connections drop) and wait until ``reader`` (the
    client's reader) is connected again and the broker has sent it what it asks for."""
    path = ptopic.removeprefix("persistent://")
    async with httpx.AsyncClient(timeout=30) as admin:
        r = await admin.put(f"{pulsar.admin_url}/admin/v2/persistent/{path}/unload")
        assert r.status_code == 204, r.text
    await asyncio.sleep(0.5)
    deadline = time.monotonic() + 20
    while not reader.is_connected():
        assert time.monotonic() < deadline, "the reader did not connect again"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # the broker's first delivery after the subscribe


def _run(pulsar: Any, scenario: Callable[[Any, PulsarAdmin], Awaitable[None]]) -> None:
    async def main() -> None:
        client = pulsar_async.Client(pulsar.service_url)
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        try:
            await asyncio.wait_for(scenario(client, admin), 90)
        finally:
            await admin.close()
            await client.close()

    asyncio.run(main())


def test_a_fetch_reader_holding_the_next_entrys_first_record_counts_it_once(pulsar, sidecar_kafka):
    """A caught-up Kafka fetch reader waits for the next record and keeps it when it comes
    (the first of a new entry); the connection drops before the next read takes it."""
    topic = create(sidecar_kafka, 1)
    ptopic = f"persistent://public/kafka/{topic}-partition-0"
    produce(sidecar_kafka, topic, _values("a", 0, 10), **{"batch.num.messages": 5})

    async def scenario(client: Any, admin: PulsarAdmin) -> None:
        pool = ReaderPool(client, admin, PoolLimits(max_readers=4, idle_s=60))
        try:
            reader = await pool.take(ptopic, 0)
            got = await reader.read(1 << 20)
            while reader.next_offset < 10:
                got += await reader.read(1 << 20)
            assert [r.value for e in got for r in e.records] == [v for *_, v in _values("a", 0, 10)]
            while (waiting := await reader.arrival()) is None:
                assert await reader.read(1 << 20) == []
            await asyncio.to_thread(
                produce, sidecar_kafka, topic, _values("b", 0, 5), **{"linger.ms": 50}
            )
            await asyncio.wait([waiting], timeout=20)
            assert waiting.done(), "the next record never arrived"
            await _reconnected(pulsar, ptopic, reader._reader._reader)
            got = await reader.read(1 << 20)
            records = [(e.base_offset + i, r.value) for e in got for i, r in enumerate(e.records)]
            assert records == [(10 + i, v) for i, (*_, v) in enumerate(_values("b", 0, 5))]
            assert reader.next_offset == 15
        finally:
            await pool.close()

    _run(pulsar, scenario)


def test_a_pull_reader_whose_read_ended_inside_an_entry_counts_the_rest_once(pulsar, sidecar_kafka):
    """A group pull (HTTP) read part of an entry; the connection drops before the rest."""
    topic = create(sidecar_kafka, 1)
    ptopic = f"persistent://public/kafka/{topic}-partition-0"
    produce(sidecar_kafka, topic, _values("c", 0, 10), **{"batch.num.messages": 10})

    async def scenario(client: Any, admin: PulsarAdmin) -> None:
        positions = Positions(admin)
        reader = PartitionReader(client, positions, ptopic, 0, await positions.locate(ptopic, 0))
        try:
            first = await reader.read(3)
            assert [(p.offset, p.record.value) for p in first] == [
                (i, v) for i, (*_, v) in enumerate(_values("c", 0, 3))
            ]
            await _reconnected(pulsar, ptopic, reader._reader._reader)
            rest = await reader.read(100)
            assert [(p.offset, p.record.value) for p in rest] == [
                (3 + i, v) for i, (*_, v) in enumerate(_values("c", 3, 7))
            ]
        finally:
            await reader.close()

    _run(pulsar, scenario)


def _commit(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """One transaction of ``values`` in one batch (its copy: one entry of them all)."""
    producer = transactional_producer(bootstrap, txn_id(), **{"linger.ms": 100})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, key=b"k", partition=0)
    producer.commit_transaction(30)
    assert not producer.errors, producer.errors


def test_a_read_committed_reader_holding_a_copys_first_record_sees_the_copy_once(
    pulsar, sidecar_kafka
):
    """Where a copy and a reconnection meet: a caught-up read_committed fetch reader gets
    the first record of a committed transaction's copy, its connection drops, and it
    reads on: every record of the transaction once, at its offset, the LSO at the end."""
    topic = create(sidecar_kafka, 1)
    ptopic = f"persistent://public/kafka/{topic}-partition-0"
    produce(sidecar_kafka, topic, _values("p", 0, 5))
    copied = [f"t-{i:03d}".encode() for i in range(10)]

    async def scenario(client: Any, admin: PulsarAdmin) -> None:
        pool = ReaderPool(client, admin, PoolLimits(max_readers=4, idle_s=60))
        try:
            reader = await pool.take(ptopic, 0)
            while reader.next_offset < 5:
                await reader.read(1 << 20, committed=True)
            while (waiting := await reader.arrival(committed=True)) is None:
                assert await reader.read(1 << 20, committed=True) == []
            await asyncio.to_thread(_commit, sidecar_kafka, topic, copied)
            await asyncio.wait([waiting], timeout=30)
            assert waiting.done(), "the copy never arrived"
            await _reconnected(pulsar, ptopic, reader._reader._reader)
            got: list[tuple[int, bytes | None]] = []
            deadline = time.monotonic() + 30
            while len(got) < len(copied) and time.monotonic() < deadline:
                entries = await reader.read(1 << 20, committed=True)
                got += [
                    (e.base_offset + i, r.value) for e in entries for i, r in enumerate(e.records)
                ]
                if not entries:
                    await asyncio.sleep(0.2)
            assert got == [(5 + i, v) for i, v in enumerate(copied)]
            assert (reader.next_offset, reader.stable.lso) == (15, 15)
        finally:
            await pool.close()

    _run(pulsar, scenario)
