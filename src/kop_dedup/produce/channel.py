"""One channel: a Pulsar producer name on one partition topic, what is known of it,
and the batches waiting on it for a change.

The :class:`~kop_dedup.produce.channels.ChannelManager` opens, resyncs and closes
channels; the produce service leases one per batch and waits on it.
"""

from __future__ import annotations

import asyncio
import math
import time

from kop_dedup import errors
from kop_dedup.protocol.rules import ChannelState
from kop_dedup.pulsar.producers import PulsarProducer

__all__ = ["Channel", "ChannelKey"]

ChannelKey = tuple[str, int, int]
"""(partition topic, producer id, epoch); producer id -1: the plain channel of a partition."""

_REFUSALS_KEPT = 16


class Channel:
    """One Pulsar producer name on one partition topic, and what is known of it.

    Batches wait on a channel for a change (:meth:`wait_change`). A batch behind a gap
    waits for one change only, the hand of the batch just before it (``after``): it
    is woken by :meth:`handed` of that sequence and by :meth:`notify`, not by the
    hands, receipts and answers of the other batches in flight, which cannot change
    its verdict (each woken batch decides again, so waking them all cost several
    decisions and timers per batch).
    """

    __slots__ = (
        "_after",
        "_any",
        "arrived",
        "closed",
        "key",
        "last_used",
        "lock",
        "mark_read",
        "moved",
        "opening",
        "producer",
        "refused",
        "state",
        "topic",
        "users",
        "waiters",
    )

    def __init__(self, key: ChannelKey, topic: str = "") -> None:
        self.key = key
        self.topic = topic
        """The Kafka topic (for the dedup policy check and messages)."""
        self.state = ChannelState()
        self.producer: PulsarProducer | None = None
        self.opening: asyncio.Future[PulsarProducer] | None = None
        """The producer's creation while it runs (see ChannelManager._open)."""
        self.users = 0
        """Batches holding a lease on this channel."""
        self.waiters = 0
        self.arrived: list[int] = []
        """Base sequences of the batches inside the sidecar for this channel, from arrival
        to answer: a gap whose next batch has arrived is not a gap, only a wait."""
        self.refused: dict[int, tuple[errors.KafkaError, float]] = {}
        """Base sequence -> (retriable answer, when) of batches refused before they were
        handed to Pulsar, until they arrive again (at most :data:`_REFUSALS_KEPT`)."""
        self.closed = False
        self.moved = False
        """Its partition is led by another node now (or, for a journal, its producer id's
        transactions are coordinated elsewhere): closed as soon as it is idle, so that
        the new owner can open the name."""
        self.last_used = time.monotonic()
        self.mark_read = -math.inf
        """When (monotonic) the producer now open began its creation: the broker's mark
        for the name in :attr:`state` is at least as new as this."""
        self.lock = asyncio.Lock()
        """Held while the producer is opened or resynced."""
        self._any: list[asyncio.Future[bool]] = []
        """Waiters woken by any change."""
        self._after: dict[int, list[asyncio.Future[bool]]] = {}
        """Waiters behind a gap, by the extended sequence whose hand they wait for."""

    def note_refused(self, base_sequence: int, error: errors.KafkaError, now: float) -> None:
        """A batch was answered a retriable error without being handed to Pulsar."""
        self.refused.pop(base_sequence, None)
        self.refused[base_sequence] = (error, now)
        if len(self.refused) > _REFUSALS_KEPT:
            del self.refused[next(iter(self.refused))]

    def refusals_since(self, since: float) -> dict[int, errors.KafkaError]:
        """The refusals noted at or after ``since`` (monotonic), by base sequence."""
        return {seq: error for seq, (error, at) in self.refused.items() if at >= since}

    @property
    def idle(self) -> bool:
        return self.users == 0 and self.state.in_flight == 0 and self.opening is None

    def notify(self) -> None:
        """Wake every batch waiting on this channel: they decide again."""
        if self.waiters:
            waiting, self._any = self._any, []
            for futures in self._after.values():
                waiting.extend(futures)
            self._after.clear()
            _wake(waiting)

    def handed(self, last: int) -> None:
        """A batch ending at extended sequence ``last`` was handed to Pulsar: wake the
        batches behind it and those waiting for any change."""
        if self.waiters:
            waiting, self._any = self._any, []
            for after in [a for a in self._after if a <= last]:
                waiting.extend(self._after.pop(after))
            _wake(waiting)

    def settled(self, *, ok: bool) -> None:
        """A batch's receipt came: room and in-flight counts changed (a failure changes
        everything: the channel must resync)."""
        if not ok:
            self.notify()
        elif self._any:
            waiting, self._any = self._any, []
            _wake(waiting)

    async def wait_change(self, within: float, after: int | None = None) -> bool:
        """Wait up to ``within`` seconds for a change; False if nothing changed.

        ``after``: only the hand of the batch ending at this extended sequence (or a
        :meth:`notify`) is a change for this waiter.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        if after is None:
            self._any.append(future)
        else:
            self._after.setdefault(after, []).append(future)
        timer = loop.call_later(max(within, 0), _expire, future)
        self.waiters += 1
        try:
            return await future
        finally:
            self.waiters -= 1
            timer.cancel()
            if future.cancelled() or not future.result():  # expired or cancelled: unlist
                self._unlist(future, after)

    def _unlist(self, future: asyncio.Future[bool], after: int | None) -> None:
        listed = self._any if after is None else self._after.get(after)
        if listed is not None and future in listed:
            listed.remove(future)
            if after is not None and not listed:
                del self._after[after]


def _wake(futures: list[asyncio.Future[bool]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(True)


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
