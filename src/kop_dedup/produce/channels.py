"""Channels: one Pulsar producer name on one partition topic, opened, adopted, resynced,
evicted and reaped by the :class:`ChannelManager`.

A batch *leases* its channel for as long as it is inside the sidecar
(:meth:`ChannelManager.lease` / :meth:`~ChannelManager.release`, both synchronous). A
channel is closed only when nobody holds a lease and nothing is in flight, and the
check and the removal happen in the same event-loop step, so a batch can never pick up
a channel that is being closed. A new channel for the same name waits until the old
producer is closed (the broker refuses a second holder of a name).

The Pulsar producers held at once (open channels, and producers still closing) never
pass ``max_open`` (:meth:`ChannelManager.acquire`): a batch for a name without a channel
closes the least recently used idle one and waits for its close, or for one to fall
idle, until its deadline, then is answered REQUEST_TIMED_OUT (retriable); a name closed
this way takes the broker's mark again when it opens, as after an idle close.

What outlives a channel, bounded: the highest sequence each name stored and where a
producer started (:class:`Remembered`), and the newest epoch of each producer id with
state on each partition. The broker stays the authority; this memory only catches the
broker losing its dedup state, and keeps a new epoch starting at 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kop_dedup import errors
from kop_dedup.bounded import BoundedMap
from kop_dedup.produce.channel import Channel, ChannelKey
from kop_dedup.protocol.records import from_pulsar
from kop_dedup.protocol.rules import ChannelState
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.producers import Publisher, PulsarProducer

__all__ = ["Channel", "ChannelKey", "ChannelManager", "Remembered"]

log = logging.getLogger(__name__)

_CLOSE_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class Remembered:
    """What the sidecar knew of a name when its channel closed."""

    persisted: int
    floor: int | None


StateLost = Callable[[Channel, int | None, int], None]
"""Told when a channel opens and the broker knows less than the sidecar remembers:
(channel, the broker's mark, the remembered mark)."""


class ChannelManager:
    def __init__(
        self,
        publisher: Publisher,
        admin: PulsarAdmin,
        naming: Naming,
        *,
        queue_records: int,
        max_open: int,
        idle_seconds: float,
        remember: int,
        on_state_lost: StateLost,
    ) -> None:
        self._publisher, self._admin, self._naming = publisher, admin, naming
        self._queue_records = queue_records
        self._max_open = max_open
        self._idle_seconds = idle_seconds
        self._on_state_lost = on_state_lost
        self._channels: dict[ChannelKey, Channel] = {}
        self._closing: dict[ChannelKey, asyncio.Task[None]] = {}
        self._remembered = BoundedMap[ChannelKey, Remembered](remember)
        self._epoch_with_state = BoundedMap[tuple[str, int], int](remember)
        self._closing_count = 0
        """Producers whose close has not finished (``_closing`` keeps the last per key)."""
        self._room: deque[asyncio.Future[bool]] = deque()
        """Batches waiting for a producer to close or fall idle (:meth:`acquire`), in the
        order they came; a change wakes the first (True), its deadline each (False)."""
        self.peak_held = 0
        """The most Pulsar producers held at once since start (open or closing)."""
        self._reaper: asyncio.Task[None] | None = None
        self._stopping = False

    # -- leases ----------------------------------------------------------------------

    def held(self) -> int:
        """Pulsar producers held (channels, opened or not, and producers still closing)."""
        return len(self._channels) + self._closing_count

    async def acquire(self, key: ChannelKey, topic: str, deadline: float) -> Channel:
        """:meth:`lease`, within ``max_open``: past it the least recently used idle
        channel closes and this waits for its close (or for one to fall idle) until
        ``deadline`` (then RequestTimedOut, retriable: nothing was handed to Pulsar).

        Batches wait in the order they came, and each change (a close finished, a
        channel fallen idle) wakes one of them, the first: it takes the room or closes
        the next idle channel. A woken batch that leaves without the room (its name
        came open meanwhile, it was cancelled) passes the turn on."""
        woken = False
        while key not in self._channels and self.held() >= self._max_open:
            if self._stopping:
                raise errors.NotLeaderOrFollower("the sidecar is shutting down; retry")
            # one close under way for each batch waiting, this one included
            if self._closing_count <= self.held() - self._max_open + len(self._room):
                self._retire_least_recent()
            loop = asyncio.get_running_loop()
            room: asyncio.Future[bool] = loop.create_future()
            self._room.append(room)
            timer = loop.call_later(max(deadline - time.monotonic(), 0), _expire, room)
            try:
                woken = await room
            except BaseException:
                if room.done() and not room.cancelled() and room.result():
                    self._room_changed()  # woken, but leaving: the next batch's turn
                raise
            finally:
                timer.cancel()
                if room.cancelled() or not room.done() or not room.result():  # listed still
                    with contextlib.suppress(ValueError):
                        self._room.remove(room)
            full = key not in self._channels and self.held() >= self._max_open
            if full and time.monotonic() >= deadline:
                raise errors.RequestTimedOut(
                    f"{self._max_open} Pulsar producers are open and busy "
                    "(KOP_DEDUP_MAX_OPEN_PRODUCERS); retry (it is safe)"
                )
        if woken and key in self._channels:  # another batch opened the name: pass it on
            self._room_changed()
        channel = self.lease(key, topic)
        self.peak_held = max(self.peak_held, self.held())
        return channel

    def _retire_least_recent(self) -> None:
        """Close the idle channel released longest ago: ``_channels`` is kept in the
        order of their last release (:meth:`release`), so it is usually the first."""
        for channel in self._channels.values():
            if channel.idle:
                self._retire(channel)
                return

    def _room_changed(self, *, every: bool = False) -> None:
        """A producer closed or a channel fell idle: room for one more, so the batch
        waiting longest looks (``every``: at shutdown, every one)."""
        while self._room:
            future = self._room.popleft()
            if not future.done():
                future.set_result(True)
                if not every:
                    return

    def lease(self, key: ChannelKey, topic: str = "") -> Channel:
        """The channel for ``key``, held until :meth:`release` (synchronous: no close
        can come in between)."""
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = Channel(key, topic)
            channel.users += 1
            self._evict_if_full()
            return channel
        channel.users += 1
        return channel

    def release(self, channel: Channel) -> None:
        channel.users -= 1
        channel.last_used = time.monotonic()
        key = channel.key
        if self._channels.get(key) is channel:  # the most recently released goes last
            del self._channels[key]
            self._channels[key] = channel
        if channel.moved:
            self._retire(channel)
        elif self._room and channel.idle:
            self._room_changed()

    def settled(self, channel: Channel, *, ok: bool) -> None:
        """A batch's receipt came (whoever still waited for it): a moved channel whose
        last batch in flight this was closes now, its name free for the new owner (its
        batch's caller may have left before, on a timeout: its release closed nothing)."""
        channel.settled(ok=ok)
        if channel.moved:
            self._retire(channel)
        elif self._room and channel.idle:
            self._room_changed()

    def retire_moved(self, moved: Callable[[ChannelKey], bool]) -> int:
        """Close the channels ``moved`` names (another node owns their partition or name
        now): the idle ones at once, the others once their last batch is answered. How
        many were closed now."""
        closed = 0
        for key, channel in list(self._channels.items()):
            if not channel.moved and moved(key):
                channel.moved = True
                closed += self._retire(channel)
        return closed

    async def forget_topic(self, topic: str) -> None:
        """Before a Kafka topic is deleted (``topic``: the partitioned topic's full name):
        close the producers on its partitions and wait for their close, so that none is
        disconnected by the delete and reconnects (a broker that creates topics on use
        would make the partition again under the name); its producers' remembered state
        goes too (a topic created again starts with none)."""
        prefix = f"{topic}-partition-"
        self.retire_moved(lambda key: key[0].startswith(prefix))
        for key in [k for k in self._remembered if k[0].startswith(prefix)]:
            self._remembered.pop(key)
        closing = [t for k, t in self._closing.items() if k[0].startswith(prefix)]
        await asyncio.gather(*closing, return_exceptions=True)

    def open_keys(self) -> list[ChannelKey]:
        """The keys of the open channels."""
        return list(self._channels)

    def __len__(self) -> int:
        return len(self._channels)

    def waiting_batches(self) -> int:
        """Batches waiting for their turn (a gap, earlier batches in flight, room)."""
        return sum(c.waiters for c in self._channels.values())

    def open_producers(self) -> int:
        return sum(1 for c in self._channels.values() if c.producer is not None)

    def notify_all(self) -> None:
        for channel in self._channels.values():
            channel.notify()

    def producers_on(self, topic: str) -> dict[tuple[int, int], int | None]:
        """(producer id, epoch) -> the highest extended sequence known stored (None:
        none yet) of every producer this sidecar has or had a channel for on a
        partition topic (the plain channel, producer id -1, left out)."""
        out: dict[tuple[int, int], int | None] = {}
        for (ptopic, pid, epoch), remembered in self._remembered.items():
            if ptopic == topic and pid >= 0:
                out[pid, epoch] = remembered.persisted
        for (ptopic, pid, epoch), channel in self._channels.items():
            if ptopic == topic and pid >= 0:
                out[pid, epoch] = channel.state.persisted
        return out

    # -- epochs with state on a partition -------------------------------------------

    def epoch_with_state(self, topic: str, producer_id: int) -> int | None:
        """The newest epoch of a producer id known to have state on a partition topic."""
        return self._epoch_with_state.get((topic, producer_id))

    def note_epoch_with_state(self, topic: str, producer_id: int, epoch: int) -> None:
        """An epoch has state on a partition; older epochs' idle channels there close."""
        newest = self._epoch_with_state.get((topic, producer_id))
        if newest is not None and newest >= epoch:
            return
        self._epoch_with_state[topic, producer_id] = epoch
        if newest is not None:
            for key, channel in list(self._channels.items()):
                if key[0] == topic and key[1] == producer_id and key[2] < epoch:
                    self._retire(channel)

    # -- opening -----------------------------------------------------------------------

    async def ensure_open(self, channel: Channel, deadline: float) -> None:
        """Open the channel's producer if it has none (bounded by ``deadline``)."""
        if channel.producer is not None:
            return
        async with channel.lock:
            if channel.producer is None:
                await self._open(channel, deadline)

    async def verify(self, channel: Channel, since: float, deadline: float) -> None:
        """Read the broker's mark for the channel's name again, unless it was read at or
        after ``since`` (monotonic), as a resync does.

        Another holder of the name may have stored more while the producer was
        disconnected (a pause past the keep-alive, a broker restart, an unload): the
        client reconnects it by itself, with no hook to tell, and the C++ client keeps
        its own last sequence id across a reconnection (``ProducerImpl::
        handleCreateProducer`` takes the broker's only while its own is -1), so only a
        producer created again reads the broker's mark.
        """
        if channel.mark_read < since:
            channel.state.broken = True  # every batch waits for the read, as after a failure
        await self.resync(channel, deadline)

    async def resync(self, channel: Channel, deadline: float) -> None:
        """After a failed send (or to read the broker's mark again, :meth:`verify`): wait
        for every answer, then reopen and take the broker's state (the failed batch's
        fate is in the broker's mark)."""
        async with channel.lock:
            if not channel.state.broken:
                return
            while channel.state.in_flight:
                if not await channel.wait_change(deadline - time.monotonic()):
                    raise errors.RequestTimedOut("waiting for earlier sends to settle")
            producer, channel.producer = channel.producer, None
            if producer is not None:
                await producer.close()
            await self._open(channel, deadline)
            channel.notify()

    async def _open(self, channel: Channel, deadline: float) -> None:
        """Open the channel's producer, waiting at most until ``deadline``.

        The creation runs as its own task, owned by the channel and never cancelled: a
        caller that gives up (its deadline passed while the broker was slow) leaves it
        running, and the next caller awaits the same creation. A creation cancelled
        half-way would leave a producer that the broker has registered under this name
        but nobody holds, and every later attempt would be refused ProducerBusy until
        the connection dies.
        """
        task = channel.opening
        if task is None:
            started = time.monotonic()
            task = channel.opening = asyncio.ensure_future(self._create(channel))
            task.add_done_callback(lambda t: self._opened(channel, t, started))
        try:
            await asyncio.wait_for(asyncio.shield(task), max(deadline - time.monotonic(), 0.001))
        except TimeoutError as exc:
            raise errors.RequestTimedOut(
                f"creating the Pulsar producer on {channel.key[0]}; retry (it is safe)"
            ) from exc

    async def _create(self, channel: Channel) -> PulsarProducer:
        ptopic, pid, epoch = channel.key
        name = None if pid < 0 else self._naming.producer_name(pid, epoch)
        previous = self._closing.get(channel.key)
        if previous is not None:  # the broker refuses a second holder of the name
            await asyncio.wait({previous}, timeout=_CLOSE_WAIT_S)
        try:
            if pid >= 0 and channel.topic:  # journals (no Kafka topic) live where dedup is on
                await self._check_deduplication(channel)
            return await self._publisher.create(ptopic, name, capacity=self._queue_records)
        except Exception as exc:
            raise translate(exc, f"creating producer {name} on {ptopic}") from exc

    async def _check_deduplication(self, channel: Channel) -> None:
        enabled, source = await self._admin.effective_deduplication(channel.topic)
        if not enabled:
            log.error(
                "deduplication is off for topic %s (by its %s policy): idempotent produce refused",
                channel.topic,
                source,
                extra={"topic": channel.topic, "dedup_source": source},
            )
            raise errors.KafkaStorageError(
                f"deduplication is off for topic {channel.topic!r} (set by the {source} "
                "policy), so a retry would be stored twice; idempotent produce is refused "
                "until it is on again (pulsar-admin topics set-deduplication "
                f"{self._naming.topic(channel.topic)} --enable, or remove the override)"
            )

    def _opened(
        self, channel: Channel, task: asyncio.Future[PulsarProducer], started: float
    ) -> None:
        """Adopt a finished creation, whoever still waits for it; close an orphan. The
        state is the broker's mark, or what the sidecar stored when that is more (what a
        closed channel of the name left, or this channel's own before a resync)."""
        channel.opening = None
        if self._room and channel.idle:
            self._room_changed()
        if task.cancelled() or task.exception() is not None:
            channel.notify()
            return
        producer = task.result()
        if self._stopping or channel.closed:
            self._close_later(channel.key, producer)
            return
        channel.producer = producer
        channel.mark_read = started
        ptopic, pid, epoch = channel.key
        if pid >= 0:
            broker = from_pulsar(producer.last_sequence_id())
            memory = self._remembered.get(channel.key)
            remembered, floor = (None, None) if memory is None else (memory.persisted, memory.floor)
            own = channel.state
            if own.persisted is not None and (remembered is None or own.persisted > remembered):
                remembered, floor = own.persisted, own.floor
            recent = own.recent
            channel.state = ChannelState.from_broker(broker, remembered, floor)
            channel.state.recent.extend(recent)
            if remembered is not None and (broker is None or broker < remembered):
                self._on_state_lost(channel, broker, remembered)
            if channel.state.has_state:
                self.note_epoch_with_state(ptopic, pid, epoch)
        channel.notify()

    # -- closing -------------------------------------------------------------------------

    def _retire(self, channel: Channel, *, force: bool = False) -> bool:
        """Close an idle channel now: removed and marked closed in this same step
        (``force``: at shutdown, whatever still holds it has been answered)."""
        if channel.closed or not (force or channel.idle):
            return False
        if self._channels.get(channel.key) is channel:
            del self._channels[channel.key]
        channel.closed = True
        state = channel.state
        if channel.key[1] >= 0 and state.persisted is not None:
            self._remembered[channel.key] = Remembered(state.persisted, state.floor)
        producer, channel.producer = channel.producer, None
        if producer is not None:
            self._close_later(channel.key, producer)
        channel.notify()
        return True

    def _close_later(self, key: ChannelKey, producer: PulsarProducer) -> None:
        task = asyncio.create_task(producer.close(), name=f"close {producer.name}")
        self._closing[key] = task
        self._closing_count += 1

        def done(t: asyncio.Task[None]) -> None:
            self._closing_count -= 1
            if self._closing.get(key) is t:
                del self._closing[key]
            self._room_changed()

        task.add_done_callback(done)

    def _evict_if_full(self) -> None:
        excess = len(self._channels) - self._max_open
        if excess <= 0:
            return
        idle = sorted((c for c in self._channels.values() if c.idle), key=lambda c: c.last_used)
        for channel in idle[:excess]:
            self._retire(channel)

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle(), name="kop-dedup-reaper")

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(self._idle_seconds / 2, 30.0))
            cutoff = time.monotonic() - self._idle_seconds
            victims = [c for c in self._channels.values() if c.idle and c.last_used < cutoff]
            closed = sum(self._retire(c) for c in victims)
            if closed:
                log.info("closed %d idle producers", closed)

    async def close(self, drain_s: float = 10.0) -> None:
        """Let in-flight batches finish (bounded), then close every producer."""
        self._stopping = True
        self._room_changed(every=True)
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        deadline = time.monotonic() + drain_s
        # many channels, once, at shutdown: a short poll is simpler than an event each
        while any(not c.idle for c in self._channels.values()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for channel in list(self._channels.values()):
            self._retire(channel, force=True)
        if self._closing:
            await asyncio.wait(set(self._closing.values()), timeout=_CLOSE_WAIT_S)


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
