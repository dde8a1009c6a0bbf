"""Bounded group state, on the owner of each store partition (a loop every
``group_retention_check_interval_ms``):

* a group with no members, no offsets pending in a transaction and nothing done for
  ``group_retention_ms`` (default 7 days, Kafka's ``offsets.retention.minutes``) is
  forgotten: every key of it is removed (compaction then drops them from the log), its
  readers close and its durable Pulsar subscriptions are deleted (Pulsar keeps no
  backlog for it any more);
* a broadcast member that left keeps its records while it counts for the group
  minimum (``broadcastExpireMs`` after it was last seen); then they go;
* a group name claimed (its owner, the role that used it first) over ``group_retention_ms``
  ago of which nothing was ever stored and which has no Kafka member: its owner is
  forgotten, as Kafka forgets an empty group without offsets;
* pending-offset markers whose transaction ended without removing them go
  (:meth:`~kop_dedup.coordination.groups.store.GroupStore.sweep`).

The rules are pure (:mod:`kop_dedup.protocol.groups.retention`); each removal checks
them again as the owner, under the partition's lock, on the state as it then is.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.coordinator import GroupCoordinator
from kop_dedup.coordination.groups.state import GroupState
from kop_dedup.coordination.groups.store import key
from kop_dedup.protocol.groups import (
    TopicPartition,
    departed_broadcast_members,
    group_expired,
)

__all__ = ["GroupRetention"]

log = logging.getLogger(__name__)

Forgotten = Callable[[str, list[TopicPartition]], Awaitable[None]]
"""Told of a forgotten group and the partitions it had (its subscriptions go)."""
Release = Callable[[str], Awaitable[str | None]]
"""Forgets a group's owner (the role that used it first), answering the one it had."""
ClaimedBefore = Callable[[int], Awaitable[list[str]]]
"""The group names whose owner claimed them before a time (epoch ms)."""


class GroupRetention:
    def __init__(
        self, groups: GroupCoordinator, *, retention_ms: int, forgotten: Forgotten
    ) -> None:
        self._groups, self.retention_ms, self._forgotten = groups, retention_ms, forgotten
        self.release: Release | None = None
        """Forgets a forgotten group's owner, under the store partition's lock after its
        keys are removed (Kafka's expiry and DeleteGroups forget the name whole); set
        where the security side is wired (:mod:`kop_dedup.security.pruning`)."""
        self.claimed_before: ClaimedBefore | None = None
        """Names claimed before a time: those never stored are forgotten by the sweep."""

    def _expired(self, state: GroupState, now: int) -> bool:
        kafka = self._groups.classic.group(state.group_id)
        if kafka is not None and kafka.members:  # a Kafka group with members is live
            return False
        return group_expired(
            state.group,
            state.activity(),
            pending=bool(state.pending),
            now_ms=now,
            retention_ms=self.retention_ms,
        )

    async def sweep(self) -> None:
        """One round over the groups of the partitions this sidecar owns."""
        groups = self._groups
        await groups.store.sweep()
        now = now_ms()
        for group_id in await groups.owned_groups():
            try:
                await self._sweep_group(group_id, now)
            except errors.NotCoordinator:  # moved since: its new owner sweeps it
                continue
        if self.claimed_before is not None:
            await self._forget_unstored(now)

    async def _sweep_group(self, group_id: str, now: int) -> None:
        groups = self._groups
        state = groups.state(group_id)
        if self._expired(state, now):
            await self._forget(group_id)
        elif state.group is not None and departed_broadcast_members(
            state.group, state.last_seen(), now
        ):
            await self._forget_members(group_id)
        elif (
            state.group is not None
            and not state.group.members
            and not any(t is not None for t in [state.group.changed_ms, *state.activity()])
        ):
            await self._start_clock(group_id)

    async def _forget_unstored(self, now: int) -> None:
        """Owners of names claimed over ``retention_ms`` ago and never stored (nothing in
        the store, no Kafka member) are forgotten, as the owner of the name's store
        partition, under its lock."""
        assert self.claimed_before is not None
        groups = self._groups
        for group_id in await self.claimed_before(now - self.retention_ms):
            if not groups.store.parts.owned(groups.store.partition_of(group_id)):
                continue

            async def change(_p: int, group_id: str = group_id) -> str | None:
                kafka = groups.classic.group(group_id)
                if groups.state(group_id).stored or (kafka is not None and kafka.members):
                    return None
                return await self.released(group_id)

            try:
                owner = await groups.store.owned(group_id, change, take=False)
            except errors.NotCoordinator:  # moved since: its new owner sweeps it
                continue
            if owner is not None:
                log.info(
                    "group %r: claimed by %r over %d ms ago, never stored: forgotten",
                    group_id,
                    owner,
                    self.retention_ms,
                )

    async def _forget(self, group_id: str) -> None:
        def expired(state: GroupState) -> bool:
            return self._expired(state, now_ms())

        if await self.forget(group_id, expired, take=False):
            log.info(
                "group %r: no members and nothing done for %d ms: forgotten",
                group_id,
                self.retention_ms,
            )

    async def forget(
        self, group_id: str, may: Callable[[GroupState], bool], *, take: bool = True
    ) -> bool:
        """Forget the group whole, as the owner of its partition, when ``may(state)``
        says so on the state as it then is (it may raise, to refuse with a Kafka error):
        every key of it removed, its readers closed, its subscriptions deleted. Whether it
        was forgotten. The one removal path of a group: retention and DeleteGroups."""
        groups = self._groups

        async def change(p: int) -> list[TopicPartition] | None:
            state = groups.state(group_id)
            if not may(state):
                return None
            tps = sorted(set(state.partitions()) | {tp for _, tp in state.member_offsets})
            for k, _ in groups.store.docs(group_id):
                await groups.store.remove(p, key(*k))
            await self.released(group_id)
            return tps

        tps: list[TopicPartition] | None = await groups.store.owned(group_id, change, take=take)
        if tps is None:
            return False
        groups.readers.drop(group_id)
        await self.forgotten(group_id, tps)
        return True

    async def released(self, group_id: str) -> str | None:
        """The group's owner forgotten (None: it had none, or nothing is wired)."""
        return None if self.release is None else await self.release(group_id)

    async def forgotten(self, group_id: str, tps: list[TopicPartition]) -> None:
        """Offsets of ``tps`` were removed: the subscriptions that followed them go."""
        try:
            await self._forgotten(group_id, tps)
        except Exception as exc:  # the subscriptions stay (Pulsar keeps their backlog)
            log.warning("group %r: deleting its subscriptions failed: %r", group_id, exc)

    async def _forget_members(self, group_id: str) -> None:
        groups = self._groups

        async def change(p: int) -> list[str]:
            state = groups.state(group_id)
            if state.group is None:
                return []
            gone = departed_broadcast_members(state.group, state.last_seen(), now_ms())
            if not gone:
                return []
            for k, _ in groups.store.docs(group_id):
                if k[0] in {"b", "d"} and k[2] in gone:
                    await groups.store.remove(p, key(*k))
            for tp, resets in state.resets.items():
                kept = resets.without(gone)
                if kept.entries != resets.entries:
                    await groups.store.write(p, key("r", group_id, tp[0], tp[1]), kept.to_doc())
            return gone

        gone: list[str] = await groups.store.owned(group_id, change, take=False)
        for member in gone:
            groups.readers.drop(group_id, member)
        if gone:
            log.info("group %r: departed broadcast members %s forgotten", group_id, gone)

    async def _start_clock(self, group_id: str) -> None:
        """A group stored before its changes were timed: its retention counts from now."""
        groups = self._groups

        async def change(p: int) -> None:
            group = groups.group(group_id)
            if group is not None and group.changed_ms is None:
                timed = replace(group, changed_ms=now_ms())
                await groups.store.write(p, key("g", group_id), timed.to_doc())

        await groups.store.owned(group_id, change, take=False)
