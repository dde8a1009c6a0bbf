"""The per-channel rules machine, on a stepped clock, without the service or Pulsar."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup.protocol.rules import (
    MAX_IN_FLIGHT,
    RECENT_BATCHES,
    Act,
    Attempt,
    ChannelState,
    Moment,
    StoredBatch,
    decide,
)
from tests import strategies as s

WINDOW, DEADLINE = 5.0, 30.0


def at(now: float = 0.0, **over: object) -> Moment:
    """The moment ``now`` seconds after the batch arrived (reorder window 5 s, deadline 30 s)."""
    return replace(Moment(now=now, gap_deadline=WINDOW, deadline=DEADLINE), **over)


def batch(base: int, count: int = 1, *, epoch: int = 0, pid: int = 7) -> Attempt:
    return Attempt(pid, epoch, base, count, "t-0")


def stored_up_to(last: int) -> ChannelState:
    """A channel that opened on a broker whose mark for the name is ``last``."""
    return ChannelState.from_broker(last)


def send(state: ChannelState, attempt: Attempt, moment: Moment | None = None) -> tuple[int, int]:
    verdict = decide(state, attempt, moment or at())
    assert verdict.act is Act.SEND, verdict
    state.on_handed(verdict.first, verdict.last, resend=False)
    return verdict.first, verdict.last


def refused(verdict, code: type[errors.KafkaError]) -> str:
    assert verdict.act is Act.REFUSE, verdict
    assert isinstance(verdict.error, code), verdict
    return verdict.reason


# -- sequence order --------------------------------------------------------------------


def test_a_producer_with_no_state_starting_at_zero_is_sent_at_once():
    verdict = decide(ChannelState(), batch(0, 3), at())
    assert (verdict.act, verdict.first, verdict.last) == (Act.SEND, 0, 2)


def test_next_in_order_is_sent_and_pipelined_batches_follow_what_was_sent():
    state = stored_up_to(9)
    assert send(state, batch(10, 5)) == (10, 14)
    assert send(state, batch(15, 5)) == (15, 19)
    assert state.in_flight == 2


def test_a_batch_ahead_of_a_gap_waits_until_the_reorder_window_ends():
    verdict = decide(stored_up_to(9), batch(12), at(1.0))
    assert verdict.act is Act.WAIT
    assert verdict.until == WINDOW
    assert "waits for sequence 10" in verdict.reason


def test_a_gap_that_did_not_fill_within_the_window_is_out_of_order():
    reason = refused(
        decide(stored_up_to(9), batch(12), at(WINDOW, arrived=(12,))),
        errors.OutOfOrderSequenceNumber,
    )
    assert "expected sequence 10" in reason


def test_a_gap_whose_next_batch_is_already_inside_the_sidecar_is_only_a_wait():
    verdict = decide(stored_up_to(9), batch(12), at(WINDOW, arrived=(12, 10)))
    assert (verdict.act, verdict.until) == (Act.WAIT, DEADLINE)


def test_sequences_wrap_from_2147483647_to_0_in_order():
    state = stored_up_to(SEQ_MODULUS - 1)
    assert send(state, batch(0)) == (SEQ_MODULUS, SEQ_MODULUS)


@given(s.extended, s.counts)
def test_in_order_after_any_stored_mark(mark, count):
    state = stored_up_to(mark)
    assert send(state, batch((mark + 1) % SEQ_MODULUS, count)) == (mark + 1, mark + count)


# -- retries ---------------------------------------------------------------------------


def test_a_retry_of_one_of_the_last_stored_batches_is_answered_46_with_its_position():
    state = stored_up_to(9)
    first, last = send(state, batch(10, 5))
    state.on_stored(first, last, "12:3:-1:0")
    verdict = decide(state, batch(10, 5), at())
    assert verdict.act is Act.DUPLICATE
    assert isinstance(verdict.error, errors.DuplicateSequenceNumber)
    assert verdict.position == "12:3:-1:0"


def test_only_the_last_five_stored_batches_keep_their_position():
    state = ChannelState()
    for i in range(RECENT_BATCHES + 1):
        first, last = send(state, batch(i * 2, 2))
        state.on_stored(first, last, f"1:{i}:-1:0")
    oldest = decide(state, batch(0, 2), at())
    assert oldest.act is Act.RESEND  # the broker's verdict, no position
    newest = decide(state, batch(RECENT_BATCHES * 2, 2), at())
    assert newest.position == f"1:{RECENT_BATCHES}:-1:0"


def test_a_retry_of_an_in_flight_batch_waits_for_its_answer():
    state = stored_up_to(9)
    send(state, batch(10, 5))
    verdict = decide(state, batch(10, 5), at())
    assert (verdict.act, verdict.until) == (Act.WAIT, DEADLINE)


def test_an_older_retry_goes_to_the_broker_once_nothing_is_in_flight():
    state = stored_up_to(14)
    assert decide(state, batch(10, 5), at()).act is Act.RESEND
    send(state, batch(15))
    assert decide(state, batch(10, 5), at()).act is Act.WAIT


@given(s.extended, st.integers(min_value=0, max_value=999), s.counts)
def test_wholly_stored_batches_are_never_refused(mark, back, count):
    first = mark - back - count + 1
    if first < 0:
        return
    verdict = decide(stored_up_to(mark), batch(first % SEQ_MODULUS, count), at())
    assert (verdict.act, verdict.first, verdict.last) == (Act.RESEND, first, first + count - 1)


def test_a_batch_straddling_the_stored_mark_is_out_of_order():
    reason = refused(decide(stored_up_to(14), batch(12, 5), at()), errors.OutOfOrderSequenceNumber)
    assert "only in part" in reason


def test_a_failed_send_stops_everything_until_the_channel_resyncs():
    state = stored_up_to(9)
    send(state, batch(10, 5))
    state.on_failed()
    assert state.sent == 9
    assert decide(state, batch(15), at()).act is Act.RESYNC
    assert decide(state, batch(10, 5), at()).act is Act.RESYNC


def test_when_the_broker_lost_its_state_the_sidecar_answers_what_it_remembers():
    """The broker's mark is below what this sidecar stored through the name: a retry
    resent to the broker would be stored again, so the sidecar answers 46 itself."""
    state = ChannelState.from_broker(None, remembered=20)
    verdict = decide(state, batch(10, 5), at())
    assert verdict.act is Act.DUPLICATE
    assert verdict.state_lost
    assert decide(state, batch(21), at()).act is Act.SEND


# -- where a producer started ----------------------------------------------------------


def test_a_new_producer_starting_above_zero_waits_out_the_window_then_the_lowest_goes():
    state = ChannelState()
    assert decide(state, batch(8), at(1.0, arrived=(8,))).act is Act.WAIT
    assert decide(state, batch(8), at(WINDOW, arrived=(4, 8))).act is Act.WAIT
    assert decide(state, batch(4), at(WINDOW, arrived=(4, 8))).act is Act.SEND


def test_the_window_verdict_and_its_wait_agree_at_the_window_edge():
    """One moment, one reading of the clock: a turn that begins a hair before the window
    ends waits for the window (not the deadline); one at its end sends."""
    state = ChannelState()
    just_before = decide(state, batch(5), at(WINDOW - 1e-9, arrived=(5,)))
    assert (just_before.act, just_before.until) == (Act.WAIT, WINDOW)
    assert decide(state, batch(5), at(WINDOW, arrived=(5,))).act is Act.SEND


@given(st.integers(min_value=1, max_value=SEQ_MODULUS - 1), s.counts, s.counts)
def test_a_batch_below_where_a_producer_started_is_out_of_order_not_resent(start, n, m):
    """What lies below a start above 0 was never stored, though it is below the broker's
    mark: 45, not 46."""
    state = ChannelState()
    first, last = send(state, batch(start, n), at(WINDOW, arrived=(start,)))
    state.on_stored(first, last, None)
    assert state.floor == first
    below = max(first - m, 0)
    refused(
        decide(state, batch(below, min(m, first - below) or 1), at()),
        errors.OutOfOrderSequenceNumber,
    )


def test_a_floor_survives_reconnecting_only_while_something_is_stored():
    assert ChannelState.from_broker(9, floor=5).floor == 5
    assert ChannelState.from_broker(None, floor=5).floor is None


# -- epochs ----------------------------------------------------------------------------


def test_an_epoch_below_the_recorded_one_is_fenced_even_for_a_stored_batch():
    state = stored_up_to(9)
    first, last = send(state, batch(10))
    state.on_stored(first, last, "1:1:-1:0")
    reason = refused(decide(state, batch(10), at(recorded_epoch=1)), errors.InvalidProducerEpoch)
    assert "epoch 1 has been recorded" in reason
    refused(decide(state, batch(11), at(recorded_epoch=1)), errors.InvalidProducerEpoch)


def test_a_batch_fenced_while_it_waited_is_refused_at_write_time():
    """Waiting makes the view of recorded epochs stale: before the batch is handed to
    Pulsar the epochs are read again, and the epoch recorded meanwhile fences it."""
    state = stored_up_to(9)
    assert decide(state, batch(11), at(1.0, arrived=(11,))).act is Act.WAIT
    stale = decide(state, batch(11), at(2.0, arrived=(11, 10), epochs_fresh=False))
    assert stale.act is Act.WAIT  # waits stay waits without a catch-up
    send(state, batch(10))
    ready = decide(state, batch(11), at(2.0, epochs_fresh=False))
    assert ready.act is Act.CATCH_UP
    refused(decide(state, batch(11), at(2.0, recorded_epoch=1)), errors.InvalidProducerEpoch)


def test_a_batch_arriving_behind_one_inside_the_sidecar_catches_up_before_it_waits():
    """Its catch-up runs alongside the earlier batch's, so it can go right after it."""
    state = stored_up_to(9)
    arriving = at(arrived=(11, 10), epochs_fresh=False, arriving=True)
    assert decide(state, batch(11), arriving).act is Act.CATCH_UP
    caught_up = decide(state, batch(11), at(arrived=(11, 10)))
    assert (caught_up.act, caught_up.behind) == (Act.WAIT, True)
    send(state, batch(10))
    assert decide(state, batch(11), at(arrived=(11,))).act is Act.SEND


def test_only_an_arriving_batch_catches_up_early_and_only_behind_an_arrived_one():
    state = stored_up_to(9)
    gap = at(arrived=(11,), epochs_fresh=False, arriving=True)
    assert decide(state, batch(11), gap).act is Act.WAIT  # nothing to go with: wait first
    waited = at(1.0, arrived=(11, 10), epochs_fresh=False)
    assert decide(state, batch(11), waited).act is Act.WAIT  # after a wait: final answers only


@pytest.mark.parametrize("act_of", ["send", "resend", "duplicate", "refuse45"])
def test_every_final_answer_needs_a_fresh_view_of_the_epochs(act_of):
    state = stored_up_to(9)
    probe = {
        "send": batch(10),
        "resend": batch(5),
        "duplicate": batch(5),
        "refuse45": batch(8, 5),
    }[act_of]
    if act_of == "duplicate":
        state.recent.append(StoredBatch(5, 5, "p"))
    assert decide(state, probe, at(epochs_fresh=False)).act is Act.CATCH_UP
    assert decide(state, probe, at()).act is not Act.CATCH_UP


def test_a_new_epoch_is_recorded_only_once_the_batch_passed_every_rule():
    state = ChannelState()
    verdict = decide(state, batch(0, epoch=3), at(recorded_epoch=2))
    assert verdict.act is Act.RECORD_EPOCH
    assert decide(state, batch(0, epoch=3), at(recorded_epoch=3)).act is Act.SEND


@pytest.mark.parametrize(
    ("base", "older", "code"),
    [
        (5, 0, errors.OutOfOrderSequenceNumber),  # a new epoch must start at 0
        (7, 4, errors.OutOfOrderSequenceNumber),
    ],
)
def test_a_refused_batch_of_a_new_epoch_records_nothing(base, older, code):
    verdict = decide(
        ChannelState(),
        batch(base, epoch=32767),
        at(WINDOW, older_epoch_with_state=older, recorded_epoch=older),
    )
    refused(verdict, code)


def test_a_new_epoch_where_the_older_one_has_state_must_start_at_zero():
    reason = refused(
        decide(ChannelState(), batch(5, epoch=1), at(WINDOW, older_epoch_with_state=0)),
        errors.OutOfOrderSequenceNumber,
    )
    assert "must start at sequence 0" in reason
    assert decide(ChannelState(), batch(0, epoch=1), at(older_epoch_with_state=0)).act is (
        Act.RECORD_EPOCH
    )


def test_a_later_batch_of_a_new_epoch_waits_behind_its_zero_still_being_recorded():
    """librdkafka bumps the epoch and pipelines 0, 1, 2... at once: 1 must not be refused
    while 0 is recording the epoch (it was, 45, and librdkafka took it for a fatal
    desynchronization), and goes once 0 is handed."""
    state = ChannelState()
    moment = at(older_epoch_with_state=0, recorded_epoch=0, arrived=(0, 1))
    assert decide(state, batch(0, epoch=1), moment).act is Act.RECORD_EPOCH
    verdict = decide(state, batch(1, epoch=1), moment)
    assert (verdict.act, verdict.until, verdict.behind) == (Act.WAIT, DEADLINE, True)
    assert "waits behind its sequence 0" in verdict.reason
    recorded = replace(moment, recorded_epoch=1)
    send(state, batch(0, epoch=1), recorded)
    assert decide(state, batch(1, epoch=1), recorded).act is Act.SEND


def test_a_later_batch_of_a_new_epoch_waits_the_reorder_window_for_its_zero():
    early = decide(ChannelState(), batch(1, epoch=1), at(1.0, older_epoch_with_state=0))
    assert (early.act, early.until) == (Act.WAIT, WINDOW)
    late = decide(ChannelState(), batch(1, epoch=1), at(WINDOW, older_epoch_with_state=0))
    refused(late, errors.OutOfOrderSequenceNumber)


def test_a_batch_behind_a_gap_whose_missing_batch_was_just_refused_gets_its_answer_at_once():
    """Node 3 took a partition over while the old owner still held the producer name:
    17 and 18 were answered 6, and 19 (pipelined behind them) waited out the reorder
    window for a 17 that librdkafka resends only once 19 is answered; 45 after 5 s and
    an epoch bump. It gets 6 at once now, and waits as before once 17 is back."""
    cause = errors.NotLeaderOrFollower("creating producer kop-1000-0: ProducerBusy")
    verdict = decide(stored_up_to(16), batch(19), at(refused={17: cause, 18: cause}))
    reason = refused(verdict, errors.NotLeaderOrFollower)
    assert "follows sequence 17" in reason
    assert "ProducerBusy" in reason
    back = at(arrived=(17, 19), refused={17: cause})
    assert decide(stored_up_to(16), batch(19), back).act is Act.WAIT
    timed_out = errors.RequestTimedOut("slow")
    later = decide(stored_up_to(16), batch(19), at(refused={15: timed_out}))
    assert later.act is Act.WAIT  # a refusal of another sequence is no reason


def test_a_new_producer_above_a_refused_start_is_refused_too_instead_of_starting_there():
    """Without the refusal it would wait out the window and then start at 3, after
    which the resent 0 would lie below the start (45, never stored)."""
    cause = errors.RequestTimedOut("creating the Pulsar producer")
    refused(decide(ChannelState(), batch(3), at(refused={0: cause})), errors.RequestTimedOut)
    refused(
        decide(ChannelState(), batch(1, epoch=1), at(older_epoch_with_state=0, refused={0: cause})),
        errors.RequestTimedOut,
    )


def test_epoch_zero_is_never_recorded():
    assert decide(ChannelState(), batch(0, epoch=0), at()).act is Act.SEND


# -- capacity and shutdown -------------------------------------------------------------


def test_no_more_than_max_in_flight_batches_are_handed_to_pulsar():
    state = stored_up_to(0)
    for i in range(MAX_IN_FLIGHT):
        send(state, batch(1 + i))
    verdict = decide(state, batch(1 + MAX_IN_FLIGHT), at())
    assert (verdict.act, verdict.until) == (Act.WAIT, DEADLINE)
    assert "still in flight" in verdict.reason
    state.on_stored(1, 1, "1:0:-1:0")
    assert decide(state, batch(1 + MAX_IN_FLIGHT), at()).act is Act.SEND


def test_a_batch_waits_until_the_client_queue_has_room_for_all_of_its_records():
    verdict = decide(ChannelState(), batch(0, 100), at(queue_room=99))
    assert verdict.act is Act.WAIT
    assert "no room" in verdict.reason
    assert decide(ChannelState(), batch(0, 100), at(queue_room=100)).act is Act.SEND


def test_a_closing_sidecar_hands_nothing_more_to_pulsar_but_still_answers_what_it_knows():
    state = stored_up_to(9)
    refused(decide(state, batch(10), at(closing=True)), errors.NotLeaderOrFollower)
    refused(decide(state, batch(12), at(closing=True)), errors.NotLeaderOrFollower)
    first, last = send(state, batch(10))
    state.on_stored(first, last, "1:2:-1:0")
    assert decide(state, batch(10), at(closing=True)).act is Act.DUPLICATE
