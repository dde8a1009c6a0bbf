"""The Kafka offset of a batch just produced, for the Produce answer's base offset.

Offsets are the broker's entry index (:mod:`kop_dedup.pulsar.positions`): an entry is
stamped with the index of its last message, and one Kafka batch is one entry, so a
batch of ``n`` records stored as entry ``E`` has offsets ``index(E) - n + 1 ..
index(E)``. A send receipt carries the ledger and entry, not the index, so:

- ``derive`` (default): entries are dense within a ledger, so when this sidecar knows
  the index of entry ``E - 1`` (it produced it, or asked for it) ``index(E) =
  index(E - 1) + n``: no round trip. The partition's leader writes it alone, so
  ``E - 1`` is usually a batch of its own whose answer is a moment behind (several
  producers on one partition: receipts come back in any order): ``E`` waits for it
  (``wait_s`` at most; while ``E - 1``'s own index is being looked up or derived, up to
  :data:`_CHAIN_WAIT_S`: a run of entries answered together costs one lookup) rather
  than ask. Otherwise (the first entry of a ledger, an
  entry after another writer's, a transaction's copy) it asks the broker once, and
  the entries after that derive from it.
- ``lookup``: ask the broker for every batch (an admin call: one HTTP round trip and
  an entry read at the broker).
- ``none``: answer -1, as a Kafka broker never does for a stored batch (Java clients
  then report -1 for every record, librdkafka -1, 0, 1, ...).

A failed lookup never fails the produce: the batch is stored; the answer says -1.

A batch produced in a transaction is journaled, and copied into its partition once the
transaction commits: its offsets are not known when it is answered. What is known is a
floor: the copy appends after everything the partition holds now, so each record lands
at or above the partition's end offset. :meth:`ProducedOffsets.floor` answers that
floor from what this sidecar knows (the ends of the entries it produced or looked up,
the broker's end asked at most once a second per partition, in the background), never
waiting; 0 when it knows nothing yet. Kafka Streams keeps the last offset it was
answered per changelog partition as its checkpoint, and restores from there after a
clean restart: a floor makes it replay a suffix the store already holds (exact for its
keyed stores: each key ends at its last write), where -1 gave it no checkpoint at all
and a restore of the whole changelog at every start.

>>> offsets = ProducedOffsets(admin)
>>> await offsets.base_offset("persistent://public/kafka/t-partition-0", "12:3:0:0", 100)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Literal

from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.positions import Positions

__all__ = ["ProducedOffsets"]

log = logging.getLogger(__name__)

_KEPT = 20_000
_END_REFRESH_S = 1.0
"""How often a partition's end is asked of the broker at most, for :meth:`floor`."""
_CHAIN_WAIT_S = 5.0
"""How long an answer waits for the entry before it while that entry's index is being
resolved (a lookup under way): entries answered together (20 producers' first batches
on a fresh partition) take one lookup between them, not one each."""


class ProducedOffsets:
    def __init__(
        self,
        admin: PulsarAdmin,
        *,
        mode: Literal["derive", "lookup", "none"] = "derive",
        wait_s: float = 0.02,
    ) -> None:
        self._admin, self.mode, self._wait_s = admin, mode, wait_s
        self._indexes: OrderedDict[tuple[str, int, int], asyncio.Future[int | None]] = OrderedDict()
        self._resolving: dict[tuple[str, int, int], asyncio.Future[int | None]] = {}
        """Entries being resolved, with the placeholder their lookup resolves: a call
        for one pushed out of :attr:`_indexes` meanwhile waits on that one too."""
        self.derived = 0
        self.looked_up = 0
        self.unknown = 0
        self._warned: set[str] = set()
        self._positions = Positions(admin)
        self._ends: OrderedDict[str, tuple[int, float]] = OrderedDict()
        """Partition topic -> (an end offset it reached, when the broker was last asked)."""
        self._ending: dict[str, asyncio.Task[None]] = {}

    async def base_offset(self, ptopic: str, message_id: str | None, records: int) -> int:
        """The offset of the batch's first record; -1 when it cannot be known."""
        if message_id is None or self.mode == "none":
            return -1
        try:
            ledger, entry = (int(x) for x in message_id.split(":")[:2])
        except ValueError:
            return -1
        key = (ptopic, ledger, entry)
        known = self._future(key)
        if not known.done() and key not in self._resolving:  # else: another call resolves it
            self._resolving[key] = known
            try:
                index = await self._resolve(ptopic, ledger, entry, records)
            finally:
                del self._resolving[key]
            if not known.done():
                known.set_result(index)
        index = known.result() if known.done() else await asyncio.shield(known)
        if index is None:
            self.unknown += 1
            return -1
        self._reached(ptopic, index + 1)
        return index - records + 1

    def floor(self, ptopic: str) -> int:
        """An offset at or below where a record written to ``ptopic`` from now on lands:
        the partition's end as last known (0 when nothing is known yet). Never waits:
        the broker is asked in the background when what is known is over a second old."""
        known = self._ends.get(ptopic)
        now = time.monotonic()
        if (known is None or now - known[1] >= _END_REFRESH_S) and ptopic not in self._ending:
            self._ending[ptopic] = asyncio.get_running_loop().create_task(self._ask_end(ptopic))
        return 0 if known is None else known[0]

    async def _ask_end(self, ptopic: str) -> None:
        try:
            end, _position = await self._positions.end(ptopic)
        except Exception as exc:  # a floor stays what it was; the produce is not failed
            log.debug("asking the end of %s failed: %r", ptopic, exc)
            end = self._ends.get(ptopic, (0, 0.0))[0]
        finally:
            self._ending.pop(ptopic, None)
        # the broker's word replaces what was known: a topic deleted and made again
        # starts over
        self._keep(ptopic, end, time.monotonic())

    def _reached(self, ptopic: str, end: int) -> None:
        """A receipt shows ``ptopic`` holds at least ``end`` records."""
        end_known, asked = self._ends.get(ptopic, (0, 0.0))
        self._keep(ptopic, max(end, end_known), asked)

    def _keep(self, ptopic: str, end: int, asked: float) -> None:
        self._ends[ptopic] = (end, asked)
        self._ends.move_to_end(ptopic)
        if len(self._ends) > _KEPT:
            self._ends.popitem(last=False)

    def _future(self, key: tuple[str, int, int]) -> asyncio.Future[int | None]:
        """The index of an entry, once known (a placeholder until its answer resolves it)."""
        known = self._indexes.get(key) or self._resolving.get(key)
        if known is None:
            known = self._indexes[key] = asyncio.get_running_loop().create_future()
            if len(self._indexes) > _KEPT:
                self._indexes.popitem(last=False)
        return known

    async def _resolve(self, ptopic: str, ledger: int, entry: int, records: int) -> int | None:
        if self.mode == "derive" and entry > 0:
            previous_key = (ptopic, ledger, entry - 1)
            before = self._future(previous_key)
            if not before.done():
                # being resolved (asked, or derived from the one before it): its answer
                # is on the way, and one lookup serves the whole run of entries after it
                wait = _CHAIN_WAIT_S if previous_key in self._resolving else self._wait_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(before), wait)
            if before.done() and (previous := before.result()) is not None:
                self.derived += 1
                return previous + records
        try:
            found = await self._admin.entry_index(ptopic, ledger, entry)
        except Exception as exc:
            self._warn(ptopic, f"asking the broker for the entry's index failed: {exc!r}")
            return None
        self.looked_up += 1
        log.debug("asked the broker for the index of %s %d:%d", ptopic, ledger, entry)
        if found is None:
            self._warn(ptopic, "the broker does not index entries (no offsets)")
            return None
        return found[0]

    def _warn(self, ptopic: str, why: str) -> None:
        if ptopic not in self._warned and len(self._warned) < 1000:
            self._warned.add(ptopic)
            log.warning("produce answers on %s carry base offset -1: %s", ptopic, why)
