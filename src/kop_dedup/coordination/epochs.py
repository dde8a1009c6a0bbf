"""The highest epoch per producer id, durable in Pulsar: the registry that fences.

Topic ``producer-epochs`` (system namespace): keyed ``producerId -> epoch``
records, written by any sidecar (:meth:`EpochRegistry.raise_to`); the highest
epoch seen for a producer id fences all lower ones (INVALID_PRODUCER_EPOCH).
Every sidecar replays the topic at start and catches up again before it trusts
its memory (:meth:`EpochRegistry.barrier`).

What the produce path may rely on:

- ``highest(pid)`` is synchronous and reads memory only;
- ``await barrier()`` returns once every epoch written before the call, by any
  sidecar, is applied here (one coalesced catch-up serves concurrent callers);
- ``await raise_to(pid, epoch)`` returns once the epoch is durable in Pulsar,
  and applies it here at once.
"""

from __future__ import annotations

import logging

from kop_dedup.pulsar.tables import (
    CompactTopic,
    KeyedTable,
    KeyedWriter,
    PulsarClient,
    TableRecord,
)

__all__ = ["EpochRegistry"]

log = logging.getLogger(__name__)


class EpochRegistry:
    """Highest epoch per producer id, durable in Pulsar."""

    def __init__(
        self, client: PulsarClient, topic: str, *, compact: CompactTopic | None = None
    ) -> None:
        self.topic = topic
        self._highest: dict[int, int] = {}
        self._table = KeyedTable(client, topic, self._apply, compact=compact)
        self._writer = KeyedWriter(client, topic)

    def _apply(self, record: TableRecord) -> None:
        if record.value is None:
            return
        pid, epoch = int(record.key), int(record.value)
        if epoch > self._highest.get(pid, -1):
            self._highest[pid] = epoch

    def highest(self, producer_id: int) -> int | None:
        return self._highest.get(producer_id)

    async def catch_up(self) -> None:
        await self._table.catch_up()

    async def load(self) -> None:
        """Replay the topic (read compacted); ask for compaction when that read many
        more records than there are producer ids, so the next start reads fewer."""
        await self._table.catch_up()
        await self._table.compact_if_due(len(self._highest))

    @property
    def records_read(self) -> int:
        """Records read from the topic since this registry was created."""
        return self._table.records_read

    def __len__(self) -> int:
        return len(self._highest)

    async def barrier(self) -> None:
        """Return once every epoch written before this call is applied here (coalesced)."""
        await self._table.barrier()

    async def raise_to(self, producer_id: int, epoch: int) -> None:
        """Record ``epoch`` for ``producer_id`` durably before anything relies on it."""
        if epoch <= self._highest.get(producer_id, -1):
            return
        await self._writer.send(str(producer_id), str(epoch).encode())
        if epoch > self._highest.get(producer_id, -1):
            self._highest[producer_id] = epoch

    async def close(self) -> None:
        await self._table.close()
        await self._writer.close()
