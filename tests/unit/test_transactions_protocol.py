"""The transaction state machine (Kafka's TransactionMetadata rules) as pure data."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.protocol.records import MAX_EPOCH
from kop_dedup.protocol.transaction_state import HISTORY, PartitionEnd
from kop_dedup.protocol.transactions import (
    EndCheck,
    Offset,
    Partition,
    Transaction,
    TxnState,
    check_end,
    complete,
    fence,
    init,
    join,
    prepare,
    producer_problem,
    stage_offsets,
    timed_out,
)


def fresh() -> Transaction:
    return init(None, "app", timeout_ms=1000, check_back_url=None, now_ms=0, new_producer_id=7)


def ongoing(*partitions: tuple[str, int], now_ms: int = 100) -> Transaction:
    t = fresh()
    for topic, partition in partitions or (("orders", 0),):
        t = join(t, 7, 0, Partition(topic, partition, None), now_ms=now_ms)
    return t


def test_a_new_transactional_id_gets_a_new_producer_id_at_epoch_zero():
    t = fresh()
    assert (t.producer_id, t.producer_epoch, t.state, t.ordinal) == (7, 0, TxnState.EMPTY, 0)


def test_init_bumps_the_epoch_and_past_32767_moves_to_a_new_producer_id():
    again = init(
        fresh(), "app", timeout_ms=5, check_back_url="http://x", now_ms=1, new_producer_id=None
    )
    assert (again.producer_id, again.producer_epoch, again.timeout_ms) == (7, 1, 5)
    top = Transaction("app", 7, MAX_EPOCH, 1000)
    moved = init(top, "app", timeout_ms=5, check_back_url=None, now_ms=1, new_producer_id=8)
    assert (moved.producer_id, moved.producer_epoch) == (8, 0)


def test_the_first_batch_starts_a_transaction_and_new_partitions_join_it():
    t = ongoing(("orders", 0), ("orders", 1), ("orders", 0))
    assert t.state is TxnState.ONGOING
    assert t.ordinal == 1
    assert [p.key for p in t.partitions] == [("orders", 0), ("orders", 1)]
    assert t.started_ms == 100


@pytest.mark.parametrize(
    ("pid", "epoch", "code"),
    [(8, 0, errors.InvalidProducerIdMapping), (7, 1, errors.InvalidProducerEpoch)],
)
def test_produce_with_another_producer_id_or_epoch_is_refused(pid, epoch, code):
    with pytest.raises(code):
        join(fresh(), pid, epoch, Partition("t", 0, None), now_ms=1)


def test_transaction_calls_at_an_old_epoch_are_producer_fenced():
    t = fence(ongoing(), now_ms=5)
    with pytest.raises(errors.ProducerFenced):
        check_end(t, 7, 0, commit=True)
    with pytest.raises(errors.ProducerFenced):
        stage_offsets(t, 7, 0, [], now_ms=6)


def test_init_while_ongoing_or_deciding_is_concurrent_transactions():
    for t in (ongoing(), prepare(ongoing(), True, {}, now_ms=2)):
        with pytest.raises(errors.ConcurrentTransactions):
            init(t, "app", timeout_ms=1, check_back_url=None, now_ms=3, new_producer_id=None)


def test_fencing_an_ongoing_transaction_bumps_the_epoch_and_ends_in_abort():
    t = fence(ongoing(), now_ms=5)
    assert (t.state, t.producer_epoch) == (TxnState.PREPARE_EPOCH_FENCE, 1)
    done = complete(prepare(t, False, {}, now_ms=6), now_ms=7)
    assert done.state is TxnState.COMPLETE_ABORT
    retry = init(done, "app", timeout_ms=1, check_back_url=None, now_ms=8, new_producer_id=None)
    assert retry.producer_epoch == 2


def test_end_txn_decides_once_and_a_retry_of_the_same_decision_answers_done():
    t = ongoing()
    assert check_end(t, 7, 0, commit=True) is EndCheck.PROCEED
    decided = prepare(t, True, {("orders", 0): PartitionEnd("1:2", "3:4", 5)}, now_ms=200)
    assert decided.state is TxnState.PREPARE_COMMIT
    assert decided.partitions[0].journal_end == "1:2"
    assert decided.partitions[0].batches == 5
    with pytest.raises(errors.ConcurrentTransactions):
        check_end(decided, 7, 0, commit=True)
    with pytest.raises(errors.InvalidTxnState):
        check_end(decided, 7, 0, commit=False)
    done = complete(decided, now_ms=300)
    assert check_end(done, 7, 0, commit=True) is EndCheck.DONE
    with pytest.raises(errors.InvalidTxnState):
        check_end(done, 7, 0, commit=False)


def test_end_txn_with_nothing_open_is_invalid_txn_state():
    with pytest.raises(errors.InvalidTxnState):
        check_end(fresh(), 7, 0, commit=True)


def test_the_next_transaction_starts_after_the_last_completed():
    done = complete(prepare(ongoing(), True, {}, now_ms=2), now_ms=3)
    nxt = join(done, 7, 0, Partition("other", 3, "x"), now_ms=10)
    assert (nxt.state, nxt.ordinal, [p.key for p in nxt.partitions]) == (
        TxnState.ONGOING,
        2,
        [("other", 3)],
    )
    assert nxt.started_ms == 10


def test_produce_while_a_decision_is_applied_must_wait():
    with pytest.raises(errors.ConcurrentTransactions):
        join(prepare(ongoing(), True, {}, now_ms=2), 7, 0, Partition("t", 0, None), now_ms=3)


def test_staged_offsets_keep_the_latest_per_partition_and_start_a_transaction():
    t = stage_offsets(fresh(), 7, 0, [Offset("g", "t", 0, 5), Offset("g", "t", 1, 9)], now_ms=4)
    t = stage_offsets(t, 7, 0, [Offset("g", "t", 0, 8)], now_ms=5)
    assert t.state is TxnState.ONGOING
    assert sorted((o.partition, o.offset) for o in t.offsets) == [(0, 8), (1, 9)]


def test_a_transaction_times_out_after_its_timeout_from_its_start():
    t = ongoing(now_ms=100)
    assert not timed_out(t, 1099)
    assert timed_out(t, 1100)
    assert not timed_out(complete(prepare(t, False, {}, now_ms=1), now_ms=2), 10_000)


def test_an_init_naming_the_current_epoch_bumps_it_and_remembers_the_one_it_replaced():
    """KIP-360 (Kafka's prepareIncrementProducerEpoch with an expected epoch)."""
    t = fresh()
    bumped = init(
        t, "app", timeout_ms=5, check_back_url=None, now_ms=1, new_producer_id=None, expected=(7, 0)
    )
    assert (bumped.producer_epoch, bumped.last_producer_epoch) == (1, 0)
    retried = init(
        bumped,
        "app",
        timeout_ms=5,
        check_back_url=None,
        now_ms=2,
        new_producer_id=None,
        expected=(7, 0),
    )
    assert (retried.producer_id, retried.producer_epoch) == (7, 1)
    plain = init(bumped, "app", timeout_ms=5, check_back_url=None, now_ms=3, new_producer_id=None)
    assert (plain.producer_epoch, plain.last_producer_epoch) == (2, -1)
    for stale in ((7, 0), (7, 9), (8, 2)):
        with pytest.raises(errors.ProducerFenced):
            init(
                plain,
                "app",
                timeout_ms=5,
                check_back_url=None,
                now_ms=4,
                new_producer_id=None,
                expected=stale,
            )


def test_a_fence_forgets_the_replaced_epoch_so_the_fenced_producer_cannot_retry_in():
    running = ongoing()
    bumped = init(
        complete(prepare(running, True, {}, now_ms=1), now_ms=2),
        "app",
        timeout_ms=5,
        check_back_url=None,
        now_ms=3,
        new_producer_id=None,
        expected=(7, 0),
    )
    fenced = fence(join(bumped, 7, 1, Partition("orders", 0, None), now_ms=4), now_ms=5)
    assert fenced.last_producer_epoch == -1


def test_the_epoch_is_exhausted_at_short_max_minus_one_so_a_fence_can_always_bump_it():
    """Kafka (TransactionMetadata.isEpochExhausted): an epoch >= 32766 is exhausted, the
    next init moves to a new producer id; epoch 32767 is never handed out, so fencing a
    producer at 32766 still raises its epoch."""
    below = Transaction("app", 7, MAX_EPOCH - 2, 1000)
    last = init(below, "app", timeout_ms=5, check_back_url=None, now_ms=1, new_producer_id=None)
    assert (last.producer_id, last.producer_epoch) == (7, MAX_EPOCH - 1)
    moved = init(last, "app", timeout_ms=5, check_back_url=None, now_ms=2, new_producer_id=8)
    assert (moved.producer_id, moved.producer_epoch) == (8, 0)
    running = join(last, 7, MAX_EPOCH - 1, Partition("orders", 0, None), now_ms=3)
    fenced = fence(running, now_ms=4)
    assert fenced.producer_epoch == MAX_EPOCH > running.producer_epoch


def _done(t: Transaction, commit: bool, n: int) -> Transaction:
    return complete(prepare(t, commit, {}, now_ms=n), now_ms=n + 1)


def test_the_first_request_binds_the_token_and_others_never_act_on_the_open_transaction():
    first = join(fresh(), 7, 0, Partition("orders", 0, None), now_ms=1, token="a")
    assert (first.ordinal, first.token) == (1, "a")
    again = join(first, 7, 0, Partition("orders", 1, None), now_ms=2, token="a")
    assert [p.key for p in again.partitions] == [("orders", 0), ("orders", 1)]
    with pytest.raises(errors.InvalidTxnState):
        join(again, 7, 0, Partition("orders", 2, None), now_ms=3, token="b")
    with pytest.raises(errors.InvalidTxnState):
        stage_offsets(again, 7, 0, [Offset("g", "t", 0, 1)], now_ms=3, token="b")
    with pytest.raises(errors.InvalidTxnState):
        check_end(again, 7, 0, commit=True, token="b")
    assert check_end(again, 7, 0, commit=True, token="a") is EndCheck.PROCEED
    assert check_end(again, 7, 0, commit=True) is EndCheck.PROCEED  # no token: as before


def test_a_token_of_a_complete_transaction_is_answered_from_its_decision():
    one = _done(join(fresh(), 7, 0, Partition("o", 0, None), now_ms=1, token="a"), True, 2)
    two = join(one, 7, 0, Partition("o", 0, None), now_ms=5, token="b")
    assert (two.ordinal, two.token, [c.token for c in two.history]) == (2, "b", ["a"])
    assert check_end(two, 7, 0, commit=True, token="a") is EndCheck.DONE
    with pytest.raises(errors.InvalidTxnState):
        check_end(two, 7, 0, commit=False, token="a")  # not its decision
    with pytest.raises(errors.InvalidTxnState):
        stage_offsets(two, 7, 0, [Offset("g", "t", 0, 1)], now_ms=6, token="a")
    aborted = _done(two, False, 7)
    assert check_end(aborted, 7, 0, commit=False, token="b") is EndCheck.DONE
    with pytest.raises(errors.InvalidTxnState):
        check_end(aborted, 7, 0, commit=True, token="z")  # names no transaction
    with pytest.raises(errors.InvalidTxnState):
        join(aborted, 7, 0, Partition("o", 0, None), now_ms=8, token="b")  # complete: never again
    three = join(aborted, 7, 0, Partition("o", 0, None), now_ms=9, token="c")
    assert (three.ordinal, [c.token for c in three.history]) == (3, ["a", "b"])


def test_the_history_of_tokens_is_bounded():
    t = fresh()
    for n in range(HISTORY + 5):
        t = _done(join(t, 7, 0, Partition("o", 0, None), now_ms=n, token=f"t{n}"), True, n)
    t = join(t, 7, 0, Partition("o", 0, None), now_ms=99, token="last")
    assert len(t.history) == HISTORY
    assert t.history[-1].token == f"t{HISTORY + 4}"
    assert check_end(t, 7, 0, commit=True, token=f"t{HISTORY + 4}") is EndCheck.DONE


@given(
    st.integers(min_value=-1, max_value=(1 << 63) - 1).filter(lambda p: p != 7),
    st.integers(min_value=-1, max_value=MAX_EPOCH),
)
def test_a_batch_of_any_other_producer_id_is_invalid_producer_id_mapping(pid, epoch):
    """A non-idempotent batch (producer id -1) included: the transaction's producer id
    comes from the allocator, never -1, so this check is the only one a journaled batch
    needs (the produce service no longer asks again whether it has a producer id)."""
    for on_produce in (True, False):
        problem = producer_problem(ongoing(), "app", pid, epoch, on_produce=on_produce)
        assert isinstance(problem, errors.InvalidProducerIdMapping)
        assert "call init-producer-id" in problem.message


def test_the_transactions_own_producer_and_epoch_pass_and_others_are_fenced():
    t = ongoing()
    assert producer_problem(t, "app", 7, 0, on_produce=True) is None
    assert isinstance(
        producer_problem(t, "app", 7, 1, on_produce=True), errors.InvalidProducerEpoch
    )
    bumped = init(
        complete(prepare(t, False, {}, now_ms=2), now_ms=3),
        "app",
        timeout_ms=5,
        check_back_url=None,
        now_ms=4,
        new_producer_id=None,
    )
    assert isinstance(
        producer_problem(bumped, "app", 7, 0, on_produce=False), errors.ProducerFenced
    )


def test_an_init_naming_an_epoch_ahead_of_the_ids_says_it_is_ahead_not_fenced():
    t = fresh()  # producer 7 at epoch 0
    with pytest.raises(errors.ProducerFenced) as ahead:
        init(
            t,
            "app",
            timeout_ms=5,
            check_back_url=None,
            now_ms=1,
            new_producer_id=None,
            expected=(7, 3),
        )
    assert "epoch 3 is ahead of transactional id 'app''s epoch 0" in ahead.value.message
    assert "fenced" not in ahead.value.message
    bumped = init(t, "app", timeout_ms=5, check_back_url=None, now_ms=2, new_producer_id=None)
    bumped = init(bumped, "app", timeout_ms=5, check_back_url=None, now_ms=3, new_producer_id=None)
    with pytest.raises(errors.ProducerFenced, match="epoch 0 is fenced"):
        init(
            bumped,
            "app",
            timeout_ms=5,
            check_back_url=None,
            now_ms=4,
            new_producer_id=None,
            expected=(7, 0),
        )
