from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kop_dedup.protocol.rules import (
    EpochVerdict,
    SequenceState,
    Verdict,
    decide,
    epoch_verdict,
    fresh_start,
)
from tests import strategies as s


def persisted_up_to(last: int) -> SequenceState:
    return SequenceState.from_broker(last)


def test_fresh_producer_may_start_anywhere():
    state = SequenceState.fresh()
    assert decide(state, *state.place(12345, 3)) is Verdict.SEND


def test_next_in_order_is_sent():
    state = persisted_up_to(9)
    assert decide(state, *state.place(10, 5)) is Verdict.SEND


def test_gap_waits():
    state = persisted_up_to(9)
    assert decide(state, *state.place(12, 1)) is Verdict.WAIT


def test_pipelined_batches_follow_what_was_sent():
    state = persisted_up_to(9)
    state.on_sent(14)  # 10..14 in flight
    assert decide(state, *state.place(15, 5)) is Verdict.SEND
    assert decide(state, *state.place(20, 1)) is Verdict.WAIT


def test_retry_of_in_flight_batch_waits_for_the_answer():
    state = persisted_up_to(9)
    state.on_sent(14)
    assert decide(state, *state.place(10, 5)) is Verdict.WAIT


def test_retry_of_stored_batch_goes_to_the_broker_for_its_verdict():
    state = persisted_up_to(14)
    assert decide(state, *state.place(10, 5)) is Verdict.RESEND_FOR_VERDICT


def test_resend_waits_while_anything_is_outstanding():
    state = persisted_up_to(14)
    assert decide(state, *state.place(10, 5), outstanding=1) is Verdict.WAIT


def test_batch_straddling_the_stored_mark_is_out_of_order():
    state = persisted_up_to(14)
    assert decide(state, *state.place(12, 5)) is Verdict.OUT_OF_ORDER


def test_failure_rolls_back_to_what_is_stored():
    state = persisted_up_to(9)
    state.on_sent(14)
    state.on_failed()
    assert state.sent == 9
    assert decide(state, *state.place(10, 5)) is Verdict.SEND


def test_sequence_after_the_wrap_is_in_order():
    state = persisted_up_to((1 << 31) - 1)
    assert decide(state, *state.place(0, 1)) is Verdict.SEND
    assert state.place(0, 1) == (1 << 31, 1 << 31)


@given(s.extended, s.counts)
def test_in_order_after_any_stored_mark(stored, m):
    state = persisted_up_to(stored)
    first, last = state.place((stored + 1) % (1 << 31), m)
    assert first == stored + 1
    assert decide(state, first, last) is Verdict.SEND


@given(s.extended, st.integers(min_value=0, max_value=999), s.counts)
def test_wholly_stored_batches_are_never_refused(stored, back, n):
    first_ext = stored - back - n + 1
    if first_ext < 0:
        return
    state = persisted_up_to(stored)
    first, last = state.place(first_ext % (1 << 31), n)
    assert (first, last) == (first_ext, first_ext + n - 1)
    assert decide(state, first, last) is Verdict.RESEND_FOR_VERDICT


def test_epoch_verdicts():
    assert epoch_verdict(None, 0) is EpochVerdict.NEWER
    assert epoch_verdict(3, 4) is EpochVerdict.NEWER
    assert epoch_verdict(3, 3) is EpochVerdict.CURRENT
    assert epoch_verdict(3, 2) is EpochVerdict.FENCED


def test_fresh_start_at_zero_goes_at_once():
    assert fresh_start(0, False, [0, 8]) is Verdict.SEND


def test_fresh_start_elsewhere_waits_for_earlier_batches_then_lowest_goes():
    assert fresh_start(8, False, [8]) is Verdict.WAIT
    assert fresh_start(8, True, [4, 8]) is Verdict.WAIT
    assert fresh_start(4, True, [4, 8]) is Verdict.SEND


@given(st.integers(min_value=1, max_value=(1 << 31) - 1), s.counts, s.counts)
def test_a_batch_below_where_a_producer_started_is_out_of_order_not_resent(start, n, m):
    """Kafka >= 2.5 lets a producer with no state start above 0; what lies below its
    start was never stored, though it is below the broker's high-water mark: 45, not 46."""
    state = SequenceState.fresh()
    first, last = state.place(start, n)
    state.on_sent(last, first)
    state.on_persisted(last)
    assert state.floor == first
    below = max(first - m, 0)
    assert decide(state, *state.place(below, min(m, first - below) or 1)) is Verdict.OUT_OF_ORDER
    assert decide(state, first, last) is Verdict.RESEND_FOR_VERDICT  # stored: the broker says 46


def test_a_producer_starting_at_zero_has_no_floor_and_reconnecting_keeps_it():
    state = SequenceState.fresh()
    state.on_sent(2, 0)
    assert state.floor is None
    assert SequenceState.from_broker(9, floor=5).floor == 5
    assert SequenceState.from_broker(None, floor=5).floor is None  # nothing stored: afresh
