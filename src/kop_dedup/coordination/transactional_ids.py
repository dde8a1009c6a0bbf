"""transactionalId -> (producer id, epoch): each init bumps the epoch, durably.

Topic ``transactional-ids`` (system namespace): keyed ``transactionalId ->
{"producerId", "producerEpoch"}`` records, written only while holding the name
mutex ``<prefix>-transaction-coordinator`` and after catching up, so the latest
record of a key is always the truth (one writer at a time).
"""

from __future__ import annotations

import json
from typing import Any

from kop_dedup.coordination.epochs import EpochRegistry
from kop_dedup.coordination.producer_ids import ProducerIdAllocator
from kop_dedup.protocol.records import MAX_EPOCH
from kop_dedup.pulsar.exclusive import NameMutex
from kop_dedup.pulsar.tables import CompactTopic, KeyedTable, PulsarClient, TableRecord

__all__ = ["TransactionalIds"]


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
        compact: CompactTopic | None = None,
    ) -> None:
        self.topic = topic
        self._mutex = NameMutex(client, topic, mutex_name)
        self._allocator, self._epochs = allocator, epochs
        self._ids: dict[str, tuple[int, int]] = {}
        self._table = KeyedTable(client, topic, self._apply, compact=compact)
        self._loaded = False

    def _apply(self, record: TableRecord) -> None:
        if record.value is None:
            self._ids.pop(record.key, None)
            return
        doc: dict[str, Any] = json.loads(record.value)
        self._ids[record.key] = (int(doc["producerId"]), int(doc["producerEpoch"]))

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
            self._ids[transactional_id] = (pid, epoch)
            return pid, epoch

    async def _catch_up(self) -> None:
        """Catch up; after the first (full) read, ask for compaction when it is due."""
        await self._table.catch_up()
        if not self._loaded:
            self._loaded = True
            await self._table.compact_if_due(len(self._ids))

    def __len__(self) -> int:
        return len(self._ids)

    async def close(self) -> None:
        await self._table.close()
