"""An operator's abort marker for one partition, as pure data
(:func:`kop_dedup.protocol.transaction_markers.abort_marker`), and the dropped partition
it leaves kept by the transaction log's records."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kop_dedup import errors
from kop_dedup.coordination.transactions.log import decode, encode
from kop_dedup.protocol import transaction_listing as listing
from kop_dedup.protocol.transaction_markers import abort_marker
from kop_dedup.protocol.transaction_state import Partition, Transaction, TxnState
from kop_dedup.protocol.transactions import unresolved

PARTS = (Partition("t", 0, None), Partition("u", 1, None))
COPYING = Transaction("app", 7, 3, 60_000, TxnState.PREPARE_COMMIT, ordinal=2, partitions=PARTS)
STUCK = replace(COPYING, unresolved="the journal holds 2 of its 3 batches")


def test_an_abort_marker_drops_the_partition_of_a_commit_whose_copy_cannot_complete():
    after = abort_marker(STUCK, 7, 3, "t", 0)
    assert [(p.key, p.dropped) for p in after.partitions] == [(("t", 0), True), (("u", 1), False)]
    assert after.state is TxnState.PREPARE_COMMIT  # the rest is still copied
    assert listing.topics_of(replace(after, unresolved=None)) == {"u": [1]}
    assert abort_marker(after, 7, 3, "t", 0) is after  # again: nothing more to do


def test_only_the_partitions_whose_copy_cannot_complete_are_stuck_and_may_be_aborted():
    named = unresolved(COPYING, "the journal of t-0 holds 2 of its 3 batches", (("t", 0),))
    assert [named.stuck(p) for p in named.partitions] == [True, False]
    assert listing.topics_of(named) == {"u": [1]}  # find-hanging names t-0 only
    with pytest.raises(errors.ConcurrentTransactions):
        abort_marker(named, 7, 3, "u", 1)
    after = abort_marker(named, 7, 3, "t", 0)
    assert [p.dropped for p in after.partitions] == [True, False]
    assert listing.topics_of(after) == {"u": [1]}
    # a record that names no partition (written before they were named): all are stuck
    assert [STUCK.stuck(p) for p in STUCK.partitions] == [True, True]
    assert decode(encode(named)) == named


def test_an_abort_marker_is_refused_while_the_copy_is_expected_to_complete():
    with pytest.raises(errors.ConcurrentTransactions):
        abort_marker(COPYING, 7, 3, "t", 0)
    ongoing = replace(COPYING, state=TxnState.ONGOING)
    with pytest.raises(errors.ConcurrentTransactions):
        abort_marker(ongoing, 7, 3, "t", 0)
    assert abort_marker(ongoing, 7, 3, "elsewhere", 0) is ongoing


def test_an_abort_marker_of_an_older_epoch_is_47_and_of_another_producer_does_nothing():
    with pytest.raises(errors.InvalidProducerEpoch):
        abort_marker(STUCK, 7, 2, "t", 0)
    assert abort_marker(STUCK, 8, 3, "t", 0) is STUCK
    assert abort_marker(STUCK, 7, 4, "t", 0) is STUCK  # no transaction of that epoch here
    done = replace(STUCK, state=TxnState.COMPLETE_COMMIT, unresolved=None)
    assert abort_marker(done, 7, 3, "t", 0) is done


def test_a_dropped_partition_survives_the_transaction_log():
    after = abort_marker(STUCK, 7, 3, "u", 1)
    assert decode(encode(after)) == after
    assert decode(encode(STUCK)) == STUCK
    assert b"dropped" not in encode(STUCK)  # records without a drop are unchanged
