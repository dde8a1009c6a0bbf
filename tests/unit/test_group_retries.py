"""A change the group store runs again after a write it reported failed but stored
(the writer closed under it while another sidecar took the partition): the retry
sees its own first try in the log and must answer as if it had succeeded. Pure logic
over an in-memory store; the real-broker runs are test_group_retention.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kop_dedup import errors
from kop_dedup.coordination.groups.coordinator import GroupCoordinator, StaleMember
from kop_dedup.coordination.groups.settings import GroupSettings
from kop_dedup.coordination.groups.view import key


class InDoubtStore:
    """One partition in memory. ``doubt`` writes are stored and then reported failed
    (NOT_COORDINATOR), as a send whose producer was closed under it may be: ``owned``
    runs the change again, as the real store does."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.doubt = 0
        self.tries = 0

    def on_orphan(self, hook: Callable[[int], Awaitable[None]]) -> None:
        pass

    def partition_of(self, group: str) -> int:
        return 0

    def doc(self, group: str, kind: str, *rest: object) -> dict[str, Any] | None:
        return self.docs.get(key(kind, group, *rest))

    async def write(self, p: int, k: str, doc: dict[str, Any]) -> dict[str, Any]:
        stored = {**doc, "v": int(self.docs.get(k, {}).get("v", 0)) + 1}
        self.docs[k] = stored
        return stored

    async def owned(self, group: str, change: Callable[[int], Awaitable[Any]], **_: Any) -> Any:
        for _attempt in range(3):
            self.tries += 1
            result = await change(0)
            if self.doubt:
                self.doubt -= 1
                continue  # stored, yet reported failed: the real store retries
            return result
        raise errors.NotCoordinator("keeps moving")


async def _partitions(topic: str) -> int:
    return 1


def coordinator(store: InDoubtStore) -> GroupCoordinator:
    return GroupCoordinator(
        store,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        partitions_of=_partitions,
        settings=GroupSettings(),
    )


def test_a_leave_whose_stored_write_was_reported_failed_is_answered_as_done() -> None:
    async def run() -> None:
        store = InDoubtStore()
        groups = coordinator(store)
        await groups.join("g", "m", ["t"])
        store.doubt, store.tries = 1, 0
        await groups.leave("g", "m")  # raised UNKNOWN_MEMBER_ID (25) on its retry before
        assert store.tries == 2
        group = groups.group("g")
        assert group is not None
        assert "m" not in group.members

    asyncio.run(run())


def test_a_leave_of_a_member_that_never_joined_is_still_unknown() -> None:
    async def run() -> None:
        store = InDoubtStore()
        groups = coordinator(store)
        await groups.join("g", "m", ["t"])
        with pytest.raises(StaleMember) as raised:
            await groups.leave("g", "other")
        assert isinstance(raised.value.error, errors.UnknownMemberId)

    asyncio.run(run())
