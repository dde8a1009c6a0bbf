"""State partitions: one writer each, any reader, owned on demand or adopted as orphans.

A coordinator keeps its state in a partitioned, compacted log topic (the transaction
log, the consumer offsets). Each partition is a keyed table that every sidecar can read
(:meth:`StatePartitions.read`: a coalesced catch-up, so a read sees every write made
before it, by any sidecar) and that exactly one sidecar writes: its *owner*, holding
the partition's fenced writer.

Ownership moves in two ways:

* **on demand** (:meth:`StatePartitions.own`): a sidecar asked to change a key takes
  the partition with fencing. The previous owner's next write fails (it learns it lost
  the partition then), so two sidecars never both write. Any sidecar serves any key,
  whichever sidecar a load balancer picks; sidecars never talk to each other (as
  sidecars they often listen on loopback only), Pulsar is the only thing they share.
  The price is a takeover (a producer creation and a catch-up, milliseconds) whenever
  two sidecars take turns on one partition.
* **as orphans** (:meth:`StatePartitions.adopt_orphans`, every few seconds): a
  partition with no writer at the broker (its owner crashed, stopped or shut down) is
  taken by a sidecar, which recovers it (``on_acquired``), so decided work is finished
  and timeouts fire with no client asking. (Pulsar's ``WaitForExclusive`` would hand
  it over at once, but a waiting creation times out with the client's operation
  timeout and logs a warning each time, for every partition of every sidecar.)

After taking a partition, the new owner writes an ownership marker and catches up
until it reads it back: everything the previous owner stored is applied by then.
``apply`` sees the table's records (markers excluded) in topic order; it must accept
seeing a record twice (a coordinator applies its own writes at once and reads them
again later) and ignore stale ones (records carry a version).

**A write that failed** (one rule for every coordinator). A write that fails with
anything but a fencing (a timeout, the broker away) may still have been stored, now or
later: the partition is *in doubt* (:meth:`StatePartitions.in_doubt`). Before its
next change the owner gives its writer up (nothing of it can land afterwards), takes
the partition again with a fresh writer and reads it to a new ownership marker, so the
view holds exactly what is stored, and runs ``on_acquired`` (a coordinator recovers
the partition there: a decision whose write "failed" but was stored is driven like
one found after a takeover). A coordinator whose view may hold writes that were never
stored (it puts a change in its view before the write is durable) passes ``reset``:
the partition is then read again from its start. :meth:`StatePartitions.own` applies
the rule; :meth:`StatePartitions.settle_doubt` lets a sweep apply it with no change
pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from kop_dedup import errors
from kop_dedup.pulsar.exclusive import FencedWriter, OwnershipLost
from kop_dedup.pulsar.tables import KeyedTable, PulsarClient, TableRecord

__all__ = ["OWNER_KEY", "StatePartitions", "partition_of"]

log = logging.getLogger(__name__)
_ORPHAN = "it had no owner"
"""How an adopted partition was taken (logged at DEBUG; the round logs one INFO line)."""

OWNER_KEY = "__owner__"
"""The key of ownership markers; never a coordinator key."""

_STANDBY_RETRY_S = 1.0


def partition_of(key: str, partitions: int) -> int:
    """The partition of a key: stable across sidecars, processes and versions (CRC-32)."""
    return zlib.crc32(key.encode("utf-8")) % partitions


Apply = Callable[[int, TableRecord], None]
Acquired = Callable[[int], Coroutine[Any, Any, None]]
Lost = Callable[[int], None]
Writers = Callable[[], Awaitable[dict[int, list[str]]]]
"""Names of the producers the broker has on each partition (the admin API's stats)."""


class _Partition:
    __slots__ = (
        "index",
        "last_marker",
        "lock",
        "marker",
        "marker_seen",
        "table",
        "topic",
        "writer",
    )

    def __init__(self, client: PulsarClient, topic: str, index: int, apply: Apply) -> None:
        self.index, self.topic = index, topic
        self.marker: str | None = None
        self.last_marker: str | None = None
        """The latest ownership marker read from the partition (anyone's)."""
        self.marker_seen = asyncio.Event()

        def apply_record(record: TableRecord) -> None:
            if record.key == OWNER_KEY:
                if record.value is not None:
                    self.last_marker = record.value.decode()
                    if self.last_marker == self.marker:
                        self.marker_seen.set()
                return
            apply(index, record)

        self.table = KeyedTable(client, topic, apply_record)
        self.writer = FencedWriter(client, topic)
        self.lock = asyncio.Lock()


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
    ) -> None:
        self.topic, self.count, self.name = topic, partitions, name
        self._reset = reset
        self._doubt: dict[int, BaseException] = {}
        """Partitions a write of ours may have reached without our knowing (how it failed)."""
        self._identity = uuid.uuid4().hex[:12]
        self._on_acquired, self._on_lost = on_acquired, on_lost
        self._parts = [
            _Partition(client, f"{topic}-partition-{i}", i, apply) for i in range(partitions)
        ]
        self._writers = writers
        self._watcher: asyncio.Task[None] | None = None
        self._recovering: set[asyncio.Task[None]] = set()
        self._closed = False

    def partition_of(self, key: str) -> int:
        return partition_of(key, self.count)

    def owned(self, partition: int) -> bool:
        return self._parts[partition].writer.owned

    def lock(self, partition: int) -> asyncio.Lock:
        """Held around a read-modify-write of the partition's state on this sidecar."""
        return self._parts[partition].lock

    # -- reading ---------------------------------------------------------------------

    async def read(self, partition: int) -> None:
        """Apply every record written to the partition before this call (by anyone)."""
        await self._parts[partition].table.barrier()

    async def read_all(self) -> None:
        await asyncio.gather(*(p.table.barrier() for p in self._parts))

    # -- owning ------------------------------------------------------------------------

    async def own(self, partition: int) -> None:
        """Make this sidecar the partition's writer (fencing the current one) and catch
        up with everything it stored. A partition in doubt is taken again first (see the
        module docstring). Call with :meth:`lock` held."""
        part = self._parts[partition]
        doubt = self._doubt.get(partition)
        if doubt is not None:
            log.warning(
                "%s: a write to partition %d failed (%r): taking it again",
                self.name,
                partition,
                doubt,
            )
            if self._reset is not None:
                await self.restart(partition, functools.partial(self._reset, partition))
            else:
                await part.writer.lost()
        elif await self.still_owned(partition):
            return
        await part.writer.open()
        self._doubt.pop(partition, None)
        await self._settle(part, "fenced in" if doubt is None else "after a failed write")

    def in_doubt(self, partition: int) -> bool:
        """Whether a write of ours to the partition failed in a way that may have stored
        it (the partition is taken again before its next change)."""
        return partition in self._doubt

    async def settle_doubt(self) -> int:
        """Apply the failed-write rule now to every partition in doubt that this sidecar
        still owns (a sweep: no change may come to drive it); how many were taken again.
        One another sidecar took since is left to it (it read the log as it took it): a
        sweep never takes a partition back."""
        settled = 0
        for partition in list(self._doubt):
            async with self.lock(partition):
                if partition not in self._doubt:
                    continue
                if not await self.still_owned(partition):
                    self._doubt.pop(partition, None)  # someone else's now: it read the log
                    continue
                await self.own(partition)
                settled += 1
        return settled

    async def still_owned(self, partition: int, *, caught_up: bool = False) -> bool:
        """Whether this sidecar still owns the partition, having read everything written
        to it (call with :meth:`lock` held). Another sidecar may have fenced this one
        while it was idle (the client learns that at its next write, after a reconnection:
        about 150 ms): its ownership marker, read here, says so at once.

        ``caught_up``: the caller ran :meth:`read` since its request began, before taking
        the lock (so that concurrent callers share one catch-up). A takeover that lands
        in between is not seen here; it fenced this writer, so the change's first write
        fails (NOT_COORDINATOR, and the caller takes the partition back)."""
        part = self._parts[partition]
        if not part.writer.owned:
            return False
        if not caught_up:
            await part.table.barrier()  # a decision is then not taken on a stale view
        if part.last_marker == part.marker:
            return True
        await part.writer.lost()
        self._on_lost(part.index)
        return False

    async def restart(self, partition: int, reset: Callable[[], None]) -> None:
        """Give the partition's writer up and read the partition again from its start
        (``reset`` drops the caller's state of it first): for an owner whose state may
        hold a write that failed. Call with :meth:`lock` held; :meth:`own` takes it back."""
        part = self._parts[partition]
        await part.writer.lost()
        await part.table.restart(reset)
        part.last_marker = None

    async def _settle(self, part: _Partition, how: str) -> None:
        """Write a marker and read until it comes back: the table is then complete."""
        part.marker = json.dumps({"owner": self._identity, "at": time.time_ns()})
        part.marker_seen.clear()
        await part.writer.send(OWNER_KEY, part.marker.encode())
        while not part.marker_seen.is_set():
            await part.table.catch_up()
            if not part.marker_seen.is_set():
                await asyncio.sleep(0.005)
        # adoptions are summed up by adopt_orphans (one INFO line a round, for a start's
        # every partition); a takeover for a request is worth a line of its own
        level = logging.DEBUG if how == _ORPHAN else logging.INFO
        log.log(level, "%s: owns partition %d of %s (%s)", self.name, part.index, part.topic, how)
        task = asyncio.create_task(self._on_acquired(part.index), name=f"recover {part.topic}")
        self._recovering.add(task)
        task.add_done_callback(self._recovered)

    def _recovered(self, task: asyncio.Task[None]) -> None:
        self._recovering.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s: recovering a partition failed: %r", self.name, exc)

    async def write(self, partition: int, key: str, value: bytes) -> None:
        """Store ``key -> value`` as the partition's owner; durable when it returns.

        Raises NOT_COORDINATOR (retriable) when another sidecar took the partition
        over: the caller's retry takes it back.
        """
        await self._write(partition, self._parts[partition].writer.send(key, value))

    async def tombstone(self, partition: int, key: str) -> None:
        await self._write(partition, self._parts[partition].writer.tombstone(key))

    async def _write(self, partition: int, sending: Awaitable[None]) -> None:
        """A fencing answers NOT_COORDINATOR (nothing was stored); any other failure
        leaves the partition in doubt and passes on."""
        try:
            await sending
        except OwnershipLost as exc:
            self._on_lost(partition)
            raise errors.NotCoordinator(
                f"{self.name}: another sidecar took partition {partition} over; retry"
            ) from exc
        except BaseException as exc:
            self._doubt.setdefault(partition, exc)
            raise

    # -- adopting orphans -------------------------------------------------------------

    def start(self, interval_s: float) -> None:
        """Adopt partitions that have no writer (their owner went away: crash, stop,
        shutdown) now and every ``interval_s``, so decided work is finished and
        timeouts fire with no client asking."""
        self._watcher = asyncio.create_task(self._watch(interval_s), name=f"adopt {self.topic}")

    async def adopt_orphans(self) -> int:
        """Take every partition that has no writer at the broker; how many were taken.
        A partition this sidecar believes it owns but the broker does not list it for
        is given up first (it was fenced while idle).

        Two sidecars adopting the same orphan at once both open with fencing: the later
        one wins, the earlier one's marker write fails and it leaves the partition."""
        asked_at = time.monotonic()
        live = await self._writers()
        taken: list[int] = []
        for part in self._parts:
            names = live.get(part.index, [])
            if part.writer.owned:
                if part.writer.name in names or part.writer.opened_at >= asked_at:
                    continue  # ours, as the broker sees it (or taken since it was asked)
                if not part.writer.connected:
                    continue  # reconnecting (a broker restart): the next round tells
                # fenced while idle (another sidecar took it, maybe gone since): we
                # would only have learnt it at our next write
                async with part.lock:
                    await part.writer.lost()
                self._on_lost(part.index)
            if names:
                continue
            async with part.lock:
                if part.writer.owned:
                    continue
                # ask once more right before taking it: another sidecar may have taken it
                # since the first answer (fencing it now would only start a tug of war)
                if (await self._writers()).get(part.index):
                    continue
                try:
                    await part.writer.open()
                    await self._settle(part, _ORPHAN)
                except OwnershipLost:
                    log.info("%s: another sidecar adopted %s first", self.name, part.topic)
                    continue
            taken.append(part.index)
        if taken:
            log.info(
                "%s: took %d of %d partitions of %s that had no owner: %s",
                self.name,
                len(taken),
                self.count,
                self.topic,
                ",".join(map(str, taken)),
            )
        return len(taken)

    async def _watch(self, interval_s: float) -> None:
        while not self._closed:
            try:
                await self.adopt_orphans()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker or admin away: try again next round
                log.debug("%s: adopting orphan partitions: %r", self.name, exc)
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._recovering, *([self._watcher] if self._watcher else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for part in self._parts:
            await part.writer.close()
            await part.table.close()
