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
  (``wait_s`` at most) rather than ask. Otherwise (the first entry of a ledger, an
  entry after another writer's, a transaction's copy) it asks the broker once, and
  the entries after that derive from it.
- ``lookup``: ask the broker for every batch (an admin call: one HTTP round trip and
  an entry read at the broker).
- ``none``: answer -1, as a Kafka broker never does for a stored batch (Java clients
  then report -1 for every record, librdkafka -1, 0, 1, ...).

A failed lookup never fails the produce: the batch is stored; the answer says -1.

>>> offsets = ProducedOffsets(admin)
>>> await offsets.base_offset("persistent://public/kafka/t-partition-0", "12:3:0:0", 100)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Literal

from kop_dedup.pulsar.admin import PulsarAdmin

__all__ = ["ProducedOffsets"]

log = logging.getLogger(__name__)

_KEPT = 20_000


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
        self._resolving: set[tuple[str, int, int]] = set()
        self.derived = 0
        self.looked_up = 0
        self.unknown = 0
        self._warned: set[str] = set()

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
            self._resolving.add(key)
            try:
                index = await self._resolve(ptopic, ledger, entry, records)
            finally:
                self._resolving.discard(key)
            if not known.done():
                known.set_result(index)
        index = await asyncio.shield(known)
        if index is None:
            self.unknown += 1
            return -1
        return index - records + 1

    def _future(self, key: tuple[str, int, int]) -> asyncio.Future[int | None]:
        """The index of an entry, once known (a placeholder until its answer resolves it)."""
        known = self._indexes.get(key)
        if known is None:
            known = self._indexes[key] = asyncio.get_running_loop().create_future()
            if len(self._indexes) > _KEPT:
                self._indexes.popitem(last=False)
        return known

    async def _resolve(self, ptopic: str, ledger: int, entry: int, records: int) -> int | None:
        if self.mode == "derive" and entry > 0:
            before = self._future((ptopic, ledger, entry - 1))
            if not before.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(before), self._wait_s)
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
