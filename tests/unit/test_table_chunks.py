"""A keyed table reads in chunks on a worker thread: the chunk logic on a fake reader
(the real reader is read in tests/integration/test_tables.py)."""

from __future__ import annotations

from kop_dedup.pulsar.tables import _read_chunk


class FakeMessage:
    def __init__(self, index: int, key: str) -> None:
        self.index, self.key = index, key

    def partition_key(self) -> str:
        return self.key

    def data(self) -> bytes:
        return b"" if not self.key else b"1"

    def publish_timestamp(self) -> int:
        return 1000 + self.index

    def properties(self) -> dict[str, str]:
        return {}

    def message_id(self) -> int:
        return self.index


class FakeReader:
    """The blocking reader API over a list of keys ("" is a compacted-out slot)."""

    def __init__(self, keys: list[str]) -> None:
        self.messages = [FakeMessage(i, k) for i, k in enumerate(keys)]
        self.position = 0

    def read_next(self, timeout_ms: int) -> FakeMessage:
        msg = self.messages[self.position]
        self.position += 1
        return msg

    def has_message_available(self) -> bool:
        return self.position < len(self.messages)


def test_a_chunk_skips_keyless_slots_and_says_whether_more_is_there():
    reader = FakeReader(["a", "", "b", "", "c"])
    first = _read_chunk(reader, limit=3)
    assert [r.key for r in first.records] == ["a", "b"]
    assert (first.skipped, first.last, first.more) == (1, 2, True)
    second = _read_chunk(reader, limit=3)
    assert [r.key for r in second.records] == ["c"]
    assert (second.skipped, second.last, second.more) == (1, 4, False)
    assert second.records[0].publish_time_ms == 1004
