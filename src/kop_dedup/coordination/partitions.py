"""State partitions: one writer each, any reader, owned by the node the cluster names.

A coordinator keeps its state in a partitioned, compacted log topic (the transaction
log, the consumer groups). Each partition is a keyed table that every sidecar can read
(:meth:`StatePartitions.read`: a coalesced catch-up, so a read sees every write made
before it, by any sidecar) and that exactly one sidecar writes: its *owner*, holding
the partition's fenced writer.

**Who owns a partition is decided by the cluster**, not by whoever asks first: every
node computes the same owner from the live members Pulsar lists
(:mod:`kop_dedup.cluster.placement`) and hands its own share to :meth:`StatePartitions.assign`
after every listing. Kafka's ``onElection``/``onResignation``:

* a partition newly assigned is **loaded**: once the broker lists no writer on it (the
  previous owner released it; waited for at most ``handoff_wait_s``, then taken anyway:
  a node that hangs is fenced), this node opens the partition's writer with fencing,
  writes an ownership marker and reads until it reads it back (everything the previous
  owner stored is then applied), and runs ``on_acquired(partition, orphan)``
  (``orphan``: no writer was listed, the previous owner went away);
* a partition no longer assigned is **released**: ``on_release`` runs under its lock
  (the groups store marks it closed cleanly there), then the writer closes, so the new
  owner takes it without waiting;
* a change asks :meth:`StatePartitions.ready` first: NOT_COORDINATOR (16) on a node the
  cluster does not name (the transports forward or refuse before it gets here),
  COORDINATOR_LOAD_IN_PROGRESS (14) when the load takes longer than the caller waits.

The fenced writer stays as the safety net: two nodes whose views of the members differ
for a moment (within one listing of each other) may both load a partition; the later
one fences the earlier, whose next write fails (NOT_COORDINATOR, nothing stored), and
once their views agree only the owner takes it again. A non-owner never takes a
partition.

``apply`` sees the table's records (markers excluded) in topic order, some twice (a
coordinator applies its own writes at once and reads them again later): it ignores
stale ones (records carry a version).

**A write that failed** (one rule for every coordinator). A write that fails with
anything but a fencing (a timeout, the broker away) may still have been stored, now or
later: the partition is *in doubt* (:meth:`StatePartitions.in_doubt`). Before its
next change the owner gives its writer up (nothing of it can land afterwards), opens
a fresh writer and reads the partition to a new ownership marker, so the view holds
exactly what is stored, and runs ``on_acquired`` (a coordinator recovers the partition
there: a decision whose write "failed" but was stored is driven like one found after a
takeover). A coordinator whose view may hold writes that were never stored (it puts a
change in its view before the write is durable) passes ``reset``: the partition is then
read again from its start. :meth:`StatePartitions.own` applies the rule;
:meth:`StatePartitions.settle_doubt` lets a sweep apply it with no change pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.partition_slot import (
    OWNER_KEY,
    Acquired,
    Apply,
    Lost,
    OwnerOf,
    Released,
    Slot,
    Writers,
    handed_off,
    partition_of,
)
from kop_dedup.pulsar.exclusive import OwnershipLost
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["OWNER_KEY", "StatePartitions", "partition_of"]

log = logging.getLogger(__name__)

_HANDOFF_POLL_S = 0.05
_LOAD_RETRY_S = 1.0


class StatePartitions:
    """The partitions of one coordinator log (``<topic>-partition-<n>``)."""

    def __init__(
        self,
        client: PulsarClient,
        topic: str,
        partitions: int,
        *,
        apply: Apply,
        on_acquired: Acquired,
        on_lost: Lost,
        writers: Writers,
        name: str,
        reset: Callable[[int], None] | None = None,
        on_release: Released | None = None,
        on_taken: Callable[[int, bool], None] | None = None,
        owner_of: OwnerOf | None = None,
        handoff_wait_s: float = 5.0,
    ) -> None:
        self.topic, self.count, self.name = topic, partitions, name
        self._reset = reset
        self._doubt: dict[int, BaseException] = {}  # a failed write of ours may be stored
        self._identity = uuid.uuid4().hex[:12]
        self._on_acquired, self._on_lost, self._on_release = on_acquired, on_lost, on_release
        self._on_taken = on_taken  # (partition, orphan), before any change can run on it
        self._owner_of = owner_of or (lambda _p: "another node")
        self._handoff_wait_s = handoff_wait_s
        self._parts = [Slot(client, f"{topic}-partition-{i}", i, apply) for i in range(partitions)]
        self._writers = writers
        self._assigned: frozenset[int] = frozenset()
        self._tasks: set[asyncio.Task[None]] = set()
        self._checking: set[int] = set()  # loaded partitions whose writer is checked now
        self._closed = False
        self.moves = 0  # partitions loaded or released on this node since it started

    def partition_of(self, key: str) -> int:
        return partition_of(key, self.count)

    @property
    def assigned(self) -> frozenset[int]:
        """The partitions the cluster names this node the owner of."""
        return self._assigned

    def owned(self, partition: int) -> bool:
        """Assigned to this node, loaded, and not (yet known to be) fenced."""
        part = self._parts[partition]
        return partition in self._assigned and part.loaded.is_set() and part.writer.owned

    def lock(self, partition: int) -> asyncio.Lock:
        """Held around a read-modify-write of the partition's state on this sidecar."""
        return self._parts[partition].lock

    # -- reading ---------------------------------------------------------------------

    async def read(self, partition: int) -> None:
        """Apply every record written to the partition before this call (by anyone)."""
        await self._parts[partition].table.barrier()

    async def read_all(self) -> None:
        await asyncio.gather(*(p.table.barrier() for p in self._parts))

    # -- the cluster's decision --------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """The partitions this node owns from now on: load those it does not hold, release
        those it holds and no longer owns (both in the background; idempotent, so the
        cluster calls it after every listing: a partition lost to a fencing while still
        assigned is loaded again)."""
        if self._closed:
            return
        wanted = frozenset(partitions)
        dropped = self._assigned - wanted
        self._assigned = wanted
        released: dict[int, asyncio.Task[None]] = {}
        for p in sorted(dropped):
            part = self._parts[p]
            was_loaded = part.loaded.is_set()
            part.loaded.clear()  # at once: nothing new starts on it, a new assign loads it
            task = self._spawn(self._release(p, was_loaded), f"release {self.name} {p}")
            if was_loaded:
                released[p] = task
        loading: dict[int, asyncio.Task[None]] = {}
        for p in sorted(wanted):
            part = self._parts[p]
            if part.loaded.is_set() and part.writer.owned:
                if not part.writer.connected and p not in self._checking:
                    self._checking.add(p)
                    self._spawn(self._check(p), f"check {self.name} {p}")
                continue
            if part.acquiring is None or part.acquiring.done():
                part.acquiring = self._spawn(self._acquire(p), f"load {self.name} {p}")
                loading[p] = part.acquiring
        if released or loading:
            self._spawn(self._summarize(loading, released), f"moves of {self.name}")

    async def _check(self, partition: int) -> None:
        """A loaded partition whose writer the client does not have connected: fenced
        while this node was away (paused, cut off: the broker dropped it and another
        node took the partition) or only reconnecting (a broker restart). Unless the
        broker lists our writer on it, give it up; the next listing loads it again (after
        the other node's hand-off) if it is still ours. A silently fenced owner would
        otherwise answer from what it last read until its next write failed."""
        part = self._parts[partition]
        try:
            listed = (await self._writers()).get(partition, [])
            async with part.lock:
                name = part.writer.name
                if part.loaded.is_set() and not part.writer.connected and name not in listed:
                    log.info(
                        "%s: partition %d: our writer %s is gone (written by %s): loading it again",
                        self.name,
                        partition,
                        name,
                        ",".join(listed) or "no one",
                    )
                    await self._fenced(part)
        except Exception as exc:  # the broker away: the next listing checks again
            log.debug("%s: checking partition %d: %r", self.name, partition, exc)
        finally:
            self._checking.discard(partition)

    async def _summarize(
        self, loading: dict[int, asyncio.Task[None]], released: dict[int, asyncio.Task[None]]
    ) -> None:
        """One INFO line per round of moves (the partitions' own lines are DEBUG)."""
        await asyncio.gather(*loading.values(), *released.values(), return_exceptions=True)
        took = [p for p in loading if self._parts[p].loaded.is_set()]
        for what, parts in (("took", took), ("released", sorted(released))):
            if parts:
                log.info(
                    "%s: %s %d of %d partitions of %s: %s",
                    self.name,
                    what,
                    len(parts),
                    self.count,
                    self.topic,
                    ",".join(map(str, parts)),
                )

    async def loaded(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until every partition assigned *now* is loaded (one
        assigned when the wait began and moved on since is not waited for)."""
        deadline = time.monotonic() + timeout_s
        while any(not self._parts[p].loaded.is_set() for p in self._assigned):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_HANDOFF_POLL_S)
        return True

    async def ready(self, partition: int, wait_s: float = 10.0) -> None:
        """Before a change: NOT_COORDINATOR when the cluster names another node the
        owner; wait (at most ``wait_s``) while this node loads it, then
        COORDINATOR_LOAD_IN_PROGRESS."""
        part = self._parts[partition]
        if partition not in self._assigned:
            raise errors.NotCoordinator(
                f"{self.name}: partition {partition} is owned by {self._owner_of(partition)}"
            )
        if part.loaded.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(part.loaded.wait(), wait_s)
        if partition not in self._assigned:
            raise errors.NotCoordinator(
                f"{self.name}: partition {partition} moved to {self._owner_of(partition)}"
            )
        if not part.loaded.is_set():
            raise errors.CoordinatorLoadInProgress(
                f"{self.name}: partition {partition} is still being loaded here; retry"
            )

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # once closing, a recovery cut short is the next owner's to redo
            level = logging.INFO if self._closed else logging.ERROR
            log.log(level, "%s: %s failed: %r", self.name, task.get_name(), exc)

    async def _acquire(self, partition: int) -> None:
        """Load an assigned partition: wait for the previous owner to release it, take it
        with fencing, read it to our marker, recover it. Tried again (every
        ``_LOAD_RETRY_S``) while it stays assigned and the broker is away."""
        part = self._parts[partition]
        while partition in self._assigned and not self._closed:
            try:
                orphan = await handed_off(
                    part, self._writers, self._handoff_wait_s, self.name, _HANDOFF_POLL_S
                )
                async with part.lock:
                    if partition not in self._assigned or self._closed:
                        return
                    if part.loaded.is_set() and part.writer.owned:
                        return
                    part.loaded.clear()
                    await part.writer.open()
                    self._doubt.pop(partition, None)
                    await self._settle(part, orphan=orphan)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker away, or fenced at once: try again
                log.info("%s: loading partition %d: %r; retrying", self.name, partition, exc)
                await asyncio.sleep(_LOAD_RETRY_S)
            else:
                return

    async def _release(self, partition: int, was_loaded: bool) -> None:
        """No longer assigned: hand the partition over (``on_release``, then the writer
        closes, so the new owner can take it at once)."""
        part = self._parts[partition]
        acquiring = part.acquiring
        if partition not in self._assigned and acquiring is not None and not acquiring.done():
            acquiring.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await acquiring
        async with part.lock:
            if was_loaded and part.writer.owned and self._on_release is not None:
                try:
                    await self._on_release(partition)
                except Exception as exc:  # the next owner recovers what was not handed over
                    log.info("%s: handing partition %d over: %r", self.name, partition, exc)
            if partition not in self._assigned:  # else assigned again meanwhile: it reloads
                await part.writer.close()
                self._doubt.pop(partition, None)
        if was_loaded:
            self.moves += 1
            owner = self._owner_of(partition)
            log.debug("%s: released partition %d to %s", self.name, partition, owner)
            self._on_lost(partition)

    # -- owning ------------------------------------------------------------------------

    async def own(self, partition: int) -> None:
        """As the owner, before a change (call with :meth:`lock` held, after
        :meth:`ready`): the failed-write rule (a partition in doubt is taken again by this
        node with a fresh writer and read again). NOT_COORDINATOR when this node is not
        the owner (any more), COORDINATOR_LOAD_IN_PROGRESS while it loads it."""
        part = self._parts[partition]
        if partition not in self._assigned:
            raise errors.NotCoordinator(
                f"{self.name}: partition {partition} is owned by {self._owner_of(partition)}"
            )
        doubt = self._doubt.get(partition)
        if doubt is None:
            if part.loaded.is_set() and part.writer.owned:
                return
            raise errors.CoordinatorLoadInProgress(
                f"{self.name}: partition {partition} is being loaded here; retry"
            )
        log.warning(
            "%s: a write to partition %d failed (%r): taking it again",
            self.name,
            partition,
            doubt,
        )
        if self._reset is not None:
            await self.retake(partition, functools.partial(self._reset, partition))
            return
        part.loaded.clear()
        await part.writer.lost()
        await part.writer.open()
        self._doubt.pop(partition, None)
        await self._settle(part, orphan=False, how="after a failed write")

    async def retake(self, partition: int, reset: Callable[[], None]) -> None:
        """Read the partition again from its start (``reset`` drops the caller's state of
        it first) and own it again with a fresh writer, as the owner the cluster names:
        for an owner whose state may hold a write that failed. NOT_COORDINATOR when this
        node is not the owner. Call with :meth:`lock` held."""
        if partition not in self._assigned:
            raise errors.NotCoordinator(
                f"{self.name}: partition {partition} is owned by {self._owner_of(partition)}"
            )
        part = self._parts[partition]
        part.loaded.clear()
        await self.restart(partition, reset)
        await part.writer.open()
        self._doubt.pop(partition, None)
        await self._settle(part, orphan=False, how="read again after a failed write")

    def in_doubt(self, partition: int) -> bool:
        """Whether a write of ours failed in a way that may have stored it."""
        return partition in self._doubt

    async def settle_doubt(self) -> int:
        """Apply the failed-write rule now to every partition in doubt that this node
        still owns (a sweep: no change may come to drive it); how many were taken again."""
        settled = 0
        for partition in list(self._doubt):
            async with self.lock(partition):
                if partition not in self._doubt:
                    continue
                if partition not in self._assigned or not await self.still_owned(partition):
                    self._doubt.pop(partition, None)  # someone else's now: it read the log
                    continue
                await self.own(partition)
                settled += 1
        return settled

    async def still_owned(self, partition: int, *, caught_up: bool = False) -> bool:
        """Whether this node still owns the partition, having read everything written to
        it (lock held): a node that fenced this one while it was idle wrote its marker,
        read here. ``caught_up``: the caller ran :meth:`read` since its request began (a
        takeover since then fenced this writer: the change's first write fails)."""
        part = self._parts[partition]
        if not self.owned(partition):
            return False
        if not caught_up:
            await part.table.barrier()  # a decision is then not taken on a stale view
        if part.last_marker == part.marker:
            return True
        await self._fenced(part)
        return False

    async def _fenced(self, part: Slot) -> None:
        """Another node took the partition (its view of the members differed from ours
        for a moment): give it up; the next assignment takes it again if it is ours."""
        part.loaded.clear()
        await part.writer.lost()
        self._on_lost(part.index)

    async def restart(self, partition: int, reset: Callable[[], None]) -> None:
        """Give the partition's writer up and read the partition again from its start
        (``reset`` drops the caller's state of it first): for an owner whose state may
        hold a write that failed. Call with :meth:`lock` held; :meth:`own` takes it back."""
        part = self._parts[partition]
        await part.writer.lost()
        await part.table.restart(reset)
        part.last_marker = None

    async def _settle(self, part: Slot, *, orphan: bool, how: str = "") -> None:
        """Write a marker and read until it comes back: the table is then complete."""
        part.marker = json.dumps({"owner": self._identity, "at": time.time_ns()})
        part.marker_seen.clear()
        await part.writer.send(OWNER_KEY, part.marker.encode())
        while not part.marker_seen.is_set():
            await part.table.catch_up()
            if not part.marker_seen.is_set():
                await asyncio.sleep(0.005)
        if self._on_taken is not None:
            self._on_taken(part.index, orphan)
        part.loaded.set()
        self.moves += 1
        log.log(
            logging.INFO if how else logging.DEBUG,  # a round of loads is summed up
            "%s: owns partition %d of %s (%s)",
            self.name,
            part.index,
            part.topic,
            how or ("its previous owner was gone" if orphan else "handed over"),
        )
        self._spawn(self._on_acquired(part.index, orphan), f"recover {part.topic}")

    async def write(self, partition: int, key: str, value: bytes) -> None:
        """Store ``key -> value`` as the partition's owner; durable when it returns.

        Raises NOT_COORDINATOR (retriable) when another node took the partition over."""
        await self._write(partition, self._parts[partition].writer.send(key, value))

    async def tombstone(self, partition: int, key: str) -> None:
        await self._write(partition, self._parts[partition].writer.tombstone(key))

    async def _write(self, partition: int, sending: Awaitable[None]) -> None:
        """A fencing answers NOT_COORDINATOR (nothing was stored); any other failure
        leaves the partition in doubt and passes on."""
        try:
            await sending
        except OwnershipLost as exc:
            part = self._parts[partition]
            if part.loaded.is_set():
                part.loaded.clear()
                self._on_lost(partition)
            raise errors.NotCoordinator(
                f"{self.name}: another node took partition {partition} over; retry"
            ) from exc
        except BaseException as exc:
            self._doubt.setdefault(partition, exc)
            raise

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for part in self._parts:
            part.loaded.clear()
            await part.writer.close()
            await part.table.close()
