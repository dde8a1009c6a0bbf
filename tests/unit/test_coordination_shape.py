"""The coordination layer's shape: only the Pulsar adapters touch the client, and the
coalesced barrier of a keyed table, on fake catch-ups (no Pulsar)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

import kop_dedup.coordination
from kop_dedup.pulsar.tables import KeyedTable, LatestRecords, TableRecord


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_nothing_under_coordination_imports_the_pulsar_client():
    package = Path(kop_dedup.coordination.__file__).parent
    offenders = {
        f"{path.name}: {name}"
        for path in package.rglob("*.py")
        for name in _imported_modules(path)
        if name.split(".")[0] in {"pulsar", "_pulsar"}
    }
    assert len(list(package.rglob("*.py"))) >= 4
    assert offenders == set()


class _CountingTable(KeyedTable):
    """A KeyedTable whose catch-up is a controllable fake."""

    def __init__(self) -> None:
        super().__init__(None, "persistent://t/ns/fake", lambda _record: None)
        self.started = 0
        self.allowed = asyncio.Semaphore(0)  # one release() lets one catch-up finish

    async def catch_up(self) -> int:
        self.started += 1
        await self.allowed.acquire()
        return 0


@pytest.mark.anyio
async def test_callers_arriving_during_a_catch_up_share_the_next_one():
    table = _CountingTable()
    first = asyncio.ensure_future(table.barrier())
    await asyncio.sleep(0)
    late = [asyncio.ensure_future(table.barrier()) for _ in range(5)]
    await asyncio.sleep(0)
    assert table.started == 1
    table.allowed.release()
    await first
    for _ in range(100):  # the queued catch-up starts once the running one ended
        if table.started == 2:
            break
        await asyncio.sleep(0)
    assert table.started == 2
    assert not any(f.done() for f in late)  # they wait for one that started after them
    table.allowed.release()
    await asyncio.gather(*late)
    assert table.started == 2


@pytest.mark.anyio
async def test_a_caller_that_gives_up_does_not_cancel_the_shared_catch_up():
    table = _CountingTable()
    impatient = asyncio.ensure_future(table.barrier())
    await asyncio.sleep(0)
    patient = asyncio.ensure_future(table.barrier())
    await asyncio.sleep(0)
    impatient.cancel()
    table.allowed.release()
    await asyncio.sleep(0)
    table.allowed.release()
    await asyncio.wait_for(patient, 5)
    assert table.started == 2


@pytest.mark.anyio
async def test_callers_of_barrier_future_share_one_catch_up_without_a_task_each():
    table = _CountingTable()
    running = table.barrier_future()
    await asyncio.sleep(0)
    queued = [table.barrier_future() for _ in range(5)]
    assert all(f is queued[0] for f in queued)
    assert queued[0] is not running
    table.allowed.release()
    await running
    table.allowed.release()
    await asyncio.wait_for(queued[0], 5)
    assert table.started == 2


def test_latest_records_keeps_the_last_record_per_key_and_tombstones_remove():
    state = LatestRecords()
    for key, value in [("a", b"1"), ("b", b"1"), ("a", b"2"), ("b", None)]:
        state.apply(TableRecord(key, value, 0))
    assert [(k, r.value) for k, r in state.items()] == [("a", b"2")]
    assert "b" not in state
    assert len(state) == 1
