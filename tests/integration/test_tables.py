"""The Pulsar adapters for coordinators, against the real broker: keyed tables,
shared and fenced writers, the name mutex."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pulsar
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar.exclusive import FencedWriter, MutexBusy, NameMutex, OwnershipLost
from kop_dedup.pulsar.tables import KeyedTable, KeyedWriter, LatestRecords

pytestmark = pytest.mark.integration

NAMESPACE = "public/kop-dedup-tables-test"


@pytest.fixture(scope="module")
def namespace(pulsar: Any) -> str:
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        r = admin.put(f"/admin/v2/namespaces/{NAMESPACE}")
        assert r.status_code in {204, 409}, r.text
    return NAMESPACE


@pytest.fixture
def topic(namespace: str) -> str:
    return f"persistent://{namespace}/table-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def client(service_url: str) -> AsyncIterator[Any]:
    c = pulsar_async.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        yield c
    finally:
        await c.close()


def run(pulsar: Any, scenario: Callable[[Any, Any], Awaitable[None]]) -> None:
    """Run ``scenario(client_a, client_b)``: two clients, as two sidecars would have."""

    async def main() -> None:
        async with client(pulsar.service_url) as a, client(pulsar.service_url) as b:
            await asyncio.wait_for(scenario(a, b), 60)

    asyncio.run(main())


def test_a_table_applies_what_other_clients_wrote_in_order_and_tombstones_remove(pulsar, topic):
    async def scenario(a: Any, b: Any) -> None:
        writer = KeyedWriter(a, topic)
        state = LatestRecords()
        table = KeyedTable(b, topic, state.apply)
        try:
            await writer.send("x", b"1")
            await writer.send("y", b"1")
            assert await table.catch_up() == 2
            await writer.send("x", b"2", properties={"why": "test"})
            await writer.tombstone("y")
            await table.barrier()
            assert {k: r.value for k, r in state.items()} == {"x": b"2"}
            assert state.get("x").properties == {"why": "test"}
            assert state.get("x").publish_time_ms > 0
            assert table.records_read == 4
            assert await table.catch_up() == 0
        finally:
            await table.close()
            await writer.close()

    run(pulsar, scenario)


def test_opening_a_fenced_writer_evicts_the_previous_one_whose_next_write_fails(pulsar, topic):
    async def scenario(a: Any, b: Any) -> None:
        old, new = FencedWriter(a, topic), FencedWriter(b, topic)
        state = LatestRecords()
        table = KeyedTable(b, topic, state.apply)
        try:
            await old.open()
            await old.send("k", b"old")
            await new.open()
            with pytest.raises(OwnershipLost, match="lost ownership"):
                await old.send("k", b"zombie")
            assert not old.owned
            with pytest.raises(OwnershipLost):  # and every write after it, at once
                await old.tombstone("k")
            await table.catch_up()
            assert state.get("k").value == b"old"  # what the old owner stored is seen
            await new.send("k", b"new")
            await table.catch_up()
            assert state.get("k").value == b"new"
            assert new.owned
        finally:
            await table.close()
            await old.close()
            await new.close()

    run(pulsar, scenario)


def test_a_name_is_held_by_one_client_at_a_time_and_resends_are_duplicates(pulsar, topic):
    async def scenario(a: Any, b: Any) -> None:
        name = f"mutex-{uuid.uuid4().hex[:8]}"
        async with NameMutex(a, topic, name).hold() as held:
            assert held.last_sequence_id == -1
            assert await held.send(b"1", sequence_id=1)
            with pytest.raises(MutexBusy):
                async with NameMutex(b, topic, name).hold(wait_s=0):
                    pass
        async with NameMutex(b, topic, name).hold(wait_s=5) as held:
            assert held.last_sequence_id == 1  # the broker remembers the name's sequence
            assert not await held.send(b"1", sequence_id=1)  # dedup: not stored again
            last = await held.last_record()
            assert last is not None
            assert last.value == b"1"

    run(pulsar, scenario)
