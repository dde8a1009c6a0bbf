"""The registries' memory is bounded: expiry after the last raise, a cap that drops
the oldest first, tombstones for what expired, repairs for what compaction would get
wrong. On a stepped clock, without Pulsar (the table, writer and mutex are fakes; the
real ones are tested in tests/integration)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pydantic import ValidationError

from kop_dedup.coordination.epochs import EpochMap, EpochRegistry
from kop_dedup.coordination.expiry import Bounds, ExpiringMap
from kop_dedup.coordination.transactional_ids import TransactionalIds
from kop_dedup.pulsar.exclusive import MutexBusy
from kop_dedup.pulsar.tables import TableRecord
from kop_dedup.runtime import registry_bounds
from kop_dedup.settings import Settings

DAY_MS = 86_400_000
WEEK = Bounds(expiry_ms=7 * DAY_MS, max_entries=1000)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """Wall time in seconds that moves only when told."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.ms = start_ms

    def __call__(self) -> float:
        return self.ms / 1000

    def step(self, ms: int) -> None:
        self.ms += ms


# -- ExpiringMap ---------------------------------------------------------------


def test_an_entry_expires_exactly_its_expiry_after_it_was_set():
    entries: ExpiringMap[str, int] = ExpiringMap(WEEK)
    entries.put("a", 1, at_ms=0)
    assert entries.expire(7 * DAY_MS - 1) == []
    assert not entries.has_expired(7 * DAY_MS - 1)
    assert entries.has_expired(7 * DAY_MS)
    assert entries.expire(7 * DAY_MS) == [("a", 1, 0)]
    assert len(entries) == 0


def test_setting_an_entry_again_restarts_its_expiry():
    entries: ExpiringMap[str, int] = ExpiringMap(WEEK)
    entries.put("a", 1, at_ms=0)
    entries.put("b", 1, at_ms=DAY_MS)
    entries.put("a", 2, at_ms=2 * DAY_MS)
    assert entries.expire(8 * DAY_MS) == [("b", 1, DAY_MS)]
    assert entries.get("a") == 2
    assert entries.expire(9 * DAY_MS) == [("a", 2, 2 * DAY_MS)]


def test_above_the_cap_the_oldest_entries_go_first_and_are_counted():
    entries: ExpiringMap[int, int] = ExpiringMap(Bounds(expiry_ms=DAY_MS, max_entries=3))
    for key in range(10):
        entries.put(key, 0, at_ms=key)
    assert len(entries) == 3
    assert [k for k in range(10) if k in entries] == [7, 8, 9]
    assert entries.take_capped() == 7
    assert entries.take_capped() == 0


def test_an_entry_set_back_in_time_keeps_its_place_and_never_expires_early():
    entries: ExpiringMap[str, int] = ExpiringMap(WEEK)
    entries.put("old", 1, at_ms=0)
    entries.put("a", 1, at_ms=DAY_MS)
    entries.put("a", 1, at_ms=DAY_MS // 2)  # an earlier time from another clock
    assert entries.expire(7 * DAY_MS) == [("old", 1, 0)]
    assert entries.expire(7 * DAY_MS + DAY_MS // 2) == [("a", 1, DAY_MS // 2)]


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        Bounds(expiry_ms=0, max_entries=1)


# -- EpochMap: the registry's memory --------------------------------------------


def test_an_epoch_is_forgotten_a_week_after_it_was_last_raised_and_only_then():
    epochs = EpochMap(WEEK)
    epochs.apply(5, 3, at_ms=0)
    epochs.apply(6, 1, at_ms=DAY_MS)
    epochs.apply(6, 2, at_ms=3 * DAY_MS)  # raised again: its week starts again
    swept = epochs.sweep(now_ms=7 * DAY_MS)
    assert swept.expired == [(5, 3, 0)]
    assert (epochs.highest(5), epochs.highest(6)) == (None, 2)
    assert epochs.sweep(now_ms=10 * DAY_MS - 1).expired == []
    assert epochs.sweep(now_ms=10 * DAY_MS).expired == [(6, 2, 3 * DAY_MS)]


def test_the_map_never_holds_more_than_its_cap():
    epochs = EpochMap(Bounds(expiry_ms=WEEK.expiry_ms, max_entries=1000))
    for pid in range(10_000):
        epochs.apply(pid, 1, at_ms=pid)
    swept = epochs.sweep(now_ms=10_000)
    assert len(epochs) == 1000
    assert (swept.capped, swept.kept, swept.expired) == (9000, 1000, [])
    assert epochs.highest(8999) is None
    assert epochs.highest(9000) == 1


def test_a_lower_epoch_read_after_a_higher_one_is_fenced_and_written_again():
    """Compaction keeps a key's latest record: without the repair, a start after
    compaction would see epoch 2 and let a zombie of epoch 2 write."""
    epochs = EpochMap(WEEK)
    epochs.apply(5, 3, at_ms=10)
    epochs.apply(5, 2, at_ms=20)  # written by a sidecar that had not seen 3
    assert epochs.highest(5) == 3
    assert epochs.take_repairs() == [(5, 3)]
    assert epochs.take_repairs() == []


def test_a_later_record_that_restores_the_highest_epoch_cancels_the_repair():
    epochs = EpochMap(WEEK)
    epochs.raised(5, 3, at_ms=10)  # our own raise, its record not read back yet
    epochs.apply(5, 2, at_ms=5)  # another sidecar's, before ours in the topic
    epochs.apply(5, 3, at_ms=12)  # ours, read back
    assert epochs.take_repairs() == []


def test_a_tombstone_for_an_older_raise_keeps_the_newer_one_and_writes_it_again():
    epochs = EpochMap(WEEK)
    epochs.apply(5, 3, at_ms=0)
    epochs.apply(5, 4, at_ms=8 * DAY_MS)  # raised while a sweeper decided on epoch 3
    epochs.forget(5, 3, raised_at_ms=0)
    assert epochs.highest(5) == 4
    assert epochs.take_repairs() == [(5, 4)]


def test_a_tombstone_for_the_raise_we_know_forgets_it():
    epochs = EpochMap(WEEK)
    epochs.apply(5, 3, at_ms=0)
    epochs.forget(5, 3, raised_at_ms=0)
    assert epochs.highest(5) is None
    assert epochs.take_repairs() == []


# -- EpochRegistry.sweep, on fakes ----------------------------------------------


class FakeWriter:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.tombstones: list[tuple[str, dict[str, str]]] = []

    async def send(self, key: str, value: bytes, *, properties: Any = None) -> None:
        self.sent.append((key, value))

    async def tombstone(self, key: str, *, properties: Any = None) -> None:
        self.tombstones.append((key, dict(properties or {})))


class FakeMutex:
    def __init__(self) -> None:
        self.busy = False
        self.held = 0

    @asynccontextmanager
    async def hold(self, wait_s: float = 30.0) -> AsyncIterator[None]:
        if self.busy:
            raise MutexBusy("held elsewhere")
        self.held += 1
        yield None


class FakeTable:
    def __init__(self) -> None:
        self.records_read = 0

    async def barrier(self) -> None:
        return None

    def barrier_future(self) -> asyncio.Future[None]:
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def catch_up(self) -> int:
        return 0

    async def compact_if_due(self, live_keys: int) -> bool:
        return False


def fake_epoch_registry(clock: Clock, bounds: Bounds = WEEK) -> tuple[EpochRegistry, Any, Any]:
    registry = EpochRegistry(
        None,
        "persistent://public/sys/producer-epochs",
        bounds=bounds,
        sweeper_name="s",
        clock=clock,
    )
    writer, mutex = FakeWriter(), FakeMutex()
    registry._table, registry._writer, registry._sweeper = FakeTable(), writer, mutex  # type: ignore[assignment]
    return registry, writer, mutex


def record(pid: int, epoch: int, at_ms: int) -> TableRecord:
    return TableRecord(str(pid), str(epoch).encode(), at_ms)


@pytest.mark.anyio
async def test_a_sweep_forgets_expired_epochs_tombstones_them_and_logs_once(caplog):
    clock = Clock()
    registry, writer, _ = fake_epoch_registry(clock)
    for pid in range(3):
        registry._apply(record(pid, 1, clock.ms))
    clock.step(DAY_MS)
    await registry.raise_to(7, 2)
    assert writer.sent == [("7", b"2")]
    clock.step(6 * DAY_MS)  # 7 days after the first three, 6 after pid 7
    with caplog.at_level(logging.INFO, logger="kop_dedup.coordination.epochs"):
        swept = await registry.sweep()
    assert [pid for pid, _, _ in swept.expired] == [0, 1, 2]
    assert [registry.highest(pid) for pid in (0, 7)] == [None, 2]
    assert [key for key, _ in writer.tombstones] == ["0", "1", "2"]
    assert writer.tombstones[0][1] == {"epoch": "1", "raisedAt": str(clock.ms - 7 * DAY_MS)}
    lines = [r for r in caplog.records if "forgot" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    assert "forgot 3 producer epochs" in lines[0].getMessage()


@pytest.mark.anyio
async def test_a_sweep_that_finds_nothing_says_nothing_and_writes_nothing(caplog):
    clock = Clock()
    registry, writer, mutex = fake_epoch_registry(clock)
    registry._apply(record(1, 1, clock.ms))
    with caplog.at_level(logging.INFO, logger="kop_dedup.coordination.epochs"):
        await registry.sweep()
    assert (writer.tombstones, mutex.held) == ([], 0)
    assert not [r for r in caplog.records if "forgot" in r.getMessage()]


@pytest.mark.anyio
async def test_the_tombstones_are_left_to_the_sidecar_that_holds_the_sweeper_name():
    clock = Clock()
    registry, writer, mutex = fake_epoch_registry(clock)
    registry._apply(record(1, 1, clock.ms))
    clock.step(8 * DAY_MS)
    mutex.busy = True
    swept = await registry.sweep()
    assert len(swept.expired) == 1
    assert registry.highest(1) is None  # memory is bounded either way
    assert writer.tombstones == []


@pytest.mark.anyio
async def test_a_catch_up_that_read_an_out_of_order_epoch_writes_the_highest_again():
    clock = Clock()
    registry, writer, _ = fake_epoch_registry(clock)
    registry._apply(record(5, 3, clock.ms))
    registry._apply(record(5, 2, clock.ms + 1))
    await registry.barrier()
    assert registry._repairing is not None
    await registry._repairing
    assert writer.sent == [("5", b"3")]
    assert registry.highest(5) == 3


@pytest.mark.anyio
async def test_the_produce_paths_barrier_future_also_repairs_after_its_catch_up():
    clock = Clock()
    registry, writer, _ = fake_epoch_registry(clock)
    registry._apply(record(5, 3, clock.ms))
    registry._apply(record(5, 2, clock.ms + 1))
    await registry.barrier_future()
    await asyncio.sleep(0)  # the done callback runs in the next loop step
    assert registry._repairing is not None
    await registry._repairing
    assert writer.sent == [("5", b"3")]


@pytest.mark.anyio
async def test_a_cap_drop_is_logged_with_the_cap(caplog):
    clock = Clock()
    registry, writer, _ = fake_epoch_registry(clock, Bounds(WEEK.expiry_ms, max_entries=2))
    for pid in range(5):
        registry._apply(record(pid, 1, clock.ms + pid))
    with caplog.at_level(logging.INFO, logger="kop_dedup.coordination.epochs"):
        swept = await registry.sweep()
    assert (swept.capped, len(registry)) == (3, 2)
    assert writer.tombstones == []  # over the cap is local memory, not expiry
    assert any("3 over the cap of 2" in r.getMessage() for r in caplog.records)


# -- TransactionalIds.sweep, on fakes -------------------------------------------


def fake_transactional_ids(clock: Clock) -> tuple[TransactionalIds, Any, Any]:
    ids = TransactionalIds(
        None,
        "persistent://public/sys/transactional-ids",
        "m",
        None,
        None,
        bounds=WEEK,
        clock=clock,  # type: ignore[arg-type]
    )
    writer, mutex = FakeWriter(), FakeMutex()
    ids._table, ids._writer, ids._mutex = FakeTable(), writer, mutex  # type: ignore[assignment]
    ids._loaded = True
    return ids, writer, mutex


def txn_record(tid: str, pid: int, epoch: int, at_ms: int) -> TableRecord:
    return TableRecord(tid, f'{{"producerId": {pid}, "producerEpoch": {epoch}}}'.encode(), at_ms)


@pytest.mark.anyio
async def test_transactional_ids_expire_a_week_after_their_last_init_and_are_tombstoned():
    clock = Clock()
    ids, writer, _ = fake_transactional_ids(clock)
    ids._apply(txn_record("old", 1, 0, clock.ms))
    clock.step(DAY_MS)
    ids._apply(txn_record("new", 2, 0, clock.ms))
    clock.step(6 * DAY_MS)
    assert await ids.sweep() == 1
    assert (ids.get("old"), ids.get("new")) == (None, (2, 0))
    assert writer.tombstones == [("old", {})]


@pytest.mark.anyio
async def test_a_busy_coordinator_mutex_defers_the_tombstones_to_the_next_sweep():
    clock = Clock()
    ids, writer, mutex = fake_transactional_ids(clock)
    ids._apply(txn_record("a", 1, 0, clock.ms))
    clock.step(7 * DAY_MS)
    mutex.busy = True
    await ids.sweep()
    assert (ids.get("a"), writer.tombstones) == (None, [])
    mutex.busy = False
    await ids.sweep()
    assert writer.tombstones == [("a", {})]


@pytest.mark.anyio
async def test_an_id_initialised_again_before_its_tombstone_is_not_removed():
    clock = Clock()
    ids, writer, mutex = fake_transactional_ids(clock)
    ids._apply(txn_record("a", 1, 0, clock.ms))
    clock.step(7 * DAY_MS)
    mutex.busy = True
    await ids.sweep()
    ids._apply(txn_record("a", 1, 1, clock.ms))  # another sidecar's init, read back
    mutex.busy = False
    await ids.sweep()
    assert writer.tombstones == []
    assert ids.get("a") == (1, 1)


# -- settings -----------------------------------------------------------------


def test_default_bounds_are_a_week_and_the_caps():
    bounds = registry_bounds(Settings())
    assert bounds.epochs == Bounds(expiry_ms=7 * DAY_MS, max_entries=200_000)
    assert bounds.transactional_ids == Bounds(expiry_ms=7 * DAY_MS, max_entries=100_000)
    assert bounds.sweep_interval_s == 60.0


@pytest.mark.parametrize(
    "bad",
    [
        {"producer_epoch_expiry_seconds": 30},
        {"max_producer_epochs": 10},
        {"max_transactional_ids": 0},
        {"registry_sweep_seconds": 0},
        {"transactional_id_expiry_seconds": 600, "registry_sweep_seconds": 601},
    ],
)
def test_bounds_settings_are_validated(bad):
    with pytest.raises(ValidationError):
        Settings(**bad)
