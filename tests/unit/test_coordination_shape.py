"""The coordination layer's shape: only the Pulsar adapters touch the client, and the
coalesced barrier of a keyed table, on fake catch-ups (no Pulsar)."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import re
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


def _has(obj: object, name: str) -> bool:
    """An attribute of a class or module, or one its ``__init__``/methods assign."""
    if hasattr(obj, name):
        return True
    return inspect.isclass(obj) and bool(
        re.search(rf"self\.{name}\b[^=\n(]*=[^=]", inspect.getsource(obj))
    )


def _bullets(text: str) -> list[str]:
    """The list items of a docstring section, each with its continuation lines."""
    items: list[str] = []
    for line in text.splitlines():
        if line.startswith("- "):
            items.append(line)
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
    return items


def _section(doc: str, start: str, end: str) -> str:
    return doc[doc.index(start) : doc.index(end)]


def test_the_documented_transport_surface_exists():
    """Every call the coordination docstring lists as the transports' surface exists on
    the class (or module) it names, every reference resolves, and every error code it
    quotes is that Kafka error's."""
    from kop_dedup import errors
    from kop_dedup.coordination.epochs import EpochRegistry
    from kop_dedup.coordination.groups import simple
    from kop_dedup.coordination.groups.coordinator import GroupCoordinator
    from kop_dedup.coordination.groups.lag import GroupLag
    from kop_dedup.coordination.groups.store import GroupStore
    from kop_dedup.coordination.producer_ids import ProducerIdAllocator
    from kop_dedup.coordination.transactions.coordinator import TransactionCoordinator

    doc = kop_dedup.coordination.__doc__ or ""
    sections = {
        ("Registries (", "Transactions ("): [ProducerIdAllocator, EpochRegistry],
        ("Transactions (", "Errors: 49"): [TransactionCoordinator],
        ("Consumer groups (", "Errors: ``StaleMember``"): [
            GroupCoordinator,
            GroupLag,
            GroupStore,
            simple,
        ],
    }
    named = 0
    for (start, end), owners in sections.items():
        bullets = "\n".join(_bullets(_section(doc, start, end)))
        for token in re.findall(r"``([A-Za-z_][\w.]*)", bullets):
            if token.startswith("runtime."):
                continue  # the Runtime attribute, named in the section's heading
            owner_name, _, name = token.rpartition(".")
            candidates = [o for o in owners if not owner_name or o.__name__ == owner_name]
            assert any(_has(o, name) for o in candidates), f"{token} ({start.strip('( ')})"
            named += 1
    assert named >= 28
    for ref in re.findall(r":(?:class|mod):`~?([\w.]+)`", doc):
        path = f"kop_dedup.coordination{ref}" if ref.startswith(".") else ref
        module, _, attr = path.rpartition(".")
        try:
            importlib.import_module(path)
        except ImportError:
            assert hasattr(importlib.import_module(module), attr), ref
    for code, name in re.findall(r"\b(\d{1,3}) ([A-Z][A-Z_]{3,})\b", doc):
        assert errors.BY_CODE[int(code)].name == name, (code, name)
    for runtime_attr in re.findall(r"``runtime\.(\w+)``", doc):
        assert re.search(
            rf"self\.{runtime_attr}\b[^=\n]*=",
            Path(importlib.import_module("kop_dedup.runtime").__file__ or "").read_text(),
        ), runtime_attr
