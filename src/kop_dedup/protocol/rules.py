"""Sequence decisions for one (partition, producer id, epoch): pure, no I/O.

Pulsar's broker is the authority on what it has stored; this module decides
*when* a batch may be handed to the Pulsar producer so that the broker's
answer means what Kafka's would:

* batches go to Pulsar in sequence order, pipelined (several in flight);
* a batch ahead of a gap waits (the caller bounds the wait and then answers
  OUT_OF_ORDER_SEQUENCE_NUMBER);
* a batch at or below what was already sent waits until nothing is in flight,
  then, if it lies wholly within what the broker has stored, it is sent again
  so that the broker answers -1/-1 (DUPLICATE_SEQUENCE_NUMBER); the C++
  client matches receipts only against the head of its pending queue, so an
  older sequence must never be sent while newer ones are pending;
* a batch that straddles the stored high-water mark is refused with
  OUT_OF_ORDER_SEQUENCE_NUMBER: the broker judges a batch by one id (its last
  record's, see publisher.py) and would store its already-stored records again.

Sequences here are *extended* (see batch.unwrap): they only grow.

>>> s = SequenceState.fresh()
>>> decide(s, *s.place(0, 3))
<Verdict.SEND: 'send'>
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kop_dedup.protocol.records import unwrap

__all__ = ["EpochVerdict", "SequenceState", "Verdict", "decide", "epoch_verdict", "fresh_start"]


class Verdict(enum.Enum):
    SEND = "send"
    """In order (or the first batch ever): publish now."""
    WAIT = "wait"
    """Ahead of a gap, or overlapping batches still in flight: wait for a change."""
    RESEND_FOR_VERDICT = "resend"
    """Wholly within what the broker stored and nothing in flight: let the broker judge."""
    OUT_OF_ORDER = "out_of_order"
    """Straddles the stored high-water mark: refuse (Kafka code 45)."""


@dataclass(slots=True)
class SequenceState:
    """What is known of one Pulsar producer name on one partition topic.

    ``persisted``: highest extended sequence the broker has stored (None: none).
    ``sent``: highest extended sequence handed to the Pulsar producer
    (>= ``persisted``; equal when nothing is in flight).
    ``floor``: the first sequence of a producer that started above 0 (Kafka
    >= 2.5 lets a producer with no state start anywhere); nothing below it
    was ever stored, so a batch below it is out of order, not a duplicate,
    though it lies below the broker's high-water mark.
    """

    persisted: int | None
    sent: int | None
    floor: int | None = None

    @classmethod
    def fresh(cls) -> SequenceState:
        return cls(persisted=None, sent=None)

    @classmethod
    def from_broker(cls, last_extended: int | None, floor: int | None = None) -> SequenceState:
        """State after (re)connecting: the broker's last sequence for the name."""
        if last_extended is None:
            floor = None  # nothing stored: the next batch starts afresh
        return cls(persisted=last_extended, sent=last_extended, floor=floor)

    @property
    def in_flight(self) -> bool:
        return self.sent != self.persisted

    @property
    def has_state(self) -> bool:
        return self.sent is not None

    def place(self, base_sequence: int, count: int) -> tuple[int, int]:
        """Extended (first, last) for a batch, unwrapped near what was sent."""
        first = unwrap(base_sequence, self.sent)
        return first, first + count - 1

    def on_sent(self, last: int, first: int | None = None) -> None:
        """``first`` is given for the batch that starts a producer with no state."""
        if self.sent is None and first:
            self.floor = first
        self.sent = last if self.sent is None else max(self.sent, last)

    def on_persisted(self, last: int) -> None:
        self.persisted = last if self.persisted is None else max(self.persisted, last)
        self.on_sent(last)

    def on_failed(self) -> None:
        """A send failed: what is in flight is unknown until the broker says."""
        self.sent = self.persisted


def fresh_start(base_sequence: int, window_over: bool, waiting_starts: list[int]) -> Verdict:
    """May a batch start a producer that has no state at all on this partition?

    Kafka (>= 2.5) lets such a producer start at any sequence, but batches of
    a new producer can arrive out of order over separate connections: the one
    that arrives first is not necessarily the first one sent. Sequence 0 starts
    at once; any other start waits out the reorder window for earlier batches,
    and then only the lowest of the waiting starts goes (the others follow it
    in order). ``waiting_starts`` holds the base sequences of all batches
    waiting to start, this one included.
    """
    if base_sequence == 0:
        return Verdict.SEND
    if not window_over:
        return Verdict.WAIT
    return Verdict.SEND if base_sequence <= min(waiting_starts) else Verdict.WAIT


def decide(  # noqa: PLR0911 - one return per rule, in the order Kafka's broker checks
    state: SequenceState, first: int, last: int, outstanding: int = 0
) -> Verdict:
    """What to do now with a batch whose extended sequences are [first, last].

    ``outstanding`` counts batches on the Pulsar producer with no answer yet,
    resends included (they do not move ``sent``).
    """
    if state.sent is None:
        return Verdict.SEND  # no state: a producer may start anywhere (Kafka >= 2.5)
    if state.floor is not None and first < state.floor:
        return Verdict.OUT_OF_ORDER  # below where the producer started: never stored
    expected = state.sent + 1
    if first == expected:
        return Verdict.SEND
    if first > expected:
        return Verdict.WAIT
    if state.in_flight or outstanding:
        return Verdict.WAIT  # re-decide once what is in flight has an answer
    persisted = state.persisted
    if persisted is not None and last <= persisted:
        return Verdict.RESEND_FOR_VERDICT
    return Verdict.OUT_OF_ORDER


class EpochVerdict(enum.Enum):
    CURRENT = "current"
    NEWER = "newer"
    FENCED = "fenced"


def epoch_verdict(highest_known: int | None, epoch: int) -> EpochVerdict:
    """Compare a batch's epoch with the highest epoch recorded for its producer id."""
    if highest_known is None or epoch > highest_known:
        return EpochVerdict.NEWER
    if epoch == highest_known:
        return EpochVerdict.CURRENT
    return EpochVerdict.FENCED
