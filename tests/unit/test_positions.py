"""Offsets from the entry index: the earliest offset when the first message arrives
between the admin calls (a fake admin answers in the order of the race)."""

from __future__ import annotations

import asyncio
from typing import Any

from kop_dedup.pulsar.positions import Positions


class _FirstMessageArrivesMidway:
    """An empty partition that gets its first message (an entry of 3) right after the
    first ``first_entry`` question."""

    def __init__(self, *, trimmed: bool = False) -> None:
        self.asked_first = 0
        self.trimmed = trimmed

    async def first_entry(self, topic: str) -> Any:
        self.asked_first += 1
        if self.asked_first == 1 or self.trimmed:
            return None
        return (7, 0, (2, 3))

    async def last_position(self, topic: str) -> Any:
        return (7, 0)

    async def entry_index(self, topic: str, ledger: int, entry: int) -> Any:
        return (2, 3)


def test_earliest_of_a_partition_getting_its_first_message_starts_at_that_message() -> None:
    admin = _FirstMessageArrivesMidway()
    offset, position = asyncio.run(Positions(admin).earliest("t"))  # type: ignore[arg-type]
    assert (offset, position) == (0, (7, 0, 0))


def test_earliest_of_a_partition_with_everything_deleted_is_its_end() -> None:
    admin = _FirstMessageArrivesMidway(trimmed=True)
    offset, position = asyncio.run(Positions(admin).earliest("t"))  # type: ignore[arg-type]
    assert (offset, position) == (3, (7, 0, 3))


class _CountingAdmin:
    def __init__(self) -> None:
        self.index_calls = 0

    async def last_position(self, topic: str) -> Any:
        return (9, 4)

    async def entry_index(self, topic: str, ledger: int, entry: int) -> Any:
        self.index_calls += 1
        return (41, 2)


def test_end_of_a_partition_nothing_was_written_to_since_asks_for_its_entry_index_once() -> None:
    admin = _CountingAdmin()
    positions = Positions(admin)  # type: ignore[arg-type]

    async def twice() -> list[Any]:
        return [await positions.end("t"), await positions.end("t")]

    assert asyncio.run(twice()) == [(42, (9, 4, 2)), (42, (9, 4, 2))]
    assert admin.index_calls == 1


class _Ledger:
    """One ledger (7) of ``entries`` entries of 10 messages each; counts index lookups."""

    def __init__(self, entries: int) -> None:
        self.entries, self.index_calls = entries, 0

    async def first_entry(self, topic: str) -> Any:
        return (7, 0, (9, 10))

    async def last_position(self, topic: str) -> Any:
        return (7, self.entries - 1)

    async def ledgers(self, topic: str) -> list[tuple[int, int]]:
        return [(7, self.entries)]

    async def entry_index(self, topic: str, ledger: int, entry: int) -> Any:
        self.index_calls += 1
        return (10 * entry + 9, 10)


def test_an_offset_in_entries_a_reader_learnt_is_located_without_an_index_lookup() -> None:
    """A Kafka group's commit moves its subscription to the committed offset: looking it
    up searched the broker's index (one admin call per step of a binary search) even
    for records the sidecar had just served."""
    admin = _Ledger(entries=1000)
    positions = Positions(admin)  # type: ignore[arg-type]
    asyncio.run(positions.end("t"))  # the end, as a fetch learns it
    asked = admin.index_calls
    for entry in range(1000):  # what an EntryReader counted, reading the topic
        positions.learn("t", 7, entry, 10 * entry + 9, 10)
    assert asyncio.run(positions.locate("t", 4321)) == (7, 432, 1)
    assert admin.index_calls == asked
    # an entry nobody read is asked for, as before
    cold = Positions(admin)  # type: ignore[arg-type]
    assert asyncio.run(cold.locate("t", 4321)) == (7, 432, 1)
    assert admin.index_calls > asked + 5
