"""A read of a range of entries answers the whole range or raises.

The scan ended at the reader's "no more messages", an answer the client computes from
the broker's last message id (and says "no" when that id's entry is -1): a journal read
cut short copies part of a transaction, a look for an earlier copy cut short copies it
again. Now it reads by position to the end it was given. These tests drive the scan with
a reader that says "no more" early (the client's side; the broker's side of the copy
and its look are in test_transaction_limits.py and test_transaction_stream.py)."""

from __future__ import annotations

from typing import Any

import pulsar
import pytest

from kop_dedup.pulsar.entries import _scan


class _Id:
    def __init__(self, ledger: int, entry: int) -> None:
        self._l, self._e = ledger, entry

    def ledger_id(self) -> int:
        return self._l

    def entry_id(self) -> int:
        return self._e


class _Msg:
    def __init__(self, ledger: int, entry: int) -> None:
        self._id = _Id(ledger, entry)

    def message_id(self) -> _Id:
        return self._id

    def properties(self) -> dict[str, str]:
        return {}


class _Reader:
    """Messages at the given positions; its "more?" says no after ``stop_after`` of them
    (as the client does when the broker's last message id names an empty ledger)."""

    def __init__(self, positions: list[tuple[int, int]], stop_after: int | None = None) -> None:
        self._msgs = [_Msg(*p) for p in positions]
        self._stop = len(positions) if stop_after is None else stop_after
        self.read = 0

    def has_message_available(self) -> bool:
        return self.read < self._stop

    def read_next(self, _timeout_ms: int) -> Any:
        if self.read == len(self._msgs):
            raise pulsar.Timeout("nothing more")
        self.read += 1
        return self._msgs[self.read - 1]


def _run(reader: _Reader, after: tuple[int, int] | None, upto: tuple[int, int]) -> list[Any]:
    return _scan(reader, after, upto, lambda _p: False, "t", 0)


def test_a_reader_saying_no_more_before_the_end_is_read_on_to_the_end():
    # the broker's last message id names an empty ledger after a restart: the client
    # says "no more" at once, though ledger 5 holds the range
    reader = _Reader([(5, 0), (5, 1), (5, 2), (5, 3)], stop_after=0)
    assert _run(reader, None, (5, 3)) == []
    assert reader.read == 4


def test_a_range_that_cannot_be_reached_raises_for_the_caller_to_retry():
    with pytest.raises(pulsar.Timeout):
        _run(_Reader([(5, 0), (5, 1)]), None, (5, 3))


def test_the_last_entry_is_read_to_its_last_message_and_one_past_the_end_stops():
    batch_at_end = _Reader([(5, 0), (5, 1), (5, 1), (5, 1)])
    assert _run(batch_at_end, None, (5, 1)) == []
    assert batch_at_end.read == 4
    past = _Reader([(5, 0), (6, 0), (6, 1), (6, 2)])
    assert _run(past, (5, 0), (6, 0)) == []
    assert past.read == 3


def test_an_empty_range_reads_nothing_and_an_older_end_before_a_ledger_still_reads():
    nothing = _Reader([(5, 0)])
    assert _run(nothing, (5, 3), (5, 3)) == []
    assert nothing.read == 0
    # "(6, -1)": everything before ledger 6, as decisions of an older version name it
    older = _Reader([(5, 0), (5, 1), (6, 0)])
    assert _run(older, None, (6, -1)) == []
    assert older.read == 3
