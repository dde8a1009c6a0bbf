"""The produce path: one Kafka batch in, one Kafka answer out.

``ProduceService.produce(batch, deadline)`` runs Kafka's broker checks in
order: shape, topic and partition, epoch fencing, then sequence rules through
a :class:`Channel` (one Pulsar producer name on one partition topic), whose
state comes from the broker when the channel opens. The broker's receipt is
the final word: -1/-1 means DUPLICATE_SEQUENCE_NUMBER.

Waiting is event-driven: every change to a channel wakes the batches waiting
on it, which decide again (see sequencer.decide).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from kop_dedup import errors
from kop_dedup.coordination.registry import Registry
from kop_dedup.observability.stats import Stats
from kop_dedup.protocol.records import KafkaBatch, check_shape, from_pulsar, to_pulsar
from kop_dedup.protocol.rules import (
    EpochVerdict,
    SequenceState,
    Verdict,
    decide,
    epoch_verdict,
    fresh_start,
)
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.naming import Naming, validate_topic
from kop_dedup.pulsar.producers import (
    BatchReceipt,
    Publisher,
    PulsarProducer,
    failure_result,
    translate,
)
from kop_dedup.settings import Settings

__all__ = ["BatchResult", "Channel", "ProduceService"]

log = logging.getLogger("kop_dedup.produce")

ChannelKey = tuple[str, int, int]  # (partition topic, producer id, epoch); pid -1: plain


@dataclass(frozen=True, slots=True)
class BatchResult:
    topic: str
    partition: int
    error: errors.KafkaError | None = None
    message_id: str | None = None

    @property
    def error_code(self) -> int:
        return 0 if self.error is None else self.error.errno

    @property
    def error_name(self) -> str:
        return "NONE" if self.error is None else self.error.name


class Channel:
    """One Pulsar producer name on one partition topic, and what is known of it."""

    __slots__ = (
        "_changed",
        "_open_lock",
        "arrived",
        "broken",
        "key",
        "last_used",
        "opening",
        "producer",
        "state",
        "waiters",
    )

    def __init__(self, key: ChannelKey) -> None:
        self.key = key
        self.state = SequenceState.fresh()
        self.producer: PulsarProducer | None = None
        self.opening: asyncio.Future[PulsarProducer] | None = None
        """The producer's creation while it runs (see ProduceService._open)."""
        self.broken = False
        self.last_used = time.monotonic()
        self.waiters = 0
        self.arrived: list[int] = []
        """Base sequences of the batches inside the sidecar for this channel, from arrival
        to answer: a gap whose next batch has arrived is not a gap, only a wait."""
        self._changed = asyncio.Event()
        self._open_lock = asyncio.Lock()

    @property
    def outstanding(self) -> int:
        return 0 if self.producer is None else self.producer.outstanding

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, within: float) -> bool:
        """Wait up to ``within`` seconds for something to change; False if nothing did."""
        event = self._changed
        self.waiters += 1
        try:
            await asyncio.wait_for(event.wait(), max(within, 0))
        except TimeoutError:
            return False
        finally:
            self.waiters -= 1
        return True

    @property
    def idle(self) -> bool:
        return not self.arrived and self.waiters == 0 and self.outstanding == 0


class ProduceService:
    def __init__(
        self,
        settings: Settings,
        publisher: Publisher,
        admin: PulsarAdmin,
        registry: Registry,
        stats: Stats,
    ) -> None:
        self.settings = settings
        self.naming = Naming(settings.tenant, settings.namespace, settings.producer_name_prefix)
        self.publisher, self.admin, self.registry, self.stats = publisher, admin, registry, stats
        self.channels: dict[ChannelKey, Channel] = {}
        self._latest_epoch: dict[tuple[str, int], int] = {}
        """(partition topic, pid) -> the newest epoch that has state there."""
        self._floors: dict[ChannelKey, int] = {}
        """Where producers that started above sequence 0 started (rare: Kafka clients
        start at 0 unless their state expired), so nothing below is called stored."""
        self._reaper: asyncio.Task[None] | None = None
        self.closing = False

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle(), name="kop-dedup-reaper")

    def begin_shutdown(self) -> None:
        """Stop taking batches; batches still waiting for their turn get a retriable code
        now (their predecessors may never reach this sidecar again), batches already
        handed to Pulsar finish."""
        self.closing = True
        for channel in self.channels.values():
            channel.notify()

    async def close(self) -> None:
        """Stop: let in-flight batches finish (bounded), then close every producer."""
        self.closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        deadline = time.monotonic() + 10
        # many channels, once, at shutdown: a short poll is simpler than an event each
        while any(not c.idle for c in self.channels.values()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.gather(*(self._close_channel(c) for c in list(self.channels.values())))

    async def _close_channel(self, channel: Channel) -> None:
        self.channels.pop(channel.key, None)
        producer, channel.producer = channel.producer, None
        if producer is not None:
            await producer.close()
        channel.notify()

    async def _reap_idle(self) -> None:
        idle_s = self.settings.producer_idle_seconds
        while True:
            await asyncio.sleep(min(idle_s / 2, 30.0))
            now = time.monotonic()
            victims = [c for c in self.channels.values() if c.idle and now - c.last_used > idle_s]
            for channel in victims:
                await self._close_channel(channel)
            if victims:
                log.info("closed %d idle producers", len(victims))

    def waiting_batches(self) -> int:
        """Batches inside the sidecar waiting for their turn (a gap, or earlier ones in flight)."""
        return sum(c.waiters for c in self.channels.values())

    def open_producers(self) -> int:
        return sum(1 for c in self.channels.values() if c.producer is not None)

    # -- produce -----------------------------------------------------------------

    async def produce(self, batch: KafkaBatch, deadline: float) -> BatchResult:
        """Answer one batch; never raises for a per-batch problem."""
        started = time.monotonic()
        try:
            message_id = await self._produce(batch, deadline)
            result = BatchResult(batch.topic, batch.partition, None, message_id)
        except errors.KafkaError as exc:
            result = BatchResult(batch.topic, batch.partition, exc, None)
        except AdminError as exc:
            result = BatchResult(
                batch.topic, batch.partition, errors.KafkaStorageError(str(exc)), None
            )
        except (OSError, ConnectionError) as exc:  # admin API unreachable
            result = BatchResult(
                batch.topic,
                batch.partition,
                errors.NotLeaderOrFollower(f"Pulsar admin unreachable: {exc}"),
                None,
            )
        except Exception as exc:  # a Pulsar failure on a path not translated above
            log.exception("unexpected failure producing to %s-%d", batch.topic, batch.partition)
            result = BatchResult(batch.topic, batch.partition, translate(exc, "produce"), None)
        elapsed = time.monotonic() - started
        self.stats.record(
            batch.topic,
            batch.producer_id,
            batch.producer_epoch,
            result.error,
            len(batch.records),
            elapsed,
        )
        # every answer other than NONE at INFO; stored batches only at DEBUG: a JSON
        # line per stored batch cost about 5% of the sidecar's CPU under load
        level = logging.DEBUG if result.error is None else logging.INFO
        if not log.isEnabledFor(level):
            return result
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
                "result": result.error_name,
                "latency_ms": round(elapsed * 1000, 2),
            },
        )
        return result

    async def _produce(self, batch: KafkaBatch, deadline: float) -> str | None:
        if self.closing:
            raise errors.NotLeaderOrFollower("the sidecar is shutting down; retry elsewhere")
        validate_topic(batch.topic)
        check_shape(
            batch,
            max_records=self.settings.max_batch_records,
            max_bytes=self.settings.max_batch_bytes,
        )
        count = await self.admin.partitions(
            batch.topic,
            create_with=self.settings.default_partitions
            if self.settings.auto_create_topics
            else None,
        )
        if not 0 <= batch.partition < count:
            raise errors.UnknownTopicOrPartition(
                f"topic {batch.topic!r} has partitions 0..{count - 1}; got {batch.partition}"
            )
        ptopic = self.naming.partition_topic(batch.topic, batch.partition)
        if not batch.idempotent:
            return await self._produce_plain(ptopic, batch, deadline)
        return await self._produce_idempotent(ptopic, batch, deadline)

    async def _produce_plain(self, ptopic: str, batch: KafkaBatch, deadline: float) -> str | None:
        channel = await self._channel((ptopic, -1, -1), deadline)
        assert channel.producer is not None
        fut = channel.producer.send_batch(batch, 0)
        receipt = await self._await_receipt(channel, fut, deadline, None)
        return receipt.message_id

    async def _check_epoch(self, channel: Channel, batch: KafkaBatch, deadline: float) -> None:
        """Refuse a fenced epoch; record a newer one durably before it is used.

        The registry is caught up first (a coalesced read barrier) before every
        batch with ``strict_fencing``, else when the channel has no producer yet,
        so an epoch fenced through any sidecar is refused here. Both the catch-up
        and the durable write are bounded by the batch's deadline, and Pulsar's
        failures become retriable Kafka codes.
        """
        try:
            if self.settings.strict_fencing or channel.producer is None:
                await self._bounded(self.registry.epochs.barrier(), deadline)
            await self._fence(batch, deadline)
        except errors.KafkaError:
            raise
        except TimeoutError as exc:
            raise errors.RequestTimedOut(
                "reading the producer epochs from Pulsar timed out; retry (it is safe)"
            ) from exc
        except Exception as exc:
            raise translate(exc, "reading the producer epochs") from exc

    @staticmethod
    async def _bounded(awaitable: Awaitable[object], deadline: float) -> None:
        """Await a shared or durable operation until ``deadline`` without cancelling it."""
        await asyncio.wait_for(asyncio.shield(awaitable), max(deadline - time.monotonic(), 0.001))

    async def _fence(self, batch: KafkaBatch, deadline: float) -> None:
        pid, epoch = batch.producer_id, batch.producer_epoch
        verdict = epoch_verdict(self.registry.epochs.highest(pid), epoch)
        if verdict is EpochVerdict.FENCED:
            raise errors.InvalidProducerEpoch(
                f"producer {pid} epoch {epoch} is fenced: epoch "
                f"{self.registry.epochs.highest(pid)} has been seen"
            )
        if verdict is EpochVerdict.NEWER and epoch > 0:
            await self._bounded(self.registry.epochs.raise_to(pid, epoch), deadline)

    async def _produce_idempotent(
        self, ptopic: str, batch: KafkaBatch, deadline: float
    ) -> str | None:
        key = (ptopic, batch.producer_id, batch.producer_epoch)
        channel = self._get_channel(key)
        channel.arrived.append(batch.base_sequence)
        try:
            await self._check_epoch(channel, batch, deadline)
            await self._ensure_open(channel, deadline)
            self._retire_older_epochs(ptopic, batch)
            if not channel.state.has_state and batch.base_sequence != 0:
                older = self._latest_epoch.get((ptopic, batch.producer_id))
                if older is not None and older < batch.producer_epoch:
                    raise errors.OutOfOrderSequenceNumber(
                        f"producer {batch.producer_id} moved from epoch {older} to "
                        f"{batch.producer_epoch} on {batch.topic}-{batch.partition}: a new "
                        f"epoch must start at sequence 0, got {batch.base_sequence}"
                    )
            window = self.settings.reorder_window_ms / 1000
            gap_deadline = min(deadline, time.monotonic() + window)
            return await self._sequence(channel, batch, deadline, gap_deadline)
        finally:
            channel.arrived.remove(batch.base_sequence)
            channel.notify()  # a batch waiting on this one's sequence decides again

    async def _sequence(
        self, channel: Channel, batch: KafkaBatch, deadline: float, gap_deadline: float
    ) -> str | None:
        """Wait for the batch's turn, send it, and turn the receipt into an answer.

        Each turn reads the clock once: the verdict and how long to wait must agree
        on whether the reorder window is over. (They read it separately once, and a
        turn that began a hair before the window's end, as asyncio's timers may
        wake, decided "wait for the window" and then waited for the deadline.)
        """
        while True:
            now = channel.last_used = time.monotonic()
            if channel.broken:
                await self._reset(channel, deadline)
                continue
            state = channel.state
            first, last = state.place(batch.base_sequence, len(batch.records))
            if state.has_state:
                verdict = decide(state, first, last, channel.outstanding)
            else:
                verdict = fresh_start(batch.base_sequence, now >= gap_deadline, channel.arrived)
            if verdict is Verdict.SEND or verdict is Verdict.RESEND_FOR_VERDICT:
                return await self._send(
                    channel, batch, last, deadline, resend=verdict is Verdict.RESEND_FOR_VERDICT
                )
            if verdict is Verdict.OUT_OF_ORDER and state.floor is not None and first < state.floor:
                raise errors.OutOfOrderSequenceNumber(
                    f"batch {batch.base_sequence}..{batch.last_sequence} lies below sequence "
                    f"{self._kafka_seq(state.floor)}, where producer {batch.producer_id} epoch "
                    f"{batch.producer_epoch} started on {batch.topic}-{batch.partition}; it was "
                    "never stored"
                )
            if verdict is Verdict.OUT_OF_ORDER:
                raise errors.OutOfOrderSequenceNumber(
                    f"batch {batch.base_sequence}..{batch.last_sequence} overlaps the stored "
                    f"sequences only in part (last stored: {self._kafka_seq(state.persisted)})"
                )
            if self.closing:
                raise errors.NotLeaderOrFollower(
                    "the sidecar is shutting down; retry the batch on another (it is safe)"
                )
            gap = not state.has_state or first > (state.sent if state.sent is not None else first)
            expected = self._kafka_seq((state.sent or 0) + 1)
            if gap and state.has_state and now >= gap_deadline and expected not in channel.arrived:
                raise errors.OutOfOrderSequenceNumber(
                    f"expected sequence {expected} next from "
                    f"producer {batch.producer_id} on {batch.topic}-{batch.partition}, "
                    f"got {batch.base_sequence}; the gap did not fill within "
                    f"{self.settings.reorder_window_ms} ms"
                )
            limit = gap_deadline if gap and now < gap_deadline else deadline
            if not await channel.wait_change(limit - now) and limit >= deadline:
                raise errors.RequestTimedOut(
                    f"batch {batch.base_sequence}..{batch.last_sequence} waited for earlier "
                    "batches of the same producer that are still in flight"
                )

    async def _send(
        self,
        channel: Channel,
        batch: KafkaBatch,
        last: int,
        deadline: float,
        *,
        resend: bool,
    ) -> str | None:
        producer = channel.producer
        assert producer is not None
        if not resend:
            channel.state.on_sent(last, first=last - len(batch.records) + 1)
            if channel.state.floor is not None:  # kept here: survives the channel closing idle
                self._floors[channel.key] = channel.state.floor
        fut = producer.send_batch(batch, to_pulsar(last))
        self._latest_epoch[(producer.topic, batch.producer_id)] = batch.producer_epoch
        receipt = await self._await_receipt(channel, fut, deadline, last)
        if receipt.duplicate:
            raise errors.DuplicateSequenceNumber(
                f"sequences {batch.base_sequence}..{batch.last_sequence} of producer "
                f"{batch.producer_id} epoch {batch.producer_epoch} were already "
                f"stored on {batch.topic}-{batch.partition}"
            )
        return receipt.message_id

    @staticmethod
    def _kafka_seq(extended: int | None) -> int | None:
        return None if extended is None else extended % (1 << 31)

    async def _await_receipt(
        self,
        channel: Channel,
        fut: asyncio.Future[BatchReceipt],
        deadline: float,
        last: int | None,
    ) -> BatchReceipt:
        """Await the broker's answer; state is updated when it comes, even after we gave up."""

        def settle(f: asyncio.Future[BatchReceipt]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is None:
                receipt = f.result()
                if last is not None and not receipt.duplicate:
                    channel.state.on_persisted(last)
            elif last is not None:
                channel.broken = True
                channel.state.on_failed()
            channel.notify()

        fut.add_done_callback(settle)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), deadline - time.monotonic())
        except TimeoutError as exc:
            raise errors.RequestTimedOut(
                "Pulsar did not acknowledge the batch in time; retry it (it is safe)"
            ) from exc
        except errors.KafkaError:
            raise
        except Exception as exc:
            raise translate(failure_result(exc), "publish") from exc

    async def _reset(self, channel: Channel, deadline: float) -> None:
        """After a failed send: wait for every answer, then reconnect and resync."""
        async with channel._open_lock:
            if not channel.broken:
                return
            while channel.outstanding:
                if not await channel.wait_change(deadline - time.monotonic()):
                    raise errors.RequestTimedOut("waiting for earlier failed sends to settle")
            producer, channel.producer = channel.producer, None
            if producer is not None:
                await producer.close()
            channel.broken = False
            await self._open(channel, deadline)
            channel.notify()

    def _get_channel(self, key: ChannelKey) -> Channel:
        channel = self.channels.get(key)
        if channel is None:
            channel = self.channels[key] = Channel(key)
            self._evict_if_full()
        return channel

    async def _ensure_open(self, channel: Channel, deadline: float) -> None:
        if channel.producer is None:
            async with channel._open_lock:
                if channel.producer is None:
                    await self._open(channel, deadline)

    async def _channel(self, key: ChannelKey, deadline: float) -> Channel:
        channel = self._get_channel(key)
        await self._ensure_open(channel, deadline)
        return channel

    async def _open(self, channel: Channel, deadline: float) -> None:
        """Open the channel's producer, waiting at most until ``deadline``.

        The creation runs as its own task, owned by the channel and never
        cancelled: a caller that gives up (its deadline passed while the broker
        was slow) leaves it running, and the next caller awaits the same
        creation. A creation cancelled half-way would leave a producer that the
        broker has registered under this name but nobody holds, and every later
        attempt would be refused ProducerBusy until the connection dies.
        """
        task = channel.opening
        if task is None:
            task = channel.opening = asyncio.ensure_future(self._create(channel))
            task.add_done_callback(lambda t: self._opened(channel, t))
        try:
            await self._bounded(task, deadline)
        except TimeoutError as exc:
            raise errors.RequestTimedOut(
                f"creating the Pulsar producer on {channel.key[0]}; retry (it is safe)"
            ) from exc

    async def _create(self, channel: Channel) -> PulsarProducer:
        ptopic, pid, epoch = channel.key
        name = None if pid < 0 else self.naming.producer_name(pid, epoch)
        try:
            return await self.publisher.create(ptopic, name)
        except errors.KafkaError:
            raise
        except Exception as exc:
            raise translate(exc, f"creating producer {name} on {ptopic}") from exc

    def _opened(self, channel: Channel, task: asyncio.Future[PulsarProducer]) -> None:
        """Adopt a finished creation, whoever still waits for it; close an orphan."""
        channel.opening = None
        if task.cancelled() or task.exception() is not None:
            channel.notify()
            return
        producer = task.result()
        if self.closing or self.channels.get(channel.key) is not channel:
            asyncio.create_task(producer.close())  # noqa: RUF006 - the channel is gone
            return
        channel.producer = producer
        ptopic, pid, epoch = channel.key
        if pid >= 0:
            channel.state = SequenceState.from_broker(
                from_pulsar(producer.last_sequence_id()), self._floors.get(channel.key)
            )
            if channel.state.has_state:
                key = (ptopic, pid)
                self._latest_epoch[key] = max(self._latest_epoch.get(key, -1), epoch)
        channel.notify()

    def _retire_older_epochs(self, ptopic: str, batch: KafkaBatch) -> None:
        pid, epoch = batch.producer_id, batch.producer_epoch
        for key, channel in list(self.channels.items()):
            older = key[0] == ptopic and key[1] == pid and key[2] < epoch
            if older and channel.idle:
                asyncio.create_task(self._close_channel(channel))  # noqa: RUF006

    def _evict_if_full(self) -> None:
        limit = self.settings.max_open_producers
        if len(self.channels) <= limit:
            return
        idle = sorted((c for c in self.channels.values() if c.idle), key=lambda c: c.last_used)
        for channel in idle[: len(self.channels) - limit]:
            asyncio.create_task(self._close_channel(channel))  # noqa: RUF006
