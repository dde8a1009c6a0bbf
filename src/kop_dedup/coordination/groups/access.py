"""What the parts of the group store (offsets, pending offsets, the clean-close
protocol) use of the store, and what the coordinator's parts (pulls, resets) use of
the coordinator: structural types, so that a part depends on this surface and its
owner on the part, never both ways (the owner builds its parts and hands itself in)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from kop_dedup.coordination.groups.view import Doc

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kop_dedup.coordination.groups.api import ResolvedReset
    from kop_dedup.coordination.groups.readers import ReaderPool
    from kop_dedup.coordination.groups.settings import GroupSettings
    from kop_dedup.coordination.groups.stable import StableSource
    from kop_dedup.coordination.groups.state import GroupState
    from kop_dedup.coordination.partitions import StatePartitions
    from kop_dedup.protocol.groups import Committed, Delivery, Group, Mode, Resets, TopicPartition
    from kop_dedup.protocol.groups.classic import ClassicGroup
    from kop_dedup.pulsar.positions import Positions

__all__ = ["ClassicAccess", "ConsumerAccess", "CoordinatorAccess", "StoreAccess"]


class StoreAccess(Protocol):
    """The subset of :class:`~kop_dedup.coordination.groups.store.GroupStore` its
    parts call; see the store for what each member does."""

    @property
    def parts(self) -> StatePartitions: ...

    def partition_of(self, group: str) -> int: ...

    def doc(self, group: str, kind: str, *rest: object) -> Doc | None: ...

    def unclean(self, p: int) -> None: ...

    def view_doc(self, partition: int, k: str) -> Doc | None: ...

    def docs(self, group: str) -> list[tuple[list[Any], Doc]]: ...

    def groups_in(self, partition: int) -> list[str]: ...

    async def read(self, group: str) -> None: ...

    async def durable(self, p: int) -> None: ...

    async def owned(
        self,
        group: str,
        change: Callable[[int], Awaitable[Any]],
        *,
        caught_up: bool = False,
        take: bool = True,
        admit: bool = True,
    ) -> Any: ...

    async def write(self, p: int, k: str, doc: Doc) -> Doc: ...

    async def write_all(self, p: int, writes: Any) -> list[Doc]: ...

    async def remove(self, p: int, k: str) -> None: ...


class ClassicAccess(Protocol):
    """The subset of :class:`~kop_dedup.coordination.groups.classic.ClassicGroups` the
    resets call; see there for what each member does."""

    def is_kafka(self, group_id: str) -> bool: ...

    def group(self, group_id: str) -> ClassicGroup | None: ...

    async def reset_offsets(
        self, p: int, group_id: str, targets: Sequence[ResolvedReset]
    ) -> ClassicGroup | None: ...


class ConsumerAccess(Protocol):
    """The subset of :class:`~kop_dedup.coordination.groups.consumer.ConsumerGroups` the
    resets call (KIP-848 groups)."""

    async def reset_offsets(
        self, p: int, group_id: str, targets: Sequence[ResolvedReset]
    ) -> bool: ...


class CoordinatorAccess(Protocol):
    """The subset of :class:`~kop_dedup.coordination.groups.coordinator.GroupCoordinator`
    its pulls and resets call; see the coordinator for what each member does."""

    @property
    def store(self) -> StoreAccess: ...

    @property
    def positions(self) -> Positions: ...

    @property
    def readers(self) -> ReaderPool: ...

    @property
    def stable(self) -> StableSource: ...

    @property
    def settings(self) -> GroupSettings: ...

    @property
    def classic(self) -> ClassicAccess: ...

    @property
    def consumer(self) -> ConsumerAccess: ...

    @property
    def partitions_of(self) -> Callable[[str], Awaitable[int]]: ...

    def partition_topic(self, tp: TopicPartition) -> str: ...

    def group(self, group_id: str) -> Group | None: ...

    def delivery(self, group_id: str, owner: str, tp: TopicPartition) -> Delivery: ...

    def committed(
        self, group_id: str, mode: Mode, member: str, tp: TopicPartition
    ) -> Committed | None: ...

    def committed_key(self, group_id: str, mode: Mode, member: str, tp: TopicPartition) -> str: ...

    def state(self, group_id: str) -> GroupState: ...

    async def read(self, group_id: str) -> None: ...

    async def seen(self, p: int, group_id: str, member: str) -> Group: ...

    def resets_of(self, group_id: str, tp: TopicPartition) -> Resets: ...
