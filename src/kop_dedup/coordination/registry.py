"""The registries over one Pulsar client: producer ids, epochs, transactional ids.

Three topics in the system namespace (dedup on, infinite retention, compacted:
the keyed ones are read compacted, so a start reads about one record per key), one
concept per module: :mod:`.producer_ids` (blocks of producer ids under a name
mutex), :mod:`.epochs` (the highest epoch per producer id, which fences), and
:mod:`.transactional_ids` (transactionalId -> producer id and epoch). Only the
Pulsar adapters (:mod:`kop_dedup.pulsar.tables`, :mod:`kop_dedup.pulsar.exclusive`)
touch the client.
"""

from __future__ import annotations

from kop_dedup.coordination.epochs import EpochRegistry
from kop_dedup.coordination.producer_ids import ProducerIdAllocator
from kop_dedup.coordination.transactional_ids import TransactionalIds
from kop_dedup.pulsar.exclusive import NameMutex
from kop_dedup.pulsar.tables import CompactTopic, PulsarClient

__all__ = ["EpochRegistry", "ProducerIdAllocator", "Registry", "TransactionalIds"]


class Registry:
    """The three registries of one sidecar, started and closed together."""

    def __init__(
        self,
        client: PulsarClient,
        system_namespace: str,
        prefix: str,
        *,
        compact: CompactTopic | None = None,
    ) -> None:
        """``compact`` asks the broker to compact a topic (``PulsarAdmin.compact``); with
        it, a start that reads many more records than there are keys asks for one."""
        base = f"persistent://{system_namespace}"
        blocks = f"{base}/producer-id-blocks"
        self.allocator = ProducerIdAllocator(
            NameMutex(client, blocks, f"{prefix}-producer-id-allocator")
        )
        self.epochs = EpochRegistry(client, f"{base}/producer-epochs", compact=compact)
        self.transactional = TransactionalIds(
            client,
            f"{base}/transactional-ids",
            f"{prefix}-transaction-coordinator",
            self.allocator,
            self.epochs,
            compact=compact,
        )

    async def start(self) -> None:
        """Replay the epochs: the produce path trusts ``epochs.highest`` from here on."""
        await self.epochs.load()

    async def close(self) -> None:
        await self.transactional.close()
        await self.epochs.close()
