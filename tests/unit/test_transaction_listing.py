"""ListTransactions' filters and DescribeTransactions' view of a transaction (pure)."""

from __future__ import annotations

import time
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


def test_a_pathological_pattern_is_matched_in_linear_time():
    # (a+)+b backtracks 2^n steps on a backtracking engine: about 2 s at 26 characters,
    # doubling with each one; the listener matches on its event loop
    for n in (26, 1_000, 100_000):
        started = time.perf_counter()
        chosen = listing.select(
            [_txn("a" * n, n, TxnState.EMPTY)], listing.Filters(pattern="(a+)+b"), 0
        )
        assert chosen == []
        assert time.perf_counter() - started < 0.25, f"{n} characters"
    assert _ids(listing.Filters(pattern="(fl+)+ink-[0-9]")) == ["flink-0", "flink-1"]


@pytest.mark.parametrize(
    "pattern",
    [
        "(?<=flink-)0",  # lookbehind
        "(?=f)flink-0",  # lookahead
        "(f)lin\\1",  # a backreference
        "flink-0++",  # possessive
        "(?>flink)-0",  # atomic group
        "[a-z&&[^b]]+-0",  # Java's class intersection: RE2 would read && literally
        "[a[f]]link-0",  # Java's class union
    ],
)
def test_java_syntax_the_linear_matcher_cannot_run_is_invalid_request(pattern):
    with pytest.raises(errors.InvalidRequest, match="RE2"):
        listing.select(TXNS, listing.Filters(pattern=pattern), 0)


def test_java_syntax_the_linear_matcher_runs_as_java_does():
    assert _ids(listing.Filters(pattern="\\p{Ll}+-\\d")) == ["flink-0", "flink-1"]
    assert _ids(listing.Filters(pattern="\\Qflink-\\E[0]")) == ["flink-0"]
    assert _ids(listing.Filters(pattern="[]a-z]+")) == ["other"]
    assert _ids(listing.Filters(pattern="(?i)FLINK-1")) == ["flink-1"]


def test_a_pattern_one_past_the_length_cap_or_compiling_too_large_is_invalid_request():
    at_cap = "a" * listing.MAX_PATTERN_CHARS
    assert listing.compile_pattern(at_cap).fullmatch(at_cap) is not None
    with pytest.raises(errors.InvalidRequest, match=str(listing.MAX_PATTERN_CHARS)):
        listing.compile_pattern(at_cap + "a")
    started = time.perf_counter()
    with pytest.raises(errors.InvalidRequest, match="too large"):
        listing.compile_pattern("x{1000}" * 585)  # 585,000 instructions: past the memory cap
    assert time.perf_counter() - started < 1.0


def test_a_commit_whose_copy_is_unresolved_shows_no_partitions_the_coordinator_expects():
    """DescribeTransactions names the partitions the coordinator still expects to
    complete: a commit being copied names them, one whose copy cannot complete as
    decided (``unresolved``) names none, so ``find-hanging`` reports it."""
    copying = _txn("c", 4, TxnState.PREPARE_COMMIT, started=1_000)
    assert listing.topics_of(copying) == {"b": [0, 1], "a": [0]}
    stuck = replace(copying, unresolved="the journal holds 2 of its 3 batches")
    assert listing.topics_of(stuck) == {}
    assert listing.start_time(stuck) == 1_000
