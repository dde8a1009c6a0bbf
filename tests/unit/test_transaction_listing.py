"""ListTransactions' filters and DescribeTransactions' view of a transaction (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kop_dedup import errors
from kop_dedup.protocol import transaction_listing as listing
from kop_dedup.protocol.transaction_state import Partition, Transaction, TxnState


def _txn(tid: str, pid: int, state: TxnState, started: int = 0) -> Transaction:
    parts = (Partition("b", 1, None), Partition("a", 0, None), Partition("b", 0, None))
    return Transaction(tid, pid, 0, 60_000, state, partitions=parts, started_ms=started)


TXNS = [
    _txn("flink-0", 1, TxnState.ONGOING, started=1_000),
    _txn("flink-1", 2, TxnState.COMPLETE_COMMIT, started=5_000),
    _txn("other", 3, TxnState.EMPTY),
]


def _ids(filters: listing.Filters, now: int = 10_000) -> list[str]:
    return [t.transactional_id for t in listing.select(TXNS, filters, now)]


def test_state_filters_are_kafkas_names_case_sensitively():
    assert listing.unknown_states(["Ongoing", "ongoing", "Bogus", "Dead"]) == ["ongoing", "Bogus"]
    assert _ids(listing.Filters(states=frozenset({"Ongoing"}))) == ["flink-0"]
    assert _ids(listing.Filters(states=frozenset({"ongoing"}))) == []


def test_producer_id_duration_and_pattern_filters():
    assert _ids(listing.Filters()) == ["flink-0", "flink-1", "other"]
    assert _ids(listing.Filters(producer_ids=frozenset({2, 3}))) == ["flink-1", "other"]
    # running longer than 8 s: the open one started at 1 s; none open: no start (-1)
    assert _ids(listing.Filters(duration_ms=8_000)) == ["flink-0", "flink-1", "other"]
    assert _ids(listing.Filters(duration_ms=9_500)) == ["flink-1", "other"]
    assert _ids(listing.Filters(pattern="flink-.*")) == ["flink-0", "flink-1"]
    assert _ids(listing.Filters(pattern="flink")) == []  # the whole id must match


def test_a_pattern_that_does_not_compile_is_invalid_regular_expression():
    with pytest.raises(errors.InvalidRegularExpression):
        listing.select(TXNS, listing.Filters(pattern="(unclosed"), 0)


def test_an_open_transaction_shows_its_partitions_and_start_a_closed_one_neither():
    assert listing.topics_of(TXNS[0]) == {"b": [0, 1], "a": [0]}
    assert listing.start_time(TXNS[0]) == 1_000
    assert listing.topics_of(TXNS[1]) == {}
    assert listing.start_time(TXNS[1]) == -1


def test_a_commit_whose_copy_is_unresolved_shows_no_partitions_the_coordinator_expects():
    """DescribeTransactions names the partitions the coordinator still expects to
    complete: a commit being copied names them, one whose copy cannot complete as
    decided (``unresolved``) names none, so ``find-hanging`` reports it."""
    copying = _txn("c", 4, TxnState.PREPARE_COMMIT, started=1_000)
    assert listing.topics_of(copying) == {"b": [0, 1], "a": [0]}
    stuck = replace(copying, unresolved="the journal holds 2 of its 3 batches")
    assert listing.topics_of(stuck) == {}
    assert listing.start_time(stuck) == 1_000
