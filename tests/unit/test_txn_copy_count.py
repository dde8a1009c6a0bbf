"""What a commit decision records for its copy (the batch count, a real end), how batches
are counted (once each), and the copy's identity (pure rules; the broker's side is in
tests/integration/test_transaction_copy_identity.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kop_dedup import errors
from kop_dedup.coordination.transactions.copier import copy_sequence_id
from kop_dedup.coordination.transactions.copy_source import distinct
from kop_dedup.coordination.transactions.log import decode, encode
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.protocol.transactions import (
    Partition,
    PartitionEnd,
    Transaction,
    TxnState,
    complete,
    join,
    prepare,
    unresolved,
)


def batch(pid: int, seq: int, n: int = 1) -> KafkaBatch:
    return KafkaBatch("t", 0, pid, 0, seq, seq + n - 1, tuple(rec(b"x") for _ in range(n)))


def ongoing() -> Transaction:
    t = Transaction("app", producer_id=7, producer_epoch=0, timeout_ms=60_000)
    return join(t, 7, 0, Partition("orders", 0, "3:1", journaler="me"), now_ms=10)


def test_a_batch_journaled_twice_is_counted_once_at_its_first_place():
    journal = [((5, 4), batch(7, 2)), ((5, 1), batch(7, 0, 2)), ((5, 3), batch(7, 0, 2))]
    assert [(b.producer_id, b.base_sequence) for b in distinct(journal)] == [(7, 0), (7, 2)]


def test_batches_of_two_producers_with_the_same_sequences_are_two_batches():
    assert len(distinct([((5, 0), batch(7, 0)), ((5, 1), batch(8, 0))])) == 2


def test_a_commit_records_each_partitions_count_and_end_and_an_abort_none():
    decided = prepare(ongoing(), True, {("orders", 0): PartitionEnd("4:2", "9:0", 3)}, now_ms=20)
    [part] = decided.partitions
    assert (part.journal_end, part.data_start, part.batches) == ("4:2", "9:0", 3)
    [aborted] = prepare(ongoing(), False, {}, now_ms=20).partitions
    assert (aborted.journal_end, aborted.batches) == (None, None)


def test_the_count_and_the_reason_a_copy_is_unresolved_survive_the_log():
    decided = prepare(ongoing(), True, {("orders", 0): PartitionEnd("4:2", None, 3)}, now_ms=20)
    stuck = unresolved(decided, "the journal holds 2 of 3")
    again = decode(encode(stuck))
    assert again.partitions[0].batches == 3
    assert again.unresolved == "the journal holds 2 of 3"


def test_a_decision_written_before_the_count_reads_as_unknown():
    doc = json.loads(encode(prepare(ongoing(), True, {}, now_ms=20)))
    for p in doc["partitions"]:
        del p["batches"]
    del doc["unresolved"]
    old = decode(json.dumps(doc).encode())
    assert old.partitions[0].batches is None
    assert old.unresolved is None


def test_an_unresolved_copy_keeps_the_decisions_time_and_is_cleared_once_complete():
    decided = prepare(ongoing(), True, {("orders", 0): PartitionEnd("4:2", None, 3)}, now_ms=20)
    stuck = unresolved(decided, "why")
    assert stuck.updated_ms == decided.updated_ms  # a recovery orders decisions by it
    assert complete(stuck, now_ms=30).unresolved is None
    with pytest.raises(errors.InvalidTxnState):
        unresolved(replace(decided, state=TxnState.COMPLETE_COMMIT), "why")


def test_copy_sequence_ids_are_distinct_per_batch_and_grow_across_a_names_transactions():
    ids = [copy_sequence_id(o, i) for o in (1, 2) for i in range(3)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 6
    assert copy_sequence_id(1, 0) > 0  # the client ignores a sequence id of 0
