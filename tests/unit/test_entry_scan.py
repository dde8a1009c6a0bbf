"""A read of a range of entries answers the whole range or raises.

The scan ended at the reader's "no more messages", an answer the client computes from
the broker's last message id (and says "no" when that id's entry is -1): a journal read
cut short copied part of a transaction. Now it reads by position to the real entry it
was given (a receipt's: a batch's, or a journal barrier's). These tests drive the scan
with a reader that says "no more" early (the client's side; the broker's side is in
test_transaction_copies.py and test_transaction_stream.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pulsar
import pytest

from kop_dedup.pulsar.entries import PROP_BARRIER, _scan, read_batches


class _Id:
    def __init__(self, ledger: int, entry: int) -> None:
        self._l, self._e = ledger, entry

    def ledger_id(self) -> int:
        return self._l

    def entry_id(self) -> int:
        return self._e


class _Msg:
    def __init__(self, ledger: int, entry: int, properties: dict[str, str] | None = None) -> None:
        self._id = _Id(ledger, entry)
        self._properties = properties or {}

    def message_id(self) -> _Id:
        return self._id

    def properties(self) -> dict[str, str]:
        return self._properties


class _Reader:
    """Messages at the given positions; its "more?" says no after ``stop_after`` of them
    (as the client does when the broker's last message id names an empty ledger)."""

    def __init__(
        self,
        positions: list[tuple[int, int]],
        stop_after: int | None = None,
        barrier: tuple[int, int] | None = None,
    ) -> None:
        self._msgs = [_Msg(*p, {PROP_BARRIER: "x"} if p == barrier else None) for p in positions]
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


def test_an_empty_range_reads_nothing():
    nothing = _Reader([(5, 0)])
    assert _run(nothing, (5, 3), (5, 3)) == []
    assert nothing.read == 0


def test_a_barrier_at_the_end_ends_the_read_at_once():
    # a barrier is one message: nothing more is waited for after it (a batch entry at
    # the end is read to its last message, which costs a short wait for "nothing more")
    reader = _Reader([(5, 0), (5, 1), (5, 2), (6, 0)], barrier=(5, 2))
    assert _run(reader, None, (5, 2)) == []
    assert reader.read == 3


def test_an_end_with_entry_minus_one_is_refused():
    # "before ledger 6": what a lookup answers for a ledger still empty; a read cannot
    # reach it, so it is never an end
    with pytest.raises(ValueError, match="real entry"):
        asyncio.run(
            read_batches(
                None,  # type: ignore[arg-type]
                "t",
                after=None,
                upto=(6, -1),
                topic_name="t",
                partition=0,
                select=lambda _p: True,
            )
        )
