"""The Pulsar adapters for coordinators, against the real broker: keyed tables,
shared and fenced writers, the name mutex."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar import tables
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.exclusive import FencedWriter, MutexBusy, NameMutex, OwnershipLost
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.tables import KeyedTable, KeyedWriter, LatestRecords
from kop_dedup_tools.registry_startup import delete_namespace
from tests.held_reads import HeldRead, InsideRead

pytestmark = pytest.mark.integration

NAMESPACE = "public/kop-dedup-tables-test"


@pytest.fixture(scope="module")
def namespace(pulsar: Any) -> Iterator[str]:
    ns = f"{NAMESPACE}-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        r = admin.put(f"/admin/v2/namespaces/{ns}")
        assert r.status_code == 204, r.text
    yield ns
    asyncio.run(delete_namespace(pulsar.admin_url, ns))


@pytest.fixture
def topic(namespace: str) -> str:
    return f"persistent://{namespace}/table-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def client(service_url: str) -> AsyncIterator[Any]:
    c = pulsar_async.Client(
        service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error)
    )
    try:
        yield c
    finally:
        await c.close()


async def compacted(pulsar: Any, topic: str) -> None:
    """Ask the broker to compact ``topic`` and wait until it has."""
    admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
    try:
        await admin.compact(topic)
        deadline = asyncio.get_running_loop().time() + 30
        while (status := await admin.compaction_status(topic)) != "SUCCESS":
            assert status in {"NOT_RUN", "RUNNING"}, status
            assert asyncio.get_running_loop().time() < deadline, "compaction did not finish"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


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


def test_a_compacted_read_returns_one_record_per_key_and_no_removed_key(pulsar, topic):
    """What item 6 builds on, checked on the broker: after compaction a reader reads the
    latest record of each live key only, and a tombstoned key not at all (Pulsar 4.0.x
    keeps non-batched empty payloads of the C++ client; the writers batch)."""

    async def scenario(a: Any, b: Any) -> None:
        writer = KeyedWriter(a, topic)
        try:
            for version in range(3):
                for key in "abcde":
                    await writer.send(key, f"{key}{version}".encode())
            await writer.tombstone("c")
        finally:
            await writer.close()
        await compacted(pulsar, topic)
        full, compact = LatestRecords(), LatestRecords()
        raw = KeyedTable(b, topic, full.apply, read_compacted=False)
        table = KeyedTable(b, topic, compact.apply)
        try:
            await raw.catch_up()
            await table.catch_up()
        finally:
            await raw.close()
            await table.close()
        assert raw.records_read == 16
        assert table.records_read == 4
        expected = {"a": b"a2", "b": b"b2", "d": b"d2", "e": b"e2"}
        assert {k: r.value for k, r in compact.items()} == expected
        assert {k: r.value for k, r in full.items()} == expected

    run(pulsar, scenario)


def test_a_catch_up_cancelled_while_its_reader_reads_loses_no_record(pulsar, topic, monkeypatch):
    """A catch-up reads on a worker thread; cancelled once that thread took records from
    the reader (a state partition's load cut short: the partition moved on mid-load), the
    next catch-up must still apply them. Before, the next one went on with the same
    reader, past them: they were never applied (a new owner answered from a view that
    lacked an id the log held)."""
    held = HeldRead(monkeypatch, key="x")

    async def scenario(a: Any, b: Any) -> None:
        writer = KeyedWriter(a, topic)
        state = LatestRecords()
        table = KeyedTable(b, topic, state.apply)
        try:
            await writer.send("w", b"0")
            assert await table.catch_up() == 1  # its reader is at the end
            await writer.send("x", b"1")
            await writer.send("y", b"1")
            loading = asyncio.ensure_future(table.catch_up())
            await held.taken()
            loading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await loading
            held.release()  # the worker hands x (and y) back to nobody
            await writer.send("z", b"1")
            await table.catch_up()
            assert sorted(k for k, _ in state.items()) == ["w", "x", "y", "z"]
        finally:
            held.release()
            await table.close()
            await writer.close()

    run(pulsar, scenario)


def test_a_catch_up_cancelled_mid_read_closes_its_reader_only_once_the_read_returned(
    pulsar, topic, monkeypatch
):
    """Cancelled while its worker thread is inside ``read_next`` (a slow read), a catch-up
    gives its reader up; the reader is closed once that read returned, never under it (a
    close while another thread is inside a read on the same reader races in the C++
    client). Before, it was closed at once, the thread still inside. The records the
    thread took are applied by the next catch-up all the same."""
    held = InsideRead(monkeypatch, topic, key="x")

    async def scenario(a: Any, b: Any) -> None:
        writer = KeyedWriter(a, topic)
        state = LatestRecords()
        table = KeyedTable(b, topic, state.apply)
        try:
            await writer.send("w", b"0")
            assert await table.catch_up() == 1  # its reader is at the end
            await writer.send("x", b"1")
            await writer.send("y", b"1")
            loading = asyncio.ensure_future(table.catch_up())
            await held.inside()
            loading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await loading
            # a close that does not wait for the read comes now: give it the time to
            assert not await held.closed(2.0), held.closes
            held.release()
            await writer.send("z", b"1")
            await table.catch_up()
            assert sorted(k for k, _ in state.items()) == ["w", "x", "y", "z"]
        finally:
            held.release()
            await table.close()
            await writer.close()
        assert len(held.closes) == 2, held.closes  # the reader given up, then the next
        assert held.closes == [0, 0], "a reader was closed while a read was inside it"

    run(pulsar, scenario)


def test_a_chunk_read_past_its_wait_is_replaced_and_closed_once_the_read_returned(
    pulsar, topic, monkeypatch
):
    """A chunk read that does not return within ``_CHUNK_WAIT_S`` (one past it: its
    ``read_next`` is slow) fails the catch-up's first attempt, whose retry reads the
    chunk again with a new reader; the old reader is closed once the slow read returned,
    never under it. Before, the retry closed it at once, the thread still inside."""
    monkeypatch.setattr(tables, "_CHUNK_WAIT_S", 3.0)
    held = InsideRead(monkeypatch, topic, key="x")

    async def scenario(a: Any, b: Any) -> None:
        writer = KeyedWriter(a, topic)
        state = LatestRecords()
        table = KeyedTable(b, topic, state.apply)
        try:
            await writer.send("w", b"0")
            assert await table.catch_up() == 1
            await writer.send("x", b"1")
            await writer.send("y", b"1")
            catching = asyncio.ensure_future(table.catch_up())
            await held.inside()
            assert await catching == 2  # past the wait: the retry read x and y
            assert sorted(k for k, _ in state.items()) == ["w", "x", "y"]
            assert not await held.closed(1.0), held.closes
            held.release()
        finally:
            held.release()
            await table.close()
            await writer.close()
        assert len(held.closes) == 2, held.closes  # the reader replaced, then the retry's
        assert held.closes == [0, 0], "a reader was closed while a read was inside it"

    run(pulsar, scenario)
