"""Base offsets of produced batches: derived from the entry before when known, else asked."""

from __future__ import annotations

import asyncio

import pytest

from kop_dedup.pulsar.produced import ProducedOffsets
from kop_dedup.settings import Settings, split_address


class Broker:
    """Entry (ledger, entry) holds ``sizes[(ledger, entry)]`` messages; indexes count up
    over ledgers in order."""

    def __init__(self, sizes: dict[tuple[int, int], int]) -> None:
        self.asked: list[tuple[int, int]] = []
        self.index: dict[tuple[int, int], int] = {}
        total = -1
        for key in sorted(sizes):
            total += sizes[key]
            self.index[key] = total
        self.fail = False

    async def entry_index(self, topic: str, ledger: int, entry: int) -> tuple[int, int] | None:
        self.asked.append((ledger, entry))
        if self.fail:
            raise OSError("admin unreachable")
        return self.index[ledger, entry], 0


def _run(offsets: ProducedOffsets, batches: list[tuple[str | None, int]]) -> list[int]:
    async def main() -> list[int]:
        return [await offsets.base_offset("t", mid, n) for mid, n in batches]

    return asyncio.run(main())


def test_one_lookup_then_every_following_entry_is_derived():
    broker = Broker({(5, 0): 3, (5, 1): 10, (5, 2): 1, (5, 3): 4})
    offsets = ProducedOffsets(broker)  # type: ignore[arg-type]
    got = _run(offsets, [("5:0:0:0", 3), ("5:1:0:0", 10), ("5:2:0:0", 1), ("5:3:0:0", 4)])
    assert got == [0, 3, 13, 14]
    assert broker.asked == [(5, 0)]
    assert (offsets.looked_up, offsets.derived) == (1, 3)


def test_another_writers_entry_or_a_new_ledger_costs_a_lookup():
    broker = Broker({(5, 0): 2, (5, 1): 7, (5, 2): 2, (9, 0): 5})
    offsets = ProducedOffsets(broker)  # type: ignore[arg-type]
    # (5, 1) was written by someone else: (5, 2) cannot be derived; (9, 0) starts a ledger
    got = _run(offsets, [("5:0:0:0", 2), ("5:2:0:0", 2), ("9:0:0:0", 5)])
    assert got == [0, 9, 11]
    assert broker.asked == [(5, 0), (5, 2), (9, 0)]


def test_a_failed_lookup_answers_minus_one_and_never_raises():
    broker = Broker({(5, 0): 2})
    broker.fail = True
    offsets = ProducedOffsets(broker)  # type: ignore[arg-type]
    assert _run(offsets, [("5:0:0:0", 2), (None, 1), ("garbage", 1)]) == [-1, -1, -1]


@pytest.mark.parametrize(
    ("mode", "asked", "answers"), [("none", 0, [-1, -1]), ("lookup", 2, [0, 2])]
)
def test_the_other_modes(mode, asked, answers):
    broker = Broker({(5, 0): 2, (5, 1): 2})
    offsets = ProducedOffsets(broker, mode=mode)  # type: ignore[arg-type]
    assert _run(offsets, [("5:0:0:0", 2), ("5:1:0:0", 2)]) == answers
    assert len(broker.asked) == asked


def test_listener_addresses_parse_and_an_empty_listener_is_off():
    assert split_address("[::1]:9093") == ("::1", 9093)
    assert Settings(kafka_listener="0.0.0.0:0").kafka_address() == ("0.0.0.0", 0)
    assert Settings(kafka_listener="").kafka_address() is None
    with pytest.raises(ValueError, match="host:port"):
        Settings(kafka_advertised="nohost")
    with pytest.raises(ValueError, match="together"):
        Settings(kafka_tls_cert="/tmp/c.pem")


def test_an_answer_that_overtakes_the_entry_before_waits_for_it_instead_of_asking():
    """Several producers on one partition: the receipt of entry 2 can come back before
    the one of entry 1 (both ours). Entry 2 used to ask the broker (an admin round trip
    on the produce answer's path); it now waits for entry 1's answer and derives."""
    broker = Broker({(5, 0): 2, (5, 1): 3, (5, 2): 4})
    offsets = ProducedOffsets(broker, wait_s=5.0)  # type: ignore[arg-type]

    async def main() -> list[int]:
        first = await offsets.base_offset("t", "5:0:0:0", 2)
        later = asyncio.ensure_future(offsets.base_offset("t", "5:2:0:0", 4))
        await asyncio.sleep(0.01)  # entry 2's answer is waiting for entry 1's
        assert not later.done()
        return [first, await offsets.base_offset("t", "5:1:0:0", 3), await later]

    assert asyncio.run(main()) == [0, 2, 5]
    assert broker.asked == [(5, 0)]
    assert (offsets.looked_up, offsets.derived) == (1, 2)


def test_an_entry_before_that_never_answers_is_asked_after_the_wait():
    broker = Broker({(5, 0): 2, (5, 1): 3})
    offsets = ProducedOffsets(broker, wait_s=0.01)  # type: ignore[arg-type]
    assert _run(offsets, [("5:1:0:0", 3)]) == [2]
    assert broker.asked == [(5, 1)]


class Ends(Broker):
    """A broker that also says where a topic ends (its last entry), as the admin API."""

    def __init__(self, sizes: dict[tuple[int, int], int]) -> None:
        super().__init__(sizes)
        self.last: tuple[int, int] | None = max(sizes) if sizes else None
        self.ends_asked = 0

    async def last_position(self, topic: str) -> tuple[int, int] | None:
        self.ends_asked += 1
        return self.last

    async def first_entry(self, topic: str) -> None:
        return None


def test_a_transactions_floor_is_the_partitions_end_never_above_it_and_never_waited_for():
    """A batch in a transaction lands once its transaction is copied, after everything
    the partition holds: its floor is the end as last known, 0 before anything is known
    (the answer never waits on the broker), the broker's end once asked, and what this
    sidecar's own receipts show in between."""
    broker = Ends({(5, 0): 3, (5, 1): 10})

    async def main() -> list[int]:
        offsets = ProducedOffsets(broker)  # type: ignore[arg-type]
        seen = [offsets.floor("t")]  # nothing known yet: 0, and the broker is asked
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        seen.append(offsets.floor("t"))  # the end: 13
        broker.index[5, 2] = 13 + 4 - 1
        seen.append(await offsets.base_offset("t", "5:2:0:0", 4))  # an idempotent batch: 13
        seen.append(offsets.floor("t"))  # known from its receipt: 17, nothing asked
        return seen

    assert asyncio.run(main()) == [0, 13, 13, 17]
    assert broker.ends_asked == 1


def test_the_brokers_end_replaces_a_floor_once_a_second_so_a_topic_made_again_starts_over(
    monkeypatch: pytest.MonkeyPatch,
):
    from kop_dedup.pulsar import produced

    monkeypatch.setattr(produced, "_END_REFRESH_S", 0.0)
    broker = Ends({(5, 0): 3, (5, 1): 10})

    async def main() -> list[int]:
        offsets = ProducedOffsets(broker)  # type: ignore[arg-type]
        offsets.floor("t")
        for _ in range(3):
            await asyncio.sleep(0)
        before = offsets.floor("t")
        broker.index = {(8, 0): 0}  # deleted and made again: one record (index 0)
        broker.last = (8, 0)
        for _ in range(3):
            await asyncio.sleep(0)
        return [before, offsets.floor("t")]

    assert asyncio.run(main()) == [13, 1]


def test_entries_answered_together_wait_for_the_one_lookup_before_them():
    """20 producers' first batches on a fresh partition are answered at once: the
    first entry asks the broker (slower than the 20 ms an answer waits for the entry
    before it), the 19 after it wait for that lookup and derive from it, not ask too
    (each asked before: 20 lookups per partition, 10,240 at 512 x 20, the whole warm-up
    of a wide produce queued behind the admin API)."""

    class Slow(Broker):
        async def entry_index(self, topic: str, ledger: int, entry: int) -> tuple[int, int] | None:
            await asyncio.sleep(0.2)
            return await super().entry_index(topic, ledger, entry)

    broker = Slow({(5, e): 1 for e in range(20)})
    offsets = ProducedOffsets(broker)  # type: ignore[arg-type]

    async def main() -> list[int]:
        return await asyncio.gather(*(offsets.base_offset("t", f"5:{e}:0:0", 1) for e in range(20)))

    assert asyncio.run(main()) == list(range(20))
    assert broker.asked == [(5, 0)]
    assert (offsets.looked_up, offsets.derived) == (1, 19)


def test_an_entry_pushed_out_of_the_kept_indexes_while_looked_up_is_answered_to_its_retry(
    monkeypatch,
):
    """The kept indexes are bounded (``_KEPT``). An entry whose lookup is under way when
    later entries push it out: a retry of the same batch (a duplicate, answered with its
    original offset) waited on a new placeholder that nothing resolved, since the lookup
    in flight resolves the one it started with; it never got an answer."""
    from kop_dedup.pulsar import produced

    monkeypatch.setattr(produced, "_KEPT", 4)
    sizes = {(7, e): 1 for e in range(10)} | {(5, 0): 3}
    broker = Broker(sizes)
    stalled = asyncio.Event()
    entry_index = broker.entry_index

    async def slow_for_5_0(topic: str, ledger: int, entry: int) -> tuple[int, int] | None:
        if (ledger, entry) == (5, 0):
            await stalled.wait()
        return await entry_index(topic, ledger, entry)

    broker.entry_index = slow_for_5_0  # type: ignore[method-assign]
    offsets = ProducedOffsets(broker)  # type: ignore[arg-type]

    async def main() -> tuple[int, int]:
        first = asyncio.ensure_future(offsets.base_offset("t", "5:0:0:0", 3))
        await asyncio.sleep(0)  # its lookup is under way
        for e in range(10):  # later entries push (5, 0) out of the kept indexes
            await offsets.base_offset("t", f"7:{e}:0:0", 1)
        retry = asyncio.ensure_future(offsets.base_offset("t", "5:0:0:0", 3))
        await asyncio.sleep(0)
        stalled.set()
        return await asyncio.wait_for(first, 5), await asyncio.wait_for(retry, 5)

    assert asyncio.run(main()) == (0, 0)
