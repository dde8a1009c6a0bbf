"""What the group coordinator asks about a partition's last stable offset (LSO): where
"latest" is for a pull or a reset, how far a group's lag counts, and the transaction
log's word on a copy a pull's reader cannot settle from the data.

The runtime hands the coordinator the transactions' answer
(:class:`~kop_dedup.coordination.transactions.stable.StableOffsets`); a coordinator on
its own (tests of the groups alone) takes the end for the LSO (:class:`EndsOnly`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from typing import Protocol, TypeVar

from kop_dedup.protocol.stable import StableTracker
from kop_dedup.pulsar.message_ids import MessagePosition
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.reading import PartitionReader

__all__ = ["EndsOnly", "StableSource", "settle"]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class StableSource(Protocol):
    """See :class:`~kop_dedup.coordination.transactions.stable.StableOffsets`."""

    async def resolve(self, tracker: StableTracker) -> bool: ...

    async def exact_at(self, topic: str, partition: int) -> tuple[int, MessagePosition | None]: ...

    async def bounds(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]: ...


class EndsOnly:
    """The LSO as the end: no transaction log to ask (every copy is taken as whole)."""

    def __init__(self, positions: Positions, naming: Naming) -> None:
        self._positions, self._naming = positions, naming

    async def resolve(self, tracker: StableTracker) -> bool:
        fresh = [c for c in tracker.open_copies() if c.settled is None]
        for copy in fresh:
            tracker.settle(copy.key)
        return bool(fresh)

    async def exact_at(self, topic: str, partition: int) -> tuple[int, MessagePosition | None]:
        return await self._positions.end(self._naming.partition_topic(topic, partition))

    async def bounds(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {tp: (await self._positions.end(self._naming.partition_topic(*tp)))[0] for tp in tps}


async def settle(
    source: StableSource, readers: list[tuple[K, PartitionReader]], asked: set[K]
) -> bool:
    """Ask ``source`` (once per reader key in ``asked``'s lifetime: a pull) about the
    copies holding a reader's last stable offset that its data cannot settle; whether
    one was settled."""
    settled = False
    now = time.monotonic()
    for k, reader in readers:
        if k in asked or not reader.stable.to_ask(now):
            continue
        asked.add(k)
        try:
            settled = await source.resolve(reader.stable) or settled
        except Exception as exc:  # the log is away: the copy holds the LSO meanwhile
            log.warning("pull: asking the transaction log about %s: %r", reader.topic, exc)
    return settled
