"""The registries over one Pulsar client: producer ids, epochs, transactional ids.

Three topics in the system namespace (dedup on, infinite retention, compacted:
the keyed ones are read compacted, so a start reads about one record per key), one
concept per module: :mod:`.producer_ids` (blocks of producer ids under a name
mutex), :mod:`.epochs` (the highest epoch per producer id, which fences), and
:mod:`.transactional_ids` (transactionalId -> producer id and epoch). Only the
Pulsar adapters (:mod:`kop_dedup.pulsar.tables`, :mod:`kop_dedup.pulsar.exclusive`)
touch the client.

Memory is bounded (:class:`RegistryBounds`): a sweep every ``sweep_interval_s``
drops expired and over-cap entries and tombstones the expired ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kop_dedup.coordination.epochs import DEFAULT_EPOCH_BOUNDS, EpochRegistry
from kop_dedup.coordination.expiry import Bounds
from kop_dedup.coordination.producer_ids import ProducerIdAllocator
from kop_dedup.coordination.transactional_ids import (
    DEFAULT_TRANSACTIONAL_ID_BOUNDS,
    TransactionalIds,
)
from kop_dedup.pulsar.exclusive import NameMutex
from kop_dedup.pulsar.tables import CompactTopic, PulsarClient

__all__ = ["EpochRegistry", "ProducerIdAllocator", "Registry", "RegistryBounds", "TransactionalIds"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RegistryBounds:
    epochs: Bounds = DEFAULT_EPOCH_BOUNDS
    transactional_ids: Bounds = DEFAULT_TRANSACTIONAL_ID_BOUNDS
    sweep_interval_s: float = 60.0
    fencing_lease_s: float = 0.0
    """The epochs' fencing lease (:mod:`.epochs`; 0: a catch-up per decision)."""


class Registry:
    """The three registries of one sidecar, started and closed together."""

    def __init__(
        self,
        client: PulsarClient,
        system_namespace: str,
        prefix: str,
        *,
        bounds: RegistryBounds | None = None,
        compact: CompactTopic | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``compact`` asks the broker to compact a topic (``PulsarAdmin.compact``); with
        it, a start that reads many more records than there are keys asks for one.
        ``clock`` (wall time, seconds) dates entries for expiry."""
        self.bounds = bounds or RegistryBounds()
        base = f"persistent://{system_namespace}"
        blocks = f"{base}/producer-id-blocks"
        self.allocator = ProducerIdAllocator(
            NameMutex(client, blocks, f"{prefix}-producer-id-allocator")
        )
        self.epochs = EpochRegistry(
            client,
            f"{base}/producer-epochs",
            bounds=self.bounds.epochs,
            sweeper_name=f"{prefix}-epoch-sweeper",
            compact=compact,
            clock=clock,
            lease_s=self.bounds.fencing_lease_s,
        )
        self.transactional = TransactionalIds(
            client,
            f"{base}/transactional-ids",
            f"{prefix}-transaction-coordinator",
            self.allocator,
            self.epochs,
            bounds=self.bounds.transactional_ids,
            compact=compact,
            clock=clock,
        )
        self._sweeping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Replay the epochs (the produce path trusts ``epochs.highest`` from here on),
        then sweep now and every ``sweep_interval_s`` in the background."""
        await self.epochs.load()
        self.epochs.start_refreshing()
        self._sweeping = asyncio.create_task(self._sweep_forever(), name="registry-sweeper")

    async def sweep(self) -> None:
        await self.epochs.sweep()
        await self.transactional.sweep()

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # a failed sweep is retried at the next one
                log.warning("sweeping the registries failed: %s", exc)
            await asyncio.sleep(self.bounds.sweep_interval_s)

    async def close(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
        await self.transactional.close()
        await self.epochs.close()
