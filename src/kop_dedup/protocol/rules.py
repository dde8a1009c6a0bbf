"""The per-channel rules machine: every decision about one Kafka batch on one channel.

A *channel* is one Pulsar producer name (``<prefix>-<producerId>-<epoch>``) on one
partition topic. :func:`decide` looks at what is known of the channel
(:class:`ChannelState`), the batch (:class:`Attempt`) and the moment
(:class:`Moment`), and answers a :class:`Verdict`: what to do now, and why. It is pure
(no I/O, no clock of its own), so each rule is unit-tested on a stepped clock; the
produce service only carries verdicts out and decides again after anything it awaited.

The rules, in the order Kafka's broker applies them (``ProducerAppendInfo``):

1. **Fencing.** An epoch below the highest recorded for the producer id is refused
   (47, INVALID_PRODUCER_EPOCH), even for a retry of a stored batch. A verdict that
   hands a batch to Pulsar, or answers it for good, needs a *fresh* view of the
   recorded epochs (``CATCH_UP`` first), so a batch fenced while it waited is refused
   at write time, not only on arrival. A batch that arrives behind an earlier batch of
   its channel that is already inside the sidecar catches up at once instead of first
   waiting for it: the earlier one is usually catching up itself, the two share one
   broker round trip, and the later batch goes right after the earlier one (pipelined)
   rather than one round trip later.
2. **In sync.** After a failed send, nothing goes until the channel has resynced its
   state from the broker (``RESYNC``).
3. **New epoch at 0.** A producer id that moves to a newer epoch on a partition where
   an older epoch has state must start at sequence 0 (45); its later batches, pipelined
   behind a 0 that is still being recorded, wait for it.
4. **Sequence.** Batches go in sequence order, pipelined; a batch ahead of a gap waits
   (45 when the gap does not fill within the reorder window; at once the retriable
   answer of the missing batch when that was just refused, a producer still held by
   the partition's previous owner or a timeout: the client resends it only after
   hearing about this one); a retry of one of the
   last stored batches is answered 46 with its original position; an older retry goes
   to the broker once nothing is in flight, whose -1/-1 receipt makes it 46 (the C++
   client matches receipts only at the head of its queue, so an older sequence must
   never be sent while newer ones are pending); a batch straddling the stored mark is
   refused (45): the broker judges an entry by one sequence id and would store its
   stored part again.
5. **A mark read since the batch arrived.** A verdict that takes the channel's state
   to be all the broker knows (a wait or a 45 for a gap past what was sent, or for a
   start above 0 where nothing is known) is given only once the broker's mark for the
   name was read after the batch arrived (``VERIFY`` first): another holder of the
   name may have stored more while the producer was disconnected, and the client
   reconnects it without a word. A wait behind batches still in flight is the usual
   reordering and waits as before; only its 45 reads the mark first. Every other
   verdict hands the batch to the broker, whose receipt judges it by its own mark, or
   answers from what this channel itself stored, which another holder cannot undo.
6. **Shutdown.** A closing sidecar hands nothing more to Pulsar, and reads no mark
   (6, retriable).
7. **Capacity.** At most ``max_in_flight`` batches of a channel are in Pulsar's hands,
   and a batch goes only when the client queue has room for all of its records, so a
   batch is never refused half-way through being enqueued.
8. **Recording a new epoch** (``RECORD_EPOCH``) happens only once the batch has passed
   every rule above, just before it is handed to Pulsar: a refused batch changes no
   state.

Sequences here are *extended* (see :func:`kop_dedup.protocol.records.unwrap`): they
only grow, across the 2**31 wrap.

>>> state = ChannelState()
>>> now = Moment(now=0.0, gap_deadline=5.0, deadline=30.0)
>>> decide(state, Attempt(producer_id=7, epoch=0, base_sequence=0, count=3), now).act
<Act.SEND: 'send'>
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.protocol.channel_state import RECENT_BATCHES, ChannelState, StoredBatch
from kop_dedup.protocol.records import SEQ_MODULUS

__all__ = [
    "MAX_IN_FLIGHT",
    "RECENT_BATCHES",
    "Act",
    "Attempt",
    "ChannelState",
    "Moment",
    "StoredBatch",
    "Verdict",
    "decide",
]

MAX_IN_FLIGHT = 5
"""Batches of one producer and partition in flight at once (Kafka clients: at most 5)."""


class Act(enum.Enum):
    SEND = "send"
    """Hand the batch to Pulsar now (in order)."""
    RESEND = "resend"
    """A retry wholly within what the broker stored: send it again for the broker's verdict."""
    DUPLICATE = "duplicate"
    """Answer 46 now, without Pulsar: the sidecar knows the batch is stored."""
    REFUSE = "refuse"
    """Answer the verdict's error; nothing is stored, no state changes."""
    WAIT = "wait"
    """Wait for a change on the channel, at most until ``until``."""
    RESYNC = "resync"
    """A send failed: reopen the producer and take the broker's state before anything else."""
    CATCH_UP = "catch_up"
    """Read the recorded epochs up to now before answering for good."""
    RECORD_EPOCH = "record_epoch"
    """Record the batch's new epoch durably, then decide again."""
    VERIFY = "verify"
    """Read the broker's mark for the name again (reopen the producer), then decide again."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """The facts of one batch that the rules need (``count`` >= 1; shape already checked)."""

    producer_id: int
    epoch: int
    base_sequence: int
    count: int
    where: str = ""
    """Topic and partition, for messages (``orders-0``)."""

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.count - 1) % SEQ_MODULUS


@dataclass(frozen=True, slots=True)
class Moment:
    """Everything outside the channel's state that a decision depends on."""

    now: float
    gap_deadline: float
    """When the reorder window of this batch ends (never after ``deadline``)."""
    deadline: float
    arrived: Sequence[int] = ()
    """Base sequences of the batches inside the sidecar for this channel, this one included."""
    recorded_epoch: int | None = None
    """The highest epoch recorded for the producer id (by any sidecar, as far as known)."""
    epochs_fresh: bool = True
    """Whether ``recorded_epoch`` was read after this batch last waited for anything."""
    older_epoch_with_state: int | None = None
    """The newest epoch below this one that has state on this partition, if known."""
    max_in_flight: int = MAX_IN_FLIGHT
    queue_room: int = 1 << 30
    """Records the Pulsar producer's queue can still take."""
    closing: bool = False
    arriving: bool = False
    """This is the batch's first decision since it arrived (it has awaited nothing yet)."""
    refused: Mapping[int, errors.KafkaError] = field(default_factory=dict)
    """Base sequences of this channel's batches answered a retriable error, without being
    handed to Pulsar, within the reorder window, and not arrived again since."""
    mark_current: bool = True
    """The broker's mark for the name was read after this batch arrived. Before that,
    another holder of the name may have stored more (the producer was disconnected and
    the client reconnected it by itself), and the channel's state may be behind."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do now with a batch, and why (``reason`` is the sentence a client reads)."""

    act: Act
    reason: str = ""
    error: errors.KafkaError | None = None
    """For REFUSE, the answer; for DUPLICATE, the 46."""
    until: float = 0.0
    """For WAIT: decide again at the latest then; a wait that reaches ``deadline`` is over."""
    first: int = 0
    last: int = 0
    position: str | None = None
    """For DUPLICATE: the stored batch's first position, when known."""
    state_lost: bool = False
    """For DUPLICATE: the broker had lost its state; only the sidecar's memory knew."""
    behind: bool = False
    """For WAIT: what the batch waits for is an earlier batch already inside the sidecar."""
    after: int | None = None
    """For WAIT behind a gap: only the hand of the batch ending at this extended sequence
    (the one just before this batch) can end the wait early; None: any change."""
    beyond: bool = False
    """For WAIT and REFUSE: the verdict takes the channel's state to be all the broker
    knows (a gap past what was sent, a start above 0 where nothing is known)."""


def _kafka(extended: int) -> int:
    return extended % SEQ_MODULUS


def _refuse(error: errors.KafkaError) -> Verdict:
    return Verdict(Act.REFUSE, error.message, error=error)


def _wait(
    until: float,
    reason: str,
    *,
    behind: bool = False,
    after: int | None = None,
    beyond: bool = False,
) -> Verdict:
    return Verdict(Act.WAIT, reason, until=until, behind=behind, after=after, beyond=beyond)


def _beyond(error: errors.KafkaError) -> Verdict:
    """A refusal that holds only if the broker knows no more than the channel's state."""
    return Verdict(Act.REFUSE, error.message, error=error, beyond=True)


_FINAL = frozenset({Act.SEND, Act.RESEND, Act.DUPLICATE, Act.REFUSE})
_HANDS_TO_PULSAR = frozenset({Act.SEND, Act.RESEND})


def decide(state: ChannelState, attempt: Attempt, moment: Moment) -> Verdict:
    """What to do now with ``attempt`` on a channel in ``state`` (see the module rules)."""
    recorded = moment.recorded_epoch
    if recorded is not None and attempt.epoch < recorded:
        return _refuse(
            errors.InvalidProducerEpoch(
                f"producer {attempt.producer_id} epoch {attempt.epoch} is fenced: epoch "
                f"{recorded} has been recorded"
            )
        )
    if state.broken:
        return Verdict(Act.RESYNC, "an earlier send on this channel failed")
    verdict = _sequence_verdict(state, attempt, moment)
    stale = verdict.beyond and not moment.mark_current
    if moment.closing and (stale or verdict.act in _HANDS_TO_PULSAR | {Act.WAIT}):
        return _refuse(
            errors.NotLeaderOrFollower(
                "the sidecar is shutting down; retry the batch on another (it is safe)"
            )
        )
    # a wait while earlier batches are in flight is the usual reordering: not held up
    if stale and (verdict.act is Act.REFUSE or not state.in_flight):
        verdict = Verdict(Act.VERIFY, "the broker's mark was read before the batch arrived")
    if verdict.act in _HANDS_TO_PULSAR:
        verdict = _capacity(state, attempt, moment, verdict)
    # an arriving batch behind one inside the sidecar catches up alongside it (rule 1)
    early = verdict.behind and moment.arriving
    if not moment.epochs_fresh and (verdict.act in _FINAL or early):
        return Verdict(Act.CATCH_UP, "the recorded epochs must be read before answering")
    if (
        verdict.act is Act.SEND
        and attempt.epoch > 0
        and (recorded is None or attempt.epoch > recorded)
    ):
        return Verdict(Act.RECORD_EPOCH, f"epoch {attempt.epoch} is new for the producer id")
    return verdict


def _capacity(state: ChannelState, attempt: Attempt, moment: Moment, verdict: Verdict) -> Verdict:
    if state.in_flight >= moment.max_in_flight:
        return _wait(
            moment.deadline,
            f"{state.in_flight} earlier batches of producer {attempt.producer_id} on "
            f"{attempt.where} were still in flight (the limit is {moment.max_in_flight})",
        )
    if attempt.count > moment.queue_room:
        return _wait(
            moment.deadline,
            f"the Pulsar producer's queue had no room for {attempt.count} more records",
        )
    return verdict


def _sequence_verdict(state: ChannelState, attempt: Attempt, moment: Moment) -> Verdict:
    if not state.has_state:
        return _fresh_start(attempt, moment)
    first, last = state.place(attempt.base_sequence, attempt.count)
    span = f"batch {attempt.base_sequence}..{attempt.last_sequence}"
    sent = state.sent if state.sent is not None else first
    if state.floor is not None and first < state.floor:
        return _refuse(
            errors.OutOfOrderSequenceNumber(
                f"{span} lies below sequence {_kafka(state.floor)}, where producer "
                f"{attempt.producer_id} epoch {attempt.epoch} started on {attempt.where}; "
                "it was never stored"
            )
        )
    if first == sent + 1:
        return Verdict(Act.SEND, "next in sequence", first=first, last=last)
    if first > sent + 1:
        return _gap(attempt, moment, expected=_kafka(sent + 1), span=span, after=first - 1)
    return _retry(state, attempt, moment, first, last, span)


def _after_refused(attempt: Attempt, moment: Moment, lowest: int, highest: int) -> Verdict | None:
    """A batch waiting for a lower sequence of its channel that was just answered a
    retriable error gets that answer too, at once: a Kafka client resends the refused
    batch only once every later one is answered (librdkafka drains, Java re-enqueues in
    order), so waiting out the reorder window for it would only end in 45 and an epoch
    bump. None when no batch starting in ``lowest..highest`` was refused."""
    if not moment.refused:
        return None
    lower = [s for s in moment.refused if lowest <= s <= highest and s not in moment.arrived]
    if not lower:
        return None
    first = min(lower)
    cause = moment.refused[first]
    return _refuse(
        type(cause)(
            f"batch {attempt.base_sequence}.. follows sequence {first} of producer "
            f"{attempt.producer_id} on {attempt.where}, which was just answered {cause.name} "
            f"({cause.message}); send both again, in order (it is safe)"
        )
    )


def _gap(attempt: Attempt, moment: Moment, *, expected: int, span: str, after: int) -> Verdict:
    arrived = expected in moment.arrived
    if not arrived and (refused := _after_refused(attempt, moment, expected, expected)):
        return refused
    if moment.now < moment.gap_deadline:
        return _wait(
            moment.gap_deadline,
            f"{span} waits for sequence {expected} to arrive",
            behind=arrived,
            after=after,
            beyond=not arrived,
        )
    if not arrived:
        return _beyond(
            errors.OutOfOrderSequenceNumber(
                f"expected sequence {expected} next from producer {attempt.producer_id} on "
                f"{attempt.where}, got {attempt.base_sequence}; the gap did not fill within "
                "the reorder window"
            )
        )
    return _wait(
        moment.deadline,
        f"{span} waited for earlier batches still in the sidecar",
        behind=True,
        after=after,
    )


def _retry(
    state: ChannelState, attempt: Attempt, moment: Moment, first: int, last: int, span: str
) -> Verdict:
    stored_at = state.recent_position(first, last)
    duplicate = (
        f"sequences {span.removeprefix('batch ')} of producer {attempt.producer_id} epoch "
        f"{attempt.epoch} were already stored on {attempt.where}"
    )
    if stored_at is not None:
        return Verdict(
            Act.DUPLICATE,
            duplicate,
            error=errors.DuplicateSequenceNumber(duplicate),
            position=stored_at,
        )
    if state.sent != state.persisted or state.in_flight:
        return _wait(moment.deadline, f"{span} waited for earlier batches still in flight")
    persisted = state.persisted
    if persisted is not None and last <= persisted:
        if state.broker_mark is not None and last <= state.broker_mark:
            return Verdict(Act.RESEND, "a retry of stored sequences", first=first, last=last)
        return Verdict(
            Act.DUPLICATE,
            duplicate,
            error=errors.DuplicateSequenceNumber(duplicate),
            state_lost=True,
        )
    stored = "none" if persisted is None else str(_kafka(persisted))
    return _refuse(
        errors.OutOfOrderSequenceNumber(
            f"{span} overlaps the stored sequences only in part (last stored: {stored})"
        )
    )


def _fresh_start(attempt: Attempt, moment: Moment) -> Verdict:
    """A producer with no state on this partition (Kafka >= 2.5 lets it start anywhere).

    A newer epoch where an older one has state must start at 0: a later batch waits
    behind its epoch's 0 while that is inside the sidecar (being recorded, pipelined
    behind it), or for the reorder window for 0 to arrive, and is refused (45) after.
    Otherwise 0 starts at once; any other start waits out the reorder window for earlier
    batches (batches of a new producer can arrive out of order over separate
    connections), and then only the lowest of the waiting starts goes; the others follow
    it in order.
    """
    base = attempt.base_sequence
    first, last = base, base + attempt.count - 1
    older = moment.older_epoch_with_state
    if base != 0 and older is not None and older < attempt.epoch:
        return _new_epoch_not_at_zero(attempt, moment, older)
    if base == 0:
        return Verdict(Act.SEND, "a new producer starting at 0", first=first, last=last)
    if refused := _after_refused(attempt, moment, 0, base - 1):
        return refused
    if moment.now < moment.gap_deadline:
        return _wait(
            moment.gap_deadline,
            f"a new producer starting at {base} waits out the reorder window for earlier batches",
            beyond=True,
        )
    if base <= min(moment.arrived, default=base):
        return Verdict(
            Act.SEND, "the lowest start after the reorder window", first=first, last=last
        )
    return _wait(
        moment.deadline, f"batch {base}.. waited for a lower start of the same new producer"
    )


def _new_epoch_not_at_zero(attempt: Attempt, moment: Moment, older: int) -> Verdict:
    """A batch of a new epoch that does not start at 0, where epoch ``older`` has state."""
    base = attempt.base_sequence
    span = f"batch {base}.. of producer {attempt.producer_id} epoch {attempt.epoch}"
    if refused := _after_refused(attempt, moment, 0, 0):
        return refused
    if 0 in moment.arrived:
        return _wait(moment.deadline, f"{span} waits behind its sequence 0", behind=True)
    if moment.now < moment.gap_deadline:
        return _wait(moment.gap_deadline, f"{span} waits for sequence 0 to arrive", beyond=True)
    return _beyond(
        errors.OutOfOrderSequenceNumber(
            f"producer {attempt.producer_id} moved from epoch {older} to {attempt.epoch} "
            f"on {attempt.where}: a new epoch must start at sequence 0, got {base}"
        )
    )
