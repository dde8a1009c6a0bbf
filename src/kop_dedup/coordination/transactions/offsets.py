"""What the transaction coordinator needs of the consumer-groups store: the offsets a
transaction stages, and their commit or abort once it is decided.

A structural type, so that the store is reached on whichever node coordinates the group
(:class:`kop_dedup.cluster.offsets.RoutedOffsets` wraps the local
:class:`~kop_dedup.coordination.groups.store.GroupStore` and forwards to the group's
coordinator when that is another node).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kop_dedup.coordination.groups.offsets import StagedOffset

__all__ = ["TxnOffsets"]


class TxnOffsets(Protocol):
    async def mark_pending(
        self,
        group: str,
        keys: Iterable[tuple[str, int]],
        transactional_id: str,
        ordinal: int,
        *,
        member_id: str | None = None,
        generation: int | None = None,
        instance_id: str | None = None,
    ) -> None: ...

    async def commit_transaction(
        self, group: str, transactional_id: str, ordinal: int, offsets: Iterable[StagedOffset]
    ) -> list[StagedOffset]: ...

    async def abort_transaction(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None: ...
