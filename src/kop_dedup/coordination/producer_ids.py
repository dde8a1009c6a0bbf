"""Producer ids unique across every sidecar of the cluster, handed out in blocks.

Topic ``producer-id-blocks`` (system namespace, dedup on, infinite retention):
blocks of :data:`BLOCK_SIZE` producer ids. A sidecar claims the next block
while it holds the name mutex ``<prefix>-producer-id-allocator`` on that topic
(Pulsar refuses a second producer with the same name, so the name is a
cluster-wide mutex). The block number is the message's sequence id minus one
and its payload, so the claim survives broker restarts through dedup state and,
should that be purged, through the topic's last message.

A claim the broker refuses as a duplicate means what we read was behind what
the topic holds (a claim still in flight when we read, a dedup state being
recovered): the block is someone else's. The allocator claims again, reading
afresh, a few times before it answers KAFKA_STORAGE_ERROR; a client asking for
a producer id never sees a race it cannot act on.
"""

from __future__ import annotations

import asyncio
import logging

from kop_dedup import errors
from kop_dedup.pulsar.exclusive import NameMutex

__all__ = ["BLOCK_SIZE", "ProducerIdAllocator"]

log = logging.getLogger(__name__)

BLOCK_SIZE = 1000
CLAIM_ATTEMPTS = 5
"""Claims tried (each reading afresh) before a refused claim is answered 56."""
_CLAIM_BACKOFF_S = 0.05


class ProducerIdAllocator:
    """Hands out producer ids unique across every sidecar on the cluster."""

    def __init__(self, mutex: NameMutex) -> None:
        self._mutex = mutex
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                block = await self._claim_until_stored()
                self._next, self._end = block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE
            pid = self._next
            self._next += 1
            return pid

    async def _claim_until_stored(self) -> int:
        delay = _CLAIM_BACKOFF_S
        for attempt in range(1, CLAIM_ATTEMPTS):
            try:
                return await self._claim_block()
            except errors.KafkaStorageError as exc:
                log.info("claim %d refused (%s); reading again", attempt, exc)
                await asyncio.sleep(delay)
                delay *= 2
        return await self._claim_block()

    async def _claim_block(self) -> int:
        async with self._mutex.hold() as held:
            last = held.last_sequence_id - 1  # -2 when the broker knows none
            record = await held.last_record()
            if record is not None and record.value is not None:
                last = max(last, int(record.value))
            block = last + 1 if last >= 0 else 0
            if not await held.send(str(block).encode(), sequence_id=block + 1):
                raise errors.KafkaStorageError(
                    f"producer id block {block} was already claimed; retry"
                )
            log.info("claimed producer id block %d", block)
            return block
