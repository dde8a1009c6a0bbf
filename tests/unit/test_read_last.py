"""``read_last`` (the claim of a producer-id block reads the topic's last message)
replaces a reader whose connection dropped while it positioned itself, once, as a
keyed table's catch-up does: the C++ client reports "Failed to seek:
ResultDisconnected" then, and an init-producer-id that needed a new block answered 6
for it (seen in CI). The retry logic on a fake client; the real reader is read in
tests/integration/test_tables.py and by every init of the integration suite."""

from __future__ import annotations

import asyncio
from typing import Any

import pulsar
import pytest
from pulsar import asyncio as pulsar_async

from kop_dedup.pulsar.tables import read_last


class _Message:
    def partition_key(self) -> str:
        return ""

    def data(self) -> bytes:
        return b"41"

    def publish_timestamp(self) -> int:
        return 1

    def properties(self) -> dict[str, str]:
        return {}

    def message_id(self) -> int:
        return 7


class _Reader:
    def __init__(self, fails: bool) -> None:
        self.fails, self.closed = fails, False

    async def has_message_available(self) -> bool:
        if self.fails:
            raise pulsar_async.PulsarException(pulsar.Result.NotConnected)
        return True

    async def read_next(self) -> _Message:
        return _Message()

    async def close(self) -> None:
        self.closed = True


class _Client:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.readers: list[_Reader] = []

    async def create_reader(self, topic: str, start: Any, **_: Any) -> _Reader:
        reader = _Reader(fails=len(self.readers) < self.failures)
        self.readers.append(reader)
        return reader


def test_a_reader_disconnected_while_it_seeks_is_replaced_once() -> None:
    client = _Client(failures=1)
    record = asyncio.run(read_last(client, "blocks"))  # type: ignore[arg-type]
    assert record is not None
    assert record.value == b"41"
    assert len(client.readers) == 2
    assert all(r.closed for r in client.readers)


def test_a_second_failure_is_the_callers() -> None:
    client = _Client(failures=2)
    with pytest.raises(pulsar_async.PulsarException):
        asyncio.run(read_last(client, "blocks"))  # type: ignore[arg-type]
    assert len(client.readers) == 2
    assert all(r.closed for r in client.readers)
