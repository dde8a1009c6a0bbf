"""A group pull's read cut short after its worker thread took records from the Pulsar
reader, on a real broker: the next read of the same :class:`PartitionReader` hands out
those records, at their offsets, never skips them.

A pull reads on a worker thread (``reading._read_available``): the records it took exist
only in that thread until the event loop counts them. A read that ends any other way
than done (its awaiting coroutine cancelled, or the read failing after it took records:
GetLastMessageId not answered within the operation timeout once the client's queue ran
dry) lost them, and the member's reader, kept for the next pull at the same offset, went
on after them: the next pull answered later records under the lost ones' offsets.

Nothing of Pulsar is replaced: the real reader reads from the real broker; the test only
chooses the moment the thread hands its records back, or that the read fails then.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar import fetching, reading
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.reader_pool import PoolLimits, ReaderPool
from kop_dedup.pulsar.reading import PartitionReader
from kop_dedup.pulsar.stored import StoredEntry
from tests.integration.kafka_consume import create, produce

pytestmark = pytest.mark.integration


def _values(first: int, n: int) -> list[tuple[int, bytes, bytes]]:
    return [(0, b"k", f"v-{i:03d}".encode()) for i in range(first, first + n)]


class _Held:
    """Holds the first worker-thread read that took ``value`` from the reader, after it
    took it, until :meth:`release`; then it returns what it took, or (``fail``) raises
    as a Pulsar call failing later in the same read would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, value: bytes, *, fail: bool) -> None:
        self._taken, self._released = threading.Event(), threading.Event()
        read = reading._read_available

        def held(*args: Any) -> Any:
            raw, drained = read(*args)
            if not self._taken.is_set() and any(r.record.value == value for r in raw):
                self._taken.set()
                self._released.wait(30)
                if fail:
                    raise pulsar.Timeout("GetLastMessageId not answered (injected)")
            return raw, drained

        monkeypatch.setattr(reading, "_read_available", held)

    async def taken(self) -> None:
        if not await asyncio.to_thread(self._taken.wait, 30):
            raise AssertionError("no read took the record")

    def release(self) -> None:
        self._released.set()


def _scenario(pulsar_env: Any, bootstrap: str, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    topic = create(bootstrap, 1)
    ptopic = f"persistent://public/kafka/{topic}-partition-0"
    produce(bootstrap, topic, _values(0, 10), **{"batch.num.messages": 1})
    held = _Held(monkeypatch, b"v-003", fail=how == "fails")

    async def main() -> None:
        client = pulsar_async.Client(pulsar_env.service_url)
        admin = PulsarAdmin(pulsar_env.admin_url, Naming("public", "kafka", "kop"))
        positions = Positions(admin)
        reader = PartitionReader(client, positions, ptopic, 0, await positions.locate(ptopic, 0))
        try:
            first = await reader.read(3)
            assert [p.record.value for p in first] == [v for *_, v in _values(0, 3)]
            pulling = asyncio.ensure_future(reader.read(100))
            await held.taken()  # the thread took v-003 (and what follows) from the reader
            if how == "cancelled":
                pulling.cancel()
            held.release()
            with pytest.raises(asyncio.CancelledError if how == "cancelled" else pulsar.Timeout):
                await pulling
            assert reader.next_offset == 3  # nothing was handed out
            got: list[reading.Pulled] = []
            for _ in range(100):
                got += await reader.read(100)
                if len(got) >= 7:
                    break
                await asyncio.sleep(0.05)
            assert [(p.offset, p.record.value) for p in got] == [
                (3 + i, v) for i, (*_, v) in enumerate(_values(3, 7))
            ]
        finally:
            await reader.close()
            await admin.close()
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_a_pull_read_cancelled_after_its_thread_took_records_loses_none(
    pulsar, sidecar_kafka, monkeypatch
):
    _scenario(pulsar, sidecar_kafka, monkeypatch, "cancelled")


def test_a_pull_read_failing_after_its_thread_took_records_loses_none(
    pulsar, sidecar_kafka, monkeypatch
):
    """The HTTP pull answers the failure and keeps the member's reader: the next pull
    starts at the same offset, with the same reader."""
    _scenario(pulsar, sidecar_kafka, monkeypatch, "fails")


def _fetch_scenario(
    pulsar_env: Any, bootstrap: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A Kafka fetch reader (kept in the pool at its next offset) whose read is cut short
    after its thread took entries: the pool's next reader at that offset reads them."""
    topic = create(bootstrap, 1)
    ptopic = f"persistent://public/kafka/{topic}-partition-0"
    produce(bootstrap, topic, _values(0, 10), **{"batch.num.messages": 1})
    taken, released = threading.Event(), threading.Event()
    read = fetching.read_available

    def held(*args: Any) -> Any:
        raw, at, drained = read(*args)
        if not taken.is_set() and any(r.value == b"v-003" for e in raw for r in e.records):
            taken.set()
            released.wait(30)
            if how == "fails":
                raise pulsar.Timeout("GetLastMessageId not answered (injected)")
        return raw, at, drained

    monkeypatch.setattr(fetching, "read_available", held)

    async def main() -> None:
        client = pulsar_async.Client(pulsar_env.service_url)
        admin = PulsarAdmin(pulsar_env.admin_url, Naming("public", "kafka", "kop"))
        pool = ReaderPool(client, admin, PoolLimits(max_readers=4, idle_s=60))
        try:
            reader = await pool.take(ptopic, 0)
            got = await reader.read(1)
            while reader.next_offset < 3:
                got += await reader.read(1)
            assert [r.value for e in got for r in e.records] == [v for *_, v in _values(0, 3)]
            pool.give(reader)
            reader = await pool.take(ptopic, 3)
            pulling = asyncio.ensure_future(reader.read(1 << 20))
            assert await asyncio.to_thread(taken.wait, 30), "no read took v-003"
            if how == "cancelled":
                pulling.cancel()
            released.set()
            with pytest.raises(asyncio.CancelledError if how == "cancelled" else pulsar.Timeout):
                await pulling
            pool.give(reader)
            reader = await pool.take(ptopic, 3)
            rest: list[StoredEntry] = []
            for _ in range(100):
                rest += await reader.read(1 << 20)
                if sum(len(e.records) for e in rest) >= 7 or reader.skipped_from is not None:
                    break
                await asyncio.sleep(0.05)
            assert reader.skipped_from is None
            assert [
                (e.base_offset + i, r.value) for e in rest for i, r in enumerate(e.records)
            ] == [(3 + i, v) for i, (*_, v) in enumerate(_values(3, 7))]
            pool.give(reader)
        finally:
            await pool.close()
            await admin.close()
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_a_fetch_read_cancelled_after_its_thread_took_entries_loses_none(
    pulsar, sidecar_kafka, monkeypatch
):
    """Cancelled: a Kafka listener's shutdown cancels the fetches still running."""
    _fetch_scenario(pulsar, sidecar_kafka, monkeypatch, "cancelled")


def test_a_fetch_read_failing_after_its_thread_took_entries_loses_none(
    pulsar, sidecar_kafka, monkeypatch
):
    """The fetch discards a reader that failed; the tails of the last stable offset
    (``StableOffsets``) kept it, so a failed read's reader read on after its entries."""
    _fetch_scenario(pulsar, sidecar_kafka, monkeypatch, "fails")
