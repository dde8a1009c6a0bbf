"""The channel manager's lifecycle (lease, open, evict, retire, reopen) on fakes.

The fakes stand in for producer creation and closing only; publishing and dedup are
tested against the real broker in tests/integration.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kop_dedup import errors
from kop_dedup.produce.channels import Channel, ChannelManager
from kop_dedup.pulsar.naming import Naming

TOPIC = "persistent://public/kafka/t-partition-0"


class FakeProducer:
    def __init__(self, name: str, mark: int, log: list[str]) -> None:
        self.name, self._mark, self._log = name, mark, log
        self.room = 100

    def last_sequence_id(self) -> int:
        return self._mark

    async def close(self) -> None:
        self._log.append(f"close {self.name}")
        await asyncio.sleep(0.01)
        self._log.append(f"closed {self.name}")


class FakePublisher:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.marks: dict[str, int] = {}

    async def create(self, topic: str, name: str | None, *, capacity: int) -> FakeProducer:
        self.log.append(f"create {name}")
        return FakeProducer(name or "anon", self.marks.get(name or "", -1), self.log)


class FakeAdmin:
    def __init__(self) -> None:
        self.dedup = (True, "namespace")

    async def effective_deduplication(self, topic: str) -> tuple[bool, str]:
        return self.dedup


def manager(max_open: int = 10, **over: Any) -> tuple[ChannelManager, FakePublisher, list]:
    lost: list[tuple[Channel, int | None, int]] = []
    publisher = FakePublisher()
    mgr = ChannelManager(
        publisher,  # type: ignore[arg-type]
        over.pop("admin", FakeAdmin()),  # type: ignore[arg-type]
        Naming("public", "kafka", "kop"),
        queue_records=100,
        max_open=max_open,
        idle_seconds=300,
        remember=100,
        on_state_lost=lambda c, b, r: lost.append((c, b, r)),
    )
    return mgr, publisher, lost


def deadline() -> float:
    return time.monotonic() + 5


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


async def opened(mgr: ChannelManager, key: tuple[str, int, int]) -> Channel:
    channel = mgr.lease(key, "t")
    await mgr.ensure_open(channel, deadline())
    return channel


def test_an_evicted_channel_is_never_handed_out_again_and_its_name_closes_before_reopening():
    async def go() -> tuple[Channel, Channel, list[str]]:
        mgr, publisher, _ = manager(max_open=1)
        a = await opened(mgr, (TOPIC, 7, 0))
        mgr.release(a)
        b = mgr.lease((TOPIC, 8, 0), "t")  # over the limit: the idle one goes, in this step
        assert a.closed
        again = await opened(mgr, (TOPIC, 7, 0))
        mgr.release(b)
        mgr.release(again)
        await mgr.close()
        return a, again, publisher.log

    a, again, log = run(go())
    assert again is not a
    assert again.producer is None  # closed at shutdown
    # the broker refuses a second holder of a name: the old producer closed first
    assert log.index("closed kop-7-0") < log.index("create kop-7-0", log.index("close kop-7-0"))


def test_a_leased_channel_is_neither_evicted_nor_retired():
    async def go() -> Channel:
        mgr, _, _ = manager(max_open=1)
        held = await opened(mgr, (TOPIC, 7, 0))  # a batch holds it
        mgr.lease((TOPIC, 8, 0), "t")
        mgr.note_epoch_with_state(TOPIC, 7, 0)
        mgr.note_epoch_with_state(TOPIC, 7, 1)  # a newer epoch would retire older idle ones
        assert not held.closed
        assert held.producer is not None
        return held

    run(go())


def test_idle_channels_of_older_epochs_close_when_a_newer_epoch_has_state():
    async def go() -> tuple[Channel, Channel]:
        mgr, _, _ = manager()
        old = await opened(mgr, (TOPIC, 7, 0))
        mgr.release(old)
        mgr.note_epoch_with_state(TOPIC, 7, 0)
        other = await opened(mgr, (TOPIC, 9, 0))
        mgr.release(other)
        mgr.note_epoch_with_state(TOPIC, 7, 1)
        return old, other

    old, other = run(go())
    assert old.closed
    assert not other.closed


def test_a_channel_in_flight_is_not_idle():
    async def go() -> bool:
        mgr, _, _ = manager(max_open=1)
        busy = await opened(mgr, (TOPIC, 7, 0))
        busy.state.in_flight = 1
        mgr.release(busy)
        mgr.lease((TOPIC, 8, 0), "t")
        return busy.closed

    assert run(go()) is False


def test_reopening_a_name_the_broker_forgot_is_reported_and_the_memory_kept():
    async def go() -> tuple[Channel, list]:
        mgr, publisher, lost = manager(max_open=1)
        publisher.marks["kop-7-0"] = 10  # Pulsar sequence id 10: extended sequence 9
        a = await opened(mgr, (TOPIC, 7, 0))
        assert a.state.persisted == 9
        mgr.release(a)
        mgr.release(mgr.lease((TOPIC, 8, 0), "t"))  # evicts a, remembering 9
        publisher.marks["kop-7-0"] = -1  # the broker forgot the name
        again = await opened(mgr, (TOPIC, 7, 0))
        return again, lost

    again, lost = run(go())
    assert again.state.persisted == 9
    assert again.state.broker_mark is None
    assert [(b, r) for _, b, r in lost] == [(None, 9)]


def test_a_mark_read_before_a_batch_arrived_is_read_again_and_the_brokers_taken():
    """Another holder stored up to 5 while the producer was away: only a new producer
    reads it (the C++ client keeps its own last sequence id across a reconnection)."""

    async def go() -> tuple[Channel, list[str], float]:
        mgr, publisher, _ = manager()
        publisher.marks["kop-7-0"] = 3  # extended 2
        channel = await opened(mgr, (TOPIC, 7, 0))
        read = channel.mark_read
        arrived = time.monotonic()
        publisher.marks["kop-7-0"] = 6  # extended 5, stored by the other holder
        await mgr.verify(channel, arrived, deadline())
        return channel, publisher.log, read

    channel, log, read = run(go())
    assert channel.state.persisted == 5
    assert not channel.state.broken
    assert channel.mark_read > read
    assert log[-3:] == ["close kop-7-0", "closed kop-7-0", "create kop-7-0"]


def test_a_mark_read_after_the_batch_arrived_is_not_read_again():
    async def go() -> list[str]:
        mgr, publisher, _ = manager()
        arrived = time.monotonic()
        channel = await opened(mgr, (TOPIC, 7, 0))
        await mgr.verify(channel, arrived, deadline())
        return publisher.log

    assert run(go()) == ["create kop-7-0"]


def test_a_resync_on_a_mark_the_broker_lost_keeps_what_the_channel_stored_and_says_so():
    """A resync used to take only the broker's mark and what a closed channel left: the
    channel's own stored sequences and start were dropped with the producer."""

    async def go() -> tuple[Channel, list]:
        mgr, publisher, lost = manager()
        channel = await opened(mgr, (TOPIC, 7, 0))
        channel.state.on_handed(4, 9, resend=False)  # a producer that started at 4
        channel.state.on_stored(4, 9, "1:2:0:0")
        publisher.marks["kop-7-0"] = -1  # the broker forgot the name
        channel.state.broken = True  # as after a failed send, or a read of the mark
        await mgr.resync(channel, deadline())
        return channel, lost

    channel, lost = run(go())
    assert (channel.state.persisted, channel.state.floor) == (9, 4)
    assert channel.state.broker_mark is None
    assert [(b, r) for _, b, r in lost] == [(None, 9)]


def test_a_topic_with_deduplication_off_is_refused_when_its_channel_opens():
    async def go() -> None:
        admin = FakeAdmin()
        admin.dedup = (False, "topic")
        mgr, _, _ = manager(admin=admin)
        channel = mgr.lease((TOPIC, 7, 0), "t")
        await mgr.ensure_open(channel, deadline())

    with pytest.raises(errors.KafkaStorageError, match=r"deduplication is off.*topic policy"):
        run(go())


def test_the_plain_channel_needs_no_deduplication():
    async def go() -> Channel:
        admin = FakeAdmin()
        admin.dedup = (False, "topic")
        mgr, _, _ = manager(admin=admin)
        return await opened(mgr, (TOPIC, -1, -1))

    assert run(go()).producer is not None


# -- waiting on a channel ----------------------------------------------------------------


def test_a_batch_behind_a_gap_wakes_for_the_hand_before_it_not_for_other_changes():
    async def go() -> list[str]:
        channel = Channel((TOPIC, 7, 0))
        woke: list[str] = []

        async def wait(name: str, after: int | None) -> None:
            woke.append(f"{name} {await channel.wait_change(5.0, after)}")

        tasks = [asyncio.create_task(wait("behind-14", 14)), asyncio.create_task(wait("any", None))]
        await asyncio.sleep(0)
        channel.settled(ok=True)  # a receipt: room changed, no sequence
        await asyncio.sleep(0)
        channel.handed(9)  # an earlier batch went, not the one just before
        await asyncio.sleep(0)
        assert woke == ["any True"]
        assert channel.waiters == 1
        channel.handed(14)
        await asyncio.gather(*tasks)
        return woke

    assert asyncio.run(go()) == ["any True", "behind-14 True"]


def test_notify_and_a_failed_receipt_wake_every_waiter():
    async def go() -> list[bool]:
        channel = Channel((TOPIC, 7, 0))
        waits = [asyncio.create_task(channel.wait_change(5.0, after)) for after in (4, 9, None)]
        await asyncio.sleep(0)
        channel.settled(ok=False)
        return list(await asyncio.gather(*waits))

    assert asyncio.run(go()) == [True, True, True]


def test_a_wait_that_expires_or_is_cancelled_leaves_nothing_behind():
    async def go() -> tuple[bool, int]:
        channel = Channel((TOPIC, 7, 0))
        expired = await channel.wait_change(0.01, 4)
        cancelled = asyncio.create_task(channel.wait_change(5.0, 9))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        listed = len(channel._any) + sum(map(len, channel._after.values()))
        return expired, channel.waiters + listed

    assert asyncio.run(go()) == (False, 0)


def test_a_moved_channel_closes_when_the_batch_its_caller_gave_up_on_settles():
    """Ownership moved while a batch was in Pulsar's hands and its caller had left on a
    timeout: the release closed nothing (a batch in flight), and the name stayed held,
    the new owner refused ProducerBusy, until the idle reaper (a 20-fault soak: a journal
    name held for a minute after its transaction-log partition moved)."""

    async def go() -> tuple[Channel, list[str]]:
        mgr, publisher, _ = manager()
        channel = await opened(mgr, (TOPIC, 7, 0))
        channel.state.in_flight = 1  # handed to Pulsar; its caller timed out and left
        mgr.release(channel)
        assert mgr.retire_moved(lambda key: key == (TOPIC, 7, 0)) == 0
        assert not channel.closed
        channel.state.in_flight = 0  # the receipt comes
        mgr.settled(channel, ok=True)
        await asyncio.sleep(0.05)
        return channel, publisher.log

    channel, log = run(go())
    assert channel.closed
    assert "closed kop-7-0" in log


def test_the_produce_services_receipt_callback_closes_a_moved_channel_it_emptied():
    from kop_dedup.produce.service import ProduceService

    async def go() -> Channel:
        mgr, _, _ = manager()
        channel = await opened(mgr, (TOPIC, 7, 0))
        channel.state.in_flight = 1
        mgr.release(channel)
        mgr.retire_moved(lambda key: True)
        receipt: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        receipt.set_result(object())
        ProduceService._settler(mgr, channel, None)(receipt)
        return channel

    assert run(go()).closed


# -- the bound on producers held -------------------------------------------------------


def test_past_the_bound_a_new_name_waits_for_the_least_recent_idle_close_never_more_held():
    """Every channel held by a batch used to be opened whatever the bound (it closed
    only idle ones): 10,240 names at once meant 10,240 producers."""

    async def go() -> tuple[list[str], int, Channel, Channel]:
        mgr, publisher, _ = manager(max_open=2)
        a = await mgr.acquire((TOPIC, 7, 0), "t", deadline())
        b = await mgr.acquire((TOPIC, 8, 0), "t", deadline())
        await mgr.ensure_open(a, deadline())
        await mgr.ensure_open(b, deadline())
        mgr.release(a)
        a.last_used, b.last_used = 1.0, 2.0
        mgr.release(b)  # both idle now, a the least recently used
        b.last_used = time.monotonic()
        await mgr.acquire((TOPIC, 9, 0), "t", deadline())
        assert mgr.held() <= 2  # leased only once a's close finished
        return publisher.log, mgr.peak_held, a, b

    log, peak, a, b = run(go())
    assert peak == 2
    assert a.closed
    assert not b.closed
    assert "closed kop-7-0" in log


def test_past_the_bound_with_every_channel_busy_a_batch_waits_then_gets_a_retriable_7():
    async def go() -> tuple[float, int]:
        mgr, _, _ = manager(max_open=1)
        await mgr.acquire((TOPIC, 7, 0), "t", deadline())  # held by a batch, never released
        started = time.monotonic()
        with pytest.raises(errors.RequestTimedOut, match="MAX_OPEN_PRODUCERS") as caught:
            await mgr.acquire((TOPIC, 8, 0), "t", time.monotonic() + 0.2)
        assert caught.value.retriable
        return time.monotonic() - started, mgr.held()

    waited, held = run(go())
    assert 0.15 < waited < 2
    assert held == 1


def test_batches_waiting_for_room_go_as_channels_fall_idle():
    async def go() -> tuple[list[int], int]:
        mgr, _, _ = manager(max_open=2)
        order: list[int] = []

        async def batch(pid: int) -> None:
            channel = await mgr.acquire((TOPIC, pid, 0), "t", deadline())
            await mgr.ensure_open(channel, deadline())
            await asyncio.sleep(0.02)
            order.append(pid)
            mgr.release(channel)

        await asyncio.gather(*(batch(pid) for pid in range(8)))
        return order, mgr.peak_held

    order, peak = run(go())
    assert sorted(order) == list(range(8))
    assert peak <= 2


def test_a_room_made_wakes_one_waiting_batch_not_every_one():
    """At the bound each close or idle channel makes room for one batch: waking every
    waiting batch for each (as before) made each decide again, O(waiting) per close
    and O(waiting x closes) in all; 10,240 names at a bound of 2,000 spent the sidecar's
    CPU on it. Every batch still gets its channel, in about the order it came."""

    async def go() -> tuple[list[int], int, int]:
        mgr, _, _ = manager(max_open=4)
        order: list[int] = []
        looks = 0
        held = mgr.held

        def counted() -> int:
            nonlocal looks
            looks += 1
            return held()

        mgr.held = counted  # type: ignore[method-assign]

        async def batch(pid: int) -> None:
            channel = await mgr.acquire((TOPIC, pid, 0), "t", deadline())
            await mgr.ensure_open(channel, deadline())
            await asyncio.sleep(0.001)
            order.append(pid)
            mgr.release(channel)

        await asyncio.gather(*(batch(pid) for pid in range(200)))
        return order, mgr.peak_held, looks

    order, peak, looks = run(go())
    assert sorted(order) == list(range(200))
    assert peak <= 4
    assert looks < 10 * 200, looks


def test_a_woken_batch_that_leaves_passes_its_turn_to_the_next():
    async def go() -> float:
        mgr, _, _ = manager(max_open=1)
        a = await mgr.acquire((TOPIC, 7, 0), "t", deadline())
        await mgr.ensure_open(a, deadline())
        first = asyncio.create_task(mgr.acquire((TOPIC, 8, 0), "t", deadline()))
        second = asyncio.create_task(mgr.acquire((TOPIC, 9, 0), "t", deadline()))
        await asyncio.sleep(0.05)  # both wait, first in line
        started = time.monotonic()
        mgr.release(a)  # room for one: the first is woken...
        first.cancel()  # ...and leaves before it looks
        channel = await second
        assert channel.key == (TOPIC, 9, 0)
        return time.monotonic() - started

    assert run(go()) < 2  # not its 5 s deadline
