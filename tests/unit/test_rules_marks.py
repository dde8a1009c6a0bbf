"""The rules machine on a channel whose broker mark may be stale: another holder of the
producer name may have stored more while the channel's Pulsar producer was
disconnected (a topic unload, a broker restart, a pause past the keep-alive), and the
C++ client reconnects without telling anyone. A verdict that takes the channel's state
to be all the broker knows is given only from a mark read after the batch arrived;
everything the broker judges by its receipt goes as before."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kop_dedup import errors
from kop_dedup.protocol.rules import Act, Attempt, ChannelState, Moment, StoredBatch, decide

WINDOW, DEADLINE = 5.0, 30.0


def stale(now: float = 0.0, **over: object) -> Moment:
    """A moment whose channel read the broker's mark before the batch arrived."""
    moment = Moment(now=now, gap_deadline=WINDOW, deadline=DEADLINE, mark_current=False)
    return replace(moment, **over)


def batch(base: int, count: int = 1, *, epoch: int = 0) -> Attempt:
    return Attempt(7, epoch, base, count, "t-0")


def test_a_gap_on_a_mark_read_before_the_batch_arrived_reads_the_mark_first():
    state = ChannelState.from_broker(2)
    assert decide(state, batch(6, 2), stale(arrived=(6,))).act is Act.VERIFY
    current = decide(state, batch(6, 2), replace(stale(arrived=(6,)), mark_current=True))
    assert current.act is Act.WAIT  # read after it arrived: a true gap waits as before


def test_the_mark_read_again_decides_the_next_batch_and_the_retry():
    """What the broker says after the read: the other holder stored 3..5."""
    state = ChannelState.from_broker(5)
    now = stale(mark_current=True)
    assert decide(state, batch(6, 2), now).act is Act.SEND
    assert decide(state, batch(5), now).act is Act.RESEND  # the broker's -1/-1 makes it 46


def test_a_gap_past_the_window_is_refused_only_after_reading_the_mark():
    state = ChannelState.from_broker(2)
    assert decide(state, batch(6), stale(WINDOW, arrived=(6,))).act is Act.VERIFY
    verdict = decide(state, batch(6), stale(WINDOW, arrived=(6,), mark_current=True))
    assert isinstance(verdict.error, errors.OutOfOrderSequenceNumber)


def test_pipelined_batches_in_flight_are_not_held_up_by_a_read_until_the_window_ends():
    """A gap while earlier batches are in Pulsar's hands is the usual reordering: it
    waits as before; only a refusal at the window's end reads the mark first."""
    state = ChannelState.from_broker(2)
    state.on_handed(3, 3, resend=False)
    waiting = decide(state, batch(5), stale(1.0, arrived=(5,)))
    assert (waiting.act, waiting.after) == (Act.WAIT, 4)
    assert decide(state, batch(5), stale(WINDOW, arrived=(5,))).act is Act.VERIFY


@pytest.mark.parametrize(
    ("state", "probe", "act"),
    [
        (ChannelState.from_broker(9), batch(10), Act.SEND),  # next: the broker judges it
        (ChannelState.from_broker(9), batch(5), Act.RESEND),  # a retry: the broker judges it
        (ChannelState.from_broker(9), batch(8, 5), Act.REFUSE),  # straddles what is known
    ],
)
def test_verdicts_the_broker_judges_or_that_stale_state_cannot_change_read_nothing(
    state, probe, act
):
    assert decide(state, probe, stale(arrived=(probe.base_sequence,))).act is act


def test_a_batch_behind_one_inside_the_sidecar_waits_for_it_without_a_read():
    state = ChannelState.from_broker(2)
    verdict = decide(state, batch(4), stale(arrived=(4, 3)))
    assert (verdict.act, verdict.behind) == (Act.WAIT, True)


def test_a_known_duplicate_is_answered_from_memory_without_a_read():
    state = ChannelState.from_broker(9)
    state.recent.append(StoredBatch(9, 9, "1:2:0:0"))
    assert decide(state, batch(9), stale(arrived=(9,))).act is Act.DUPLICATE


def test_a_start_above_zero_on_a_channel_with_no_state_reads_the_mark_before_waiting():
    """Another holder may have stored 0..4 under the name since the channel opened; once
    the window is over the lowest start goes, and the broker judges it by its receipt."""
    assert decide(ChannelState(), batch(5), stale(arrived=(5,))).act is Act.VERIFY
    assert decide(ChannelState(), batch(5), stale(WINDOW, arrived=(5,))).act is Act.SEND
    assert decide(ChannelState(), batch(0), stale(arrived=(0,))).act is Act.SEND


def test_a_new_epoch_not_at_zero_reads_the_mark_before_it_is_refused():
    moment = stale(WINDOW, arrived=(5,), older_epoch_with_state=0, recorded_epoch=1)
    assert decide(ChannelState(), batch(5, epoch=1), moment).act is Act.VERIFY
    refused = decide(ChannelState(), batch(5, epoch=1), replace(moment, mark_current=True))
    assert isinstance(refused.error, errors.OutOfOrderSequenceNumber)


def test_a_closing_sidecar_reads_no_mark_and_refuses_a_stale_gap_as_retriable():
    state = ChannelState.from_broker(2)
    verdict = decide(state, batch(6), stale(WINDOW, arrived=(6,), closing=True))
    assert isinstance(verdict.error, errors.NotLeaderOrFollower), verdict


def test_a_read_comes_before_the_catch_up_of_the_epochs():
    """The read is not an answer: the epochs are caught up on the verdict after it."""
    state = ChannelState.from_broker(2)
    verdict = decide(state, batch(6), stale(WINDOW, arrived=(6,), epochs_fresh=False))
    assert verdict.act is Act.VERIFY
