"""The highest epoch per producer id, durable in Pulsar: the registry that fences.

Topic ``producer-epochs`` (system namespace, a compacted table): records
``producerId -> epoch``, written by any sidecar (:meth:`EpochRegistry.raise_to`);
the highest epoch seen for a producer id fences all lower ones
(INVALID_PRODUCER_EPOCH). Every sidecar replays the topic at start and catches
up again before it trusts its memory (:meth:`EpochRegistry.barrier`).

What the produce path may rely on:

- ``highest(pid)`` is synchronous and reads memory only;
- ``await barrier()`` returns once every epoch written before the call, by any
  sidecar, is applied here (one coalesced catch-up serves concurrent callers);
- ``await raise_to(pid, epoch)`` returns once the epoch is durable in Pulsar,
  and applies it here at once;
- with a fencing lease ``L`` (``FENCING_LEASE_MS``): ``fresh(now)`` is true while
  the last catch-up began less than ``L`` ago, a catch-up runs in the background
  every ``L / 3``, and ``raise_to`` returns only ``L`` after its epoch is durable.
  So every decision taken on a fresh view after a raise has returned (by any
  sidecar) read a catch-up that began after the raise was stored: the produce path
  fences as exactly as with a catch-up per batch, without one (the raise, once per
  new epoch, waits instead of every batch).

Bounded (:class:`~kop_dedup.coordination.expiry.Bounds`): an entry expires a
configurable time after its epoch was last raised (the publish time of its
latest record; default 7 days, as Kafka's ``transactional.id.expiration.ms``),
and above a cap the entries raised longest ago are dropped first. A forgotten
producer id is no longer fenced by the registry: a zombie of it may write again
(Kafka forgets producer state the same way); the next batch of its live
producer at epoch > 0 records its epoch again. Every sweep also writes a
tombstone per expired entry (one sidecar at a time, under the name mutex
``<prefix>-epoch-sweeper``), so compaction removes it from the topic and starts
stay short.

Compaction keeps the *latest* record of a key, while the registry means the
*highest*: records of one producer id can land out of order (two sidecars
raising at once), and a sweeper's tombstone can land after a fresh raise. A
reader that sees a record lower than the epoch it knows, or a tombstone naming
an older raise than the one it knows, writes the epoch it knows again (after the
catch-up, unless a later record already restored it), so the latest record of
every live producer id is again its highest epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kop_dedup.clock import now_ms
from kop_dedup.coordination.expiry import Bounds, ExpiringMap
from kop_dedup.pulsar.exclusive import MutexBusy, NameMutex
from kop_dedup.pulsar.tables import (
    CompactTopic,
    KeyedTable,
    KeyedWriter,
    PulsarClient,
    TableRecord,
)

__all__ = ["DEFAULT_EPOCH_BOUNDS", "EpochMap", "EpochRegistry", "Swept"]

log = logging.getLogger(__name__)

DEFAULT_EPOCH_BOUNDS = Bounds(expiry_ms=7 * 86_400_000, max_entries=200_000)
_TOMBSTONES_AT_ONCE = 500  # within the writer's pending queue (1000)
_FORGET_ALL = 1 << 62  # a tombstone that names no raise removes whatever is known


@dataclass(frozen=True, slots=True)
class Swept:
    """What one sweep dropped from memory."""

    expired: list[tuple[int, int, int]] = field(default_factory=list)
    """(producer id, epoch, raised at ms) of the entries that expired."""
    capped: int = 0
    """Entries dropped by the cap since the previous sweep."""
    kept: int = 0

    def describe(self, bounds: Bounds) -> str:
        return (
            f"forgot {len(self.expired)} producer epochs raised more than "
            f"{bounds.expiry_ms / 1000:g} s ago and {self.capped} over the cap of "
            f"{bounds.max_entries} (oldest first); {self.kept} kept"
        )


class EpochMap:
    """The registry's memory: the highest epoch per producer id, bounded. Pure.

    Records from the table arrive through :meth:`apply` (a value) and
    :meth:`forget` (a tombstone), in topic order; this sidecar's own durable
    raises through :meth:`raised`. Entries whose latest record in the topic is
    not their highest epoch are collected for :meth:`take_repairs`.
    """

    def __init__(self, bounds: Bounds = DEFAULT_EPOCH_BOUNDS) -> None:
        self.bounds = bounds
        self._entries: ExpiringMap[int, int] = ExpiringMap(bounds)
        self._suspects: set[int] = set()

    def highest(self, producer_id: int) -> int | None:
        return self._entries.get(producer_id)

    def raised(self, producer_id: int, epoch: int, at_ms: int) -> None:
        """This sidecar stored ``epoch`` durably (its record is in the topic)."""
        current = self._entries.get(producer_id)
        if current is None or epoch > current:
            self._entries.put(producer_id, epoch, at_ms)

    def apply(self, producer_id: int, epoch: int, at_ms: int) -> None:
        """A record read from the topic, stored at ``at_ms``."""
        entry = self._entries.entry(producer_id)
        if entry is None or epoch >= entry[0]:
            # the same epoch again takes the record's time, so that every sidecar
            # ends up with the broker's time for it (a local raise used ours)
            self._entries.put(producer_id, epoch, at_ms)
            self._suspects.discard(producer_id)
        else:  # out of order: compaction would keep this lower epoch
            self._suspects.add(producer_id)

    def forget(self, producer_id: int, epoch: int, raised_at_ms: int) -> None:
        """A tombstone read from the topic, naming the raise it removes."""
        entry = self._entries.entry(producer_id)
        if entry is None:
            return
        if (entry[0], entry[1]) > (epoch, raised_at_ms):  # raised again since: keep it
            self._suspects.add(producer_id)
            return
        self._entries.pop(producer_id)
        self._suspects.discard(producer_id)

    def take_repairs(self) -> list[tuple[int, int]]:
        """(producer id, epoch) to write again, so the topic's latest record is the highest."""
        repairs = [
            (pid, epoch) for pid in self._suspects if (epoch := self.highest(pid)) is not None
        ]
        self._suspects.clear()
        return repairs

    def suspect(self, producer_id: int) -> None:
        """Repair ``producer_id`` at the next :meth:`take_repairs` (a repair that failed)."""
        self._suspects.add(producer_id)

    def sweep(self, now_ms: int) -> Swept:
        expired = self._entries.expire(now_ms)
        for pid, _, _ in expired:
            self._suspects.discard(pid)
        return Swept(expired, self._entries.take_capped(), len(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


class EpochRegistry:
    """Highest epoch per producer id, durable in Pulsar, bounded in memory."""

    def __init__(
        self,
        client: PulsarClient,
        topic: str,
        *,
        bounds: Bounds = DEFAULT_EPOCH_BOUNDS,
        sweeper_name: str | None = None,
        compact: CompactTopic | None = None,
        clock: Callable[[], float] = time.time,
        lease_s: float = 0.0,
    ) -> None:
        """``sweeper_name``: the name mutex under which one sidecar at a time writes the
        tombstones of expired entries (None: this registry writes none). ``lease_s``:
        the fencing lease (see the module docstring; 0: none, a catch-up per decision)."""
        self.topic = topic
        self.lease_s = lease_s
        self._refreshing: asyncio.Task[None] | None = None
        self._map = EpochMap(bounds)
        self._clock = clock
        self._table = KeyedTable(client, topic, self._apply, compact=compact)
        self._writer = KeyedWriter(client, topic)
        self._sweeper = NameMutex(client, topic, sweeper_name) if sweeper_name else None
        self._repairing: asyncio.Task[None] | None = None
        self._watched: asyncio.Future[None] | None = None

    def _now_ms(self) -> int:
        return now_ms(self._clock)

    def _apply(self, record: TableRecord) -> None:
        pid = int(record.key)
        if record.value is None:
            props = record.properties
            self._map.forget(
                pid,
                int(props.get("epoch", _FORGET_ALL)),
                int(props.get("raisedAt", _FORGET_ALL)),
            )
        else:
            self._map.apply(pid, int(record.value), record.publish_time_ms)

    def highest(self, producer_id: int) -> int | None:
        return self._map.highest(producer_id)

    async def catch_up(self) -> None:
        await self._table.catch_up()
        self._repair_soon()

    async def load(self) -> None:
        """Replay the topic (read compacted); ask for compaction when that read many
        more records than there are producer ids, so the next start reads fewer."""
        await self.catch_up()
        await self._table.compact_if_due(len(self._map))

    async def barrier(self) -> None:
        """Return once every epoch written before this call is applied here (coalesced)."""
        await self._table.barrier()
        self._repair_soon()

    def barrier_future(self) -> asyncio.Future[None]:
        """The shared catch-up that serves a caller arriving now: done once every epoch
        written before this call is applied here. For the produce path, which awaits
        one per batch: no task per caller. Never cancel it."""
        future = self._table.barrier_future()
        if future is not self._watched:  # repairs are taken after each catch-up, once
            self._watched = future
            future.add_done_callback(lambda _f: self._repair_soon())
        return future

    def fresh(self, now: float) -> bool:
        """Whether ``highest`` may be trusted at ``now`` (monotonic) without a catch-up:
        the last one began within the lease."""
        began = self._table.caught_up_from
        return self.lease_s > 0 and began is not None and now - began < self.lease_s

    def start_refreshing(self) -> None:
        """Catch up every third of the lease in the background, so the produce path
        finds the view fresh (a failed catch-up only makes the next batches catch up)."""
        if self.lease_s > 0 and self._refreshing is None:
            self._refreshing = asyncio.create_task(self._refresh(), name="epochs-refresh")

    async def _refresh(self) -> None:
        while True:
            try:
                await self.barrier()
            except Exception as exc:
                log.debug("refreshing %s failed: %r", self.topic, exc)
            await asyncio.sleep(self.lease_s / 3)

    async def raise_to(self, producer_id: int, epoch: int) -> None:
        """Record ``epoch`` for ``producer_id`` durably before anything relies on it;
        with a lease, return only once every sidecar's fresh view holds it."""
        current = self._map.highest(producer_id)
        if current is not None and epoch <= current:
            return
        await self._writer.send(str(producer_id), str(epoch).encode())
        self._map.raised(producer_id, epoch, self._now_ms())
        if self.lease_s > 0:
            await asyncio.sleep(self.lease_s)

    async def sweep(self) -> Swept:
        """Drop expired and over-cap entries (logged at INFO when any), then tombstone
        the expired ones in the topic if no other sidecar is doing so right now."""
        await self.barrier()  # decide on what every sidecar raised so far
        swept = self._map.sweep(self._now_ms())
        if swept.expired or swept.capped:
            log.info("%s: %s", self.topic, swept.describe(self._map.bounds))
        if swept.expired and self._sweeper is not None:
            await self._tombstone(self._sweeper, swept.expired)
        return swept

    async def _tombstone(self, sweeper: NameMutex, expired: list[tuple[int, int, int]]) -> None:
        try:
            async with sweeper.hold(wait_s=0):
                for start in range(0, len(expired), _TOMBSTONES_AT_ONCE):
                    await asyncio.gather(
                        *(
                            self._writer.tombstone(
                                str(pid), properties={"epoch": str(epoch), "raisedAt": str(at)}
                            )
                            for pid, epoch, at in expired[start : start + _TOMBSTONES_AT_ONCE]
                        )
                    )
        except MutexBusy:
            log.debug("another sidecar is sweeping %s", self.topic)

    def _repair_soon(self) -> None:
        if self._repairing is None or self._repairing.done():
            repairs = self._map.take_repairs()
            if repairs:
                self._repairing = asyncio.ensure_future(self._repair(repairs))

    async def _repair(self, repairs: list[tuple[int, int]]) -> None:
        log.info("%s: writing %d highest epochs again (out of order)", self.topic, len(repairs))
        for pid, epoch in repairs:
            try:
                await self._writer.send(str(pid), str(epoch).encode())
            except Exception as exc:  # retried after the next catch-up
                log.warning("could not write epoch %d of producer %d again: %s", epoch, pid, exc)
                self._map.suspect(pid)

    @property
    def catch_ups(self) -> int:
        """Catch-ups of the topic since this registry was created."""
        return self._table.catch_ups

    @property
    def records_read(self) -> int:
        """Records read from the topic since this registry was created."""
        return self._table.records_read

    def __len__(self) -> int:
        return len(self._map)

    async def close(self) -> None:
        for task in (self._refreshing, self._repairing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._table.close()
        await self._writer.close()
