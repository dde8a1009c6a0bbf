"""The produce path: one Kafka batch in, one Kafka answer out.

``ProduceService.produce(batch, deadline)`` checks the batch's shape, topic and
partition, then carries out the verdicts of the rules machine
(:func:`kop_dedup.protocol.rules.decide`) on the batch's channel until one is final:
catch up with the recorded epochs, record a new epoch, wait for a change, resync after
a failed send, or hand the batch to Pulsar. Every decision is taken again after
anything awaited, and the one that hands a batch to Pulsar runs in the same event-loop
step as the send, so what was checked is what holds when Pulsar gets the batch. The
broker's receipt is the final word: -1/-1 means DUPLICATE_SEQUENCE_NUMBER.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from kop_dedup import errors
from kop_dedup.coordination.registry import EpochRegistry
from kop_dedup.observability.stats import Stats
from kop_dedup.produce.channels import Channel, ChannelManager
from kop_dedup.protocol.records import SEQ_MODULUS, KafkaBatch, check_shape, to_pulsar
from kop_dedup.protocol.rules import Act, Attempt, Moment, Verdict, decide
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import Naming, validate_topic
from kop_dedup.pulsar.producers import BatchReceipt, PartialBatch, Publisher
from kop_dedup.pulsar.wire import entry_size_bound
from kop_dedup.settings import Settings

__all__ = ["BatchResult", "ProduceService"]

log = logging.getLogger("kop_dedup.produce")
_T = TypeVar("_T")
_NONE: dict[int, errors.KafkaError] = {}
"""No refusals (shared, never written)."""

Journal = tuple[str, dict[str, str]]
"""(journal partition topic, properties for every record) of a transactional batch."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The answer for one batch. ``message_id`` is the first record's position: set
    when stored, and for a 46 when the sidecar knows where the original went."""

    topic: str
    partition: int
    error: errors.KafkaError | None = None
    message_id: str | None = None

    @property
    def error_code(self) -> int:
        return errors.NONE_ERRNO if self.error is None else self.error.errno

    @property
    def error_name(self) -> str:
        return errors.NONE_NAME if self.error is None else self.error.name


async def _within(future: asyncio.Future[_T], deadline: float) -> _T:
    """``future``'s outcome, waiting until ``deadline`` (monotonic) at most, then
    TimeoutError. Never cancels ``future``: others may wait on it, and its callbacks
    must run (the cost of ``wait_for(shield(...))`` without its task and futures)."""
    if not future.done():
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(_: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        future.add_done_callback(wake)
        timer = loop.call_later(max(deadline - time.monotonic(), 0.001), wake, None)
        try:
            await waiter
        finally:
            timer.cancel()
            future.remove_done_callback(wake)
        if not future.done():
            raise TimeoutError
    return future.result()


class ProduceService:
    def __init__(
        self,
        settings: Settings,
        publisher: Publisher,
        admin: PulsarAdmin,
        epochs: EpochRegistry,
        stats: Stats,
    ) -> None:
        self.settings = settings
        self.naming = Naming(settings.tenant, settings.namespace, settings.producer_name_prefix)
        self.admin, self.epochs, self.stats = admin, epochs, stats
        self.channels = ChannelManager(
            publisher,
            admin,
            self.naming,
            queue_records=settings.producer_queue_records,
            max_open=settings.max_open_producers,
            idle_seconds=settings.producer_idle_seconds,
            remember=settings.max_remembered_producers,
            on_state_lost=self._broker_forgot,
        )
        self.closing = False

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.channels.start()

    def begin_shutdown(self) -> None:
        """Stop taking batches; batches still waiting for their turn get a retriable code
        now (their predecessors may never reach this sidecar again), batches already
        handed to Pulsar finish."""
        self.closing = True
        self.channels.notify_all()

    async def close(self) -> None:
        """Stop: let in-flight batches finish (bounded), then close every producer."""
        self.closing = True
        await self.channels.close()

    def waiting_batches(self) -> int:
        """Batches inside the sidecar waiting for their turn (a gap, earlier ones in flight)."""
        return self.channels.waiting_batches()

    def open_producers(self) -> int:
        return self.channels.open_producers()

    # -- produce -----------------------------------------------------------------------

    async def produce(
        self, batch: KafkaBatch, deadline: float, journal: Journal | None = None
    ) -> BatchResult:
        """Answer one batch; never raises for a per-batch problem.

        ``journal``: a transactional batch goes to this journal partition topic, its
        records carrying these properties, instead of to its data partition (every
        idempotence rule holds there; it is counted under its data topic).
        """
        started = time.monotonic()
        error: errors.KafkaError | None
        try:
            error, message_id = await self._produce(batch, deadline, journal)
        except Exception as exc:
            error, message_id = translate(exc, "produce"), None
        elapsed = time.monotonic() - started
        self.stats.record(
            batch.topic, batch.producer_id, batch.producer_epoch, error, len(batch.records), elapsed
        )
        # every answer other than NONE at INFO; stored batches only at DEBUG: a JSON
        # line per stored batch cost about 5% of the sidecar's CPU under load
        level = logging.DEBUG if error is None else logging.INFO
        if log.isEnabledFor(level):
            log.log(
                level,
                "produce",
                extra={
                    "topic": batch.topic,
                    "partition": batch.partition,
                    "producer_id": batch.producer_id,
                    "epoch": batch.producer_epoch,
                    "base_sequence": batch.base_sequence,
                    "records": len(batch.records),
                    "result": errors.NONE_NAME if error is None else error.name,
                    "reason": None if error is None else error.message,
                    "latency_ms": round(elapsed * 1000, 2),
                },
            )
        return BatchResult(batch.topic, batch.partition, error, message_id)

    async def _produce(
        self, batch: KafkaBatch, deadline: float, journal: Journal | None
    ) -> tuple[errors.KafkaError | None, str | None]:
        if self.closing:
            raise errors.NotLeaderOrFollower("the sidecar is shutting down; retry elsewhere")
        s = self.settings
        validate_topic(batch.topic)
        check_shape(batch, max_records=s.max_batch_records, max_bytes=s.max_batch_bytes)
        if (size := entry_size_bound(batch)) > s.pulsar_max_message_bytes:
            raise errors.MessageTooLarge(
                f"the batch's Pulsar entry could reach {size} bytes; the broker takes at most "
                f"{s.pulsar_max_message_bytes} (KOP_DEDUP_PULSAR_MAX_MESSAGE_BYTES): split it"
            )
        count = await self.partition_count(
            batch.topic,
            deadline,
            create_with=s.default_partitions if s.auto_create_topics else None,
        )
        if not 0 <= batch.partition < count:
            raise errors.UnknownTopicOrPartition(
                f"topic {batch.topic!r} has partitions 0..{count - 1}; got {batch.partition}"
            )
        if journal is not None:  # admitted: its producer is the transaction's (admission.py)
            return await self._produce_idempotent(journal[0], batch, deadline, journal[1])
        ptopic = self.naming.partition_topic(batch.topic, batch.partition)
        if not batch.idempotent:
            return None, await self._produce_plain(ptopic, batch, deadline)
        return await self._produce_idempotent(ptopic, batch, deadline)

    async def _produce_plain(self, ptopic: str, batch: KafkaBatch, deadline: float) -> str | None:
        channel = await self.channels.acquire((ptopic, -1, -1), batch.topic, deadline)
        try:
            await self.channels.ensure_open(channel, deadline)
            count = len(batch.records)
            while (producer := channel.producer) is None or producer.room < count:
                if self.closing:
                    raise errors.NotLeaderOrFollower("the sidecar is shutting down; retry")
                if producer is None:
                    await self.channels.ensure_open(channel, deadline)
                elif not await channel.wait_change(deadline - time.monotonic()):
                    raise errors.RequestTimedOut("the Pulsar producer's queue stayed full")
            receipt = await self._hand(channel, batch, 0, deadline)
            return receipt.message_id
        finally:
            self.channels.release(channel)

    async def _produce_idempotent(
        self,
        ptopic: str,
        batch: KafkaBatch,
        deadline: float,
        extra: dict[str, str] | None = None,
    ) -> tuple[errors.KafkaError | None, str | None]:
        pid, epoch = batch.producer_id, batch.producer_epoch
        arrived_at = time.monotonic()
        # a journal's channel needs no dedup policy check: its namespace is the sidecar's
        topic = "" if extra else batch.topic
        channel = await self.channels.acquire((ptopic, pid, epoch), topic, deadline)
        channel.arrived.append(batch.base_sequence)
        if channel.refused:  # it is here again: batches behind it wait for it
            channel.refused.pop(batch.base_sequence, None)
        attempt = Attempt(
            pid, epoch, batch.base_sequence, len(batch.records), f"{batch.topic}-{batch.partition}"
        )
        strict = self.settings.strict_fencing
        fresh = not strict and channel.producer is not None
        arriving, handed = True, False
        window = self.settings.reorder_window_ms / 1000
        gap_deadline = min(deadline, time.monotonic() + window)
        answer: errors.KafkaError | None = None
        try:
            await self.channels.ensure_open(channel, deadline)
            while True:
                now = channel.last_used = time.monotonic()
                producer = channel.producer
                moment = Moment(
                    now=now,
                    gap_deadline=gap_deadline,
                    deadline=deadline,
                    arrived=channel.arrived,
                    recorded_epoch=self.epochs.highest(pid),
                    epochs_fresh=fresh or self.epochs.fresh(now),
                    older_epoch_with_state=self.channels.epoch_with_state(ptopic, pid),
                    max_in_flight=self.settings.max_inflight_batches,
                    queue_room=0 if producer is None else producer.room,
                    closing=self.closing,
                    arriving=arriving,
                    refused=channel.refusals_since(now - window) if channel.refused else _NONE,
                    mark_current=channel.mark_read >= arrived_at,
                )
                arriving = False
                verdict = decide(channel.state, attempt, moment)
                act = verdict.act
                if act is Act.SEND or act is Act.RESEND:
                    handed = True  # from here on _hand and the receipt wake the others
                    return await self._send(channel, batch, verdict, deadline, extra)
                if act is Act.DUPLICATE:
                    if verdict.state_lost:
                        self._lost(channel, batch, "the sidecar's memory answered 46 instead")
                    return verdict.error, verdict.position
                if act is Act.REFUSE:
                    answer = verdict.error
                    return verdict.error, None
                fresh = await self._carry_out(channel, verdict, deadline, now, arrived_at)
                fresh = fresh or not strict
        except errors.KafkaError as exc:
            answer = exc
            raise
        finally:
            channel.arrived.remove(batch.base_sequence)
            if not handed:  # a batch waiting on this one's sequence decides again
                if answer is not None and answer.retriable:
                    channel.note_refused(batch.base_sequence, answer, time.monotonic())
                channel.notify()
            self.channels.release(channel)

    async def _carry_out(
        self, channel: Channel, verdict: Verdict, deadline: float, now: float, arrived_at: float
    ) -> bool:
        """Carry out a verdict that is not final; True if the epochs view is now fresh."""
        pid, epoch = channel.key[1], channel.key[2]
        if verdict.act is Act.WAIT:
            changed = await channel.wait_change(verdict.until - now, verdict.after)
            if not changed and verdict.until >= deadline:
                raise errors.RequestTimedOut(f"{verdict.reason}; retry (it is safe)")
            return False
        if verdict.act is Act.CATCH_UP:
            what = "reading the producer epochs"
            try:
                await _within(self.epochs.barrier_future(), deadline)
            except TimeoutError as exc:
                raise errors.RequestTimedOut(f"{what} timed out; retry (it is safe)") from exc
            except Exception as exc:
                raise translate(exc, what) from exc
            return True
        if verdict.act is Act.RECORD_EPOCH:
            await self._bounded(
                self.epochs.raise_to(pid, epoch), deadline, f"recording epoch {epoch}"
            )
            return False
        if verdict.act is Act.VERIFY:
            await self.channels.verify(channel, arrived_at, deadline)
            return False
        await self.channels.resync(channel, deadline)  # Act.RESYNC
        return False

    async def _send(
        self,
        channel: Channel,
        batch: KafkaBatch,
        verdict: Verdict,
        deadline: float,
        extra: dict[str, str] | None,
    ) -> tuple[errors.KafkaError | None, str | None]:
        resend = verdict.act is Act.RESEND
        receipt = await self._hand(
            channel,
            batch,
            to_pulsar(verdict.last),
            deadline,
            (verdict.first, verdict.last, resend),
            extra,
        )
        if receipt.duplicate:
            return errors.DuplicateSequenceNumber(
                f"sequences {batch.base_sequence}..{batch.last_sequence} of producer "
                f"{batch.producer_id} epoch {batch.producer_epoch} were already stored on "
                f"{batch.topic}-{batch.partition}"
            ), None
        if resend:
            self._lost(channel, batch, "the broker stored the retry again")
        return None, receipt.message_id

    async def _hand(
        self,
        channel: Channel,
        batch: KafkaBatch,
        sequence_id: int,
        deadline: float,
        span: tuple[int, int, bool] | None = None,
        extra: dict[str, str] | None = None,
    ) -> BatchReceipt:
        """Hand the batch to Pulsar in this step and await the receipt; the channel's state
        follows the answer when it comes, even after the batch gave up waiting.

        ``span``: (first, last, resend) in extended sequences for an idempotent batch.
        """
        producer = channel.producer
        if producer is None:  # resynced away between the decision and now: decide again
            channel.notify()
            raise errors.NotLeaderOrFollower("the Pulsar producer was being reopened; retry")
        state = channel.state
        try:
            # a journal entry (extra: the transaction's markers) is one message
            whole = extra is not None and self.settings.txn_journal_whole_batches
            send = producer.send_whole if whole else producer.send_batch
            future = send(batch, sequence_id, extra)
        except PartialBatch as exc:
            if span is not None:
                state.on_handed(span[0], span[1], resend=span[2])
                state.on_failed()
            channel.notify()
            raise self._partly_enqueued(batch, exc) from exc
        except Exception:
            channel.notify()  # nothing was enqueued: whoever waits on this batch decides again
            raise
        if span is None:
            state.in_flight += 1
        else:
            state.on_handed(span[0], span[1], resend=span[2])
            if not span[2]:
                self.channels.note_epoch_with_state(*channel.key)
                channel.handed(span[1])  # the batch after this one may go now, pipelined

        future.add_done_callback(self._settler(self.channels, channel, span))
        try:
            return await _within(future, deadline)
        except TimeoutError as exc:
            raise errors.RequestTimedOut(
                "Pulsar did not acknowledge the batch in time; retry it (it is safe)"
            ) from exc
        except Exception as exc:
            raise translate(exc, "publish") from exc

    @staticmethod
    def _settler(
        channels: ChannelManager, channel: Channel, span: tuple[int, int, bool] | None
    ) -> Callable[[asyncio.Future[BatchReceipt]], None]:
        """The receipt's effect on the channel's state, whoever still waits for it."""
        state = channel.state

        def settle(f: asyncio.Future[BatchReceipt]) -> None:
            ok = not f.cancelled() and f.exception() is None
            if span is None:
                state.in_flight -= 1
            elif ok:
                state.on_stored(span[0], span[1], f.result().message_id)
            else:
                state.on_failed()
            channels.settled(channel, ok=ok)

        return settle

    @staticmethod
    def _partly_enqueued(batch: KafkaBatch, exc: PartialBatch) -> errors.KafkaError:
        log.error(
            "batch partly enqueued",
            extra={"topic": batch.topic, "partition": batch.partition, "reason": str(exc)},
        )
        return errors.KafkaError(f"{exc}: the batch may be stored in part; do not retry it as is")

    async def partition_count(self, topic: str, deadline: float, *, create_with: int | None) -> int:
        """The topic's partition count (created with ``create_with`` when missing), asked
        of the admin API only when not known, and then no longer than until ``deadline``:
        past it RequestTimedOut, an admin API failing a retriable code (nothing stored)."""
        count = self.admin.known_partitions(topic)
        if count is None:
            count = await self._bounded(
                self.admin.partitions(topic, create_with=create_with),
                deadline,
                "reading the topic's partitions",
            )
        return count

    @staticmethod
    async def _bounded(awaitable: Awaitable[_T], deadline: float, what: str) -> _T:
        """Await a shared or durable operation until ``deadline`` without cancelling it."""
        try:
            return await asyncio.wait_for(
                asyncio.shield(awaitable), max(deadline - time.monotonic(), 0.001)
            )
        except TimeoutError as exc:
            raise errors.RequestTimedOut(f"{what} timed out; retry (it is safe)") from exc
        except Exception as exc:
            raise translate(exc, what) from exc

    # -- lost dedup state ------------------------------------------------------------------

    def _lost(self, channel: Channel, batch: KafkaBatch, consequence: str) -> None:
        """The broker no longer deduplicates this name: say so loudly, and count it."""
        log.error(
            "broker lost the deduplication state of producer %s on %s-%d for sequences %d..%d; %s",
            channel.key[1],
            batch.topic,
            batch.partition,
            batch.base_sequence,
            batch.last_sequence,
            consequence,
            extra={
                "producer_id": batch.producer_id,
                "epoch": batch.producer_epoch,
                "topic": batch.topic,
                "partition": batch.partition,
                "base_sequence": batch.base_sequence,
                "last_sequence": batch.last_sequence,
            },
        )
        self.stats.dedup_state_lost(
            batch.topic,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.last_sequence,
        )

    def _broker_forgot(self, channel: Channel, broker: int | None, remembered: int) -> None:
        ptopic, pid, epoch = channel.key
        log.error(
            "broker lost the deduplication state of producer %s epoch %s on %s: it knows "
            "sequence %s, this sidecar stored up to %d; retries up to there are answered "
            "from the sidecar's memory",
            pid,
            epoch,
            ptopic,
            "none" if broker is None else broker % SEQ_MODULUS,
            remembered % SEQ_MODULUS,
            extra={"producer_id": pid, "epoch": epoch, "topic": channel.topic},
        )
        self.stats.dedup_state_lost(channel.topic, pid, epoch, -1, remembered % SEQ_MODULUS)
