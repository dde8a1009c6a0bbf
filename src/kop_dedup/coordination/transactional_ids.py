"""transactionalId -> (producer id, epoch): each init bumps the epoch, durably.

Topic ``transactional-ids`` (system namespace, a compacted table): keyed
``transactionalId -> {"producerId", "producerEpoch"}`` records, written only
while holding the name mutex ``<prefix>-transaction-coordinator`` and after
catching up, so the latest record of a key is always the truth (one writer at
a time). Read lazily: the first init on a sidecar loads the table.

Bounded (:class:`~kop_dedup.coordination.expiry.Bounds`): a transactional id
expires a configurable time after its last init (default 7 days, Kafka's
``transactional.id.expiration.ms``); above a cap the ids initialised longest
ago are dropped first. An expired id's next init starts afresh: a new producer
id at epoch 0, as in Kafka. A sweep that finds expired ids tombstones them
under the same mutex after catching up (so it never removes an id initialised
meanwhile), and compaction removes them from the topic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from kop_dedup.clock import now_ms
from kop_dedup.coordination.epochs import EpochRegistry
from kop_dedup.coordination.expiry import Bounds, ExpiringMap
from kop_dedup.coordination.producer_ids import ProducerIdAllocator
from kop_dedup.protocol.records import MAX_EPOCH
from kop_dedup.pulsar.exclusive import MutexBusy, NameMutex
from kop_dedup.pulsar.tables import (
    CompactTopic,
    KeyedTable,
    KeyedWriter,
    PulsarClient,
    TableRecord,
)

__all__ = ["DEFAULT_TRANSACTIONAL_ID_BOUNDS", "TransactionalIds"]

log = logging.getLogger(__name__)

DEFAULT_TRANSACTIONAL_ID_BOUNDS = Bounds(expiry_ms=7 * 86_400_000, max_entries=100_000)
_TOMBSTONES_AT_ONCE = 500


class TransactionalIds:
    """transactionalId -> (producer id, epoch); each init bumps the epoch."""

    def __init__(
        self,
        client: PulsarClient,
        topic: str,
        mutex_name: str,
        allocator: ProducerIdAllocator,
        epochs: EpochRegistry,
        *,
        bounds: Bounds = DEFAULT_TRANSACTIONAL_ID_BOUNDS,
        compact: CompactTopic | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.topic = topic
        self._mutex = NameMutex(client, topic, mutex_name)
        self._allocator, self._epochs = allocator, epochs
        self._ids: ExpiringMap[str, tuple[int, int]] = ExpiringMap(bounds)
        self._clock = clock
        self._table = KeyedTable(client, topic, self._apply, compact=compact)
        self._writer = KeyedWriter(client, topic)  # tombstones, batched (see tables)
        self._loaded = False
        self._unwritten: list[str] = []  # expired here, tombstone not written yet

    def _now_ms(self) -> int:
        return now_ms(self._clock)

    def _apply(self, record: TableRecord) -> None:
        if record.value is None:
            self._ids.pop(record.key)
            return
        doc: dict[str, Any] = json.loads(record.value)
        value = (int(doc["producerId"]), int(doc["producerEpoch"]))
        self._ids.put(record.key, value, record.publish_time_ms)

    def get(self, transactional_id: str) -> tuple[int, int] | None:
        """(producer id, epoch) as last seen here."""
        return self._ids.get(transactional_id)

    async def lookup(self, transactional_id: str) -> tuple[int, int] | None:
        """(producer id, epoch) of an id initialised before the transaction coordinator
        took over transactional ids (read-only from then on)."""
        await self._catch_up()
        return self._ids.get(transactional_id)

    async def init(self, transactional_id: str) -> tuple[int, int]:
        async with self._mutex.hold() as held:
            await self._catch_up()
            current = self._ids.get(transactional_id)
            if current is None or current[1] >= MAX_EPOCH:
                pid, epoch = await self._allocator.allocate(), 0
            else:
                pid, epoch = current[0], current[1] + 1
            # fence first: once the epoch is durable, older epochs are refused
            await self._epochs.raise_to(pid, epoch)
            doc = {"producerId": pid, "producerEpoch": epoch}
            await held.send(json.dumps(doc).encode(), key=transactional_id)
            self._ids.put(transactional_id, (pid, epoch), self._now_ms())
            return pid, epoch

    async def _catch_up(self) -> None:
        """Catch up; after the first (full) read, ask for compaction when it is due."""
        await self._table.catch_up()
        if not self._loaded:
            self._loaded = True
            await self._table.compact_if_due(len(self._ids))

    async def sweep(self) -> int:
        """Drop expired and over-cap ids from memory (logged at INFO when any); tombstone
        the expired ones when the mutex is free. Returns how many ids were forgotten.

        Only a sidecar that loaded the table sweeps it: one that never served an init
        holds nothing, and starts never read this table.
        """
        if not self._loaded:
            return 0
        expired = self._ids.expire(self._now_ms())
        capped = self._ids.take_capped()
        if expired or capped:
            log.info(
                "%s: forgot %d transactional ids initialised more than %g s ago and %d over "
                "the cap of %d (oldest first); %d kept",
                self.topic,
                len(expired),
                self._ids.bounds.expiry_ms / 1000,
                capped,
                self._ids.bounds.max_entries,
                len(self._ids),
            )
        # bounded like the map: what did not fit is read again (and expires) at a start
        self._unwritten = (self._unwritten + [key for key, _, _ in expired])[
            -self._ids.bounds.max_entries :
        ]
        if self._unwritten:
            await self._tombstone()
        return len(expired) + capped

    async def _tombstone(self) -> None:
        try:
            async with self._mutex.hold(wait_s=0):
                await self._catch_up()
                gone = [k for k in self._unwritten if k not in self._ids]  # not initialised again
                for start in range(0, len(gone), _TOMBSTONES_AT_ONCE):
                    chunk = gone[start : start + _TOMBSTONES_AT_ONCE]
                    await asyncio.gather(*(self._writer.tombstone(k) for k in chunk))
                self._unwritten = []
        except MutexBusy:
            log.debug("%s: the coordinator mutex is busy; tombstones at the next sweep", self.topic)

    def __len__(self) -> int:
        return len(self._ids)

    async def close(self) -> None:
        await self._table.close()
        await self._writer.close()
