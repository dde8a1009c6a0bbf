"""The coordinator of Kafka classic groups (JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
commits of their members): Kafka's ``GroupCoordinator`` for client-side assignment,
with the group's state (:class:`~kop_dedup.protocol.groups.classic.ClassicGroup`) in the
group store under ``["k", group]``, so any sidecar serves any member.

Every change runs as the owner of the group's store partition (:meth:`GroupStore.owned
<kop_dedup.coordination.groups.store.GroupStore.owned>`). What Kafka keeps waiting in
memory (a JoinGroup until its round completes, a follower's SyncGroup until the leader
brings the assignment) waits here by reading the store again every
:data:`POLL_S` until the answer is there or its deadline passes: whichever sidecar got
the request answers it, and a round past its deadline is completed by the first waiter
(or the owner's sweep) that sees it due.

Static members (KIP-345, ``group.instance.id``) follow the rules of
:mod:`kop_dedup.protocol.groups.static`: a restart takes the old member's place without
a rebalance, and the replaced member id is fenced (82), a waiting JoinGroup or SyncGroup
of it included.

A group is a Kafka group or an HTTP group (``["g", group]``), never both: a JoinGroup
for an HTTP group is INCONSISTENT_GROUP_PROTOCOL (23), and the HTTP coordinator answers
its calls for a Kafka group with 23 (a 409 over HTTP).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.api import ResolvedReset
from kop_dedup.coordination.groups.offsets import offset_doc
from kop_dedup.coordination.groups.settings import GroupSettings, full
from kop_dedup.coordination.groups.store import GroupStore, StagedOffset, key
from kop_dedup.coordination.names import validate_group_id, validate_topics
from kop_dedup.protocol.groups import static
from kop_dedup.protocol.groups.classic import (
    PREPARING,
    STABLE,
    ClassicGroup,
    JoinRequest,
)

__all__ = ["POLL_S", "ClassicGroups", "JoinAnswer", "NewMemberId", "SyncAnswer"]

POLL_S = 0.1
"""How often a waiting JoinGroup or SyncGroup reads the group again."""

MIN_SESSION_MS_DEFAULT = 6_000
MAX_SESSION_MS_DEFAULT = 1_800_000


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    member_id: str
    generation: int
    protocol_type: str | None
    protocol: str | None
    leader: str
    members: tuple[tuple[str, str | None, bytes], ...]
    """(member id, instance id, metadata) of every member: the leader's answer only."""
    skip_assignment: bool = False
    """A static leader's restart into a Stable group (KIP-814): the assignment stands."""
    leader_before: str = ""
    """With ``skip_assignment``: the leader's id before the restart replaced it (what
    Kafka answers as the leader below JoinGroup v9, so that the leader does not assign)."""


@dataclass(frozen=True, slots=True)
class NewMemberId:
    """KIP-394: the member must join again with this id (MEMBER_ID_REQUIRED, 79)."""

    member_id: str


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    protocol_type: str | None
    protocol: str | None
    assignment: bytes


class ClassicGroups:
    def __init__(self, store: GroupStore, settings: GroupSettings) -> None:
        self.store = store
        self.min_session_ms = settings.kafka_min_session_timeout_ms
        self.max_session_ms = MAX_SESSION_MS_DEFAULT
        self.max_members = settings.max_members
        self.closing = False

    # -- reading --------------------------------------------------------------------------

    def group(self, group_id: str) -> ClassicGroup | None:
        """The group as this sidecar has read it (None: not a Kafka group)."""
        return ClassicGroup.from_doc(self.store.doc(group_id, "k"))

    def is_kafka(self, group_id: str) -> bool:
        return self.store.doc(group_id, "k") is not None

    def plain_commits(self, group_id: str) -> bool:
        """A group of committed offsets only (no Kafka membership ever, not an HTTP group):
        Kafka lists and describes such a "simple" group as Empty (no I/O)."""
        kinds = {k[0] for k, _ in self.store.docs(group_id)}
        return "o" in kinds and not kinds & {"k", "g"}

    async def read(self, group_id: str) -> ClassicGroup | None:
        await self.store.read(group_id)
        return self.group(group_id)

    def _not_http(self, group_id: str) -> None:
        if self.store.doc(group_id, "g") is not None:
            raise errors.InconsistentGroupProtocol(
                f"group {group_id!r} is an HTTP consumer group (server-side assignment): "
                "a Kafka consumer cannot join it; use another group id"
            )

    async def _write(self, p: int, group_id: str, group: ClassicGroup) -> None:
        await self.store.write(p, key("k", group_id), group.to_doc())

    # -- JoinGroup --------------------------------------------------------------------------

    async def join(
        self, group_id: str, req: JoinRequest, *, require_known_id: bool
    ) -> JoinAnswer | NewMemberId:
        """JoinGroup: 79 MEMBER_ID_REQUIRED with a new id for a new dynamic member (v4+,
        ``require_known_id``), else the member's round joined and waited for (up to the
        rebalance deadline); a static member's restart takes its old member's place
        (:mod:`kop_dedup.protocol.groups.static`). Raises the Kafka error otherwise (23,
        24, 25, 26, 82)."""
        validate_group_id(group_id)
        if not self.min_session_ms <= req.session_timeout_ms <= self.max_session_ms:
            raise errors.InvalidSessionTimeout(
                f"session timeout {req.session_timeout_ms} ms is outside "
                f"[{self.min_session_ms}, {self.max_session_ms}]"
            )
        if not req.member_id:
            new_id = f"{req.instance_id or req.client_id or 'member'}-{uuid.uuid4()}"
            if require_known_id and req.instance_id is None:

                async def pend(p: int) -> None:
                    self._not_http(group_id)
                    before = self.group(group_id) or ClassicGroup.new()
                    before.check_protocols(req)
                    self._room(group_id, before, now_ms())
                    await self._write(
                        p, group_id, before.add_pending(new_id, now_ms(), req.session_timeout_ms)
                    )

                await self.store.owned(group_id, pend)
                return NewMemberId(new_id)
            req = replace(req, member_id=new_id)
            fresh = True
        else:
            fresh = False

        restart, leader_before = False, ""

        async def change(p: int) -> ClassicGroup:
            nonlocal restart, leader_before
            self._not_http(group_id)
            before = self.group(group_id) or ClassicGroup.new()
            restart, leader_before = static.replaces(before, req, fresh=fresh), before.leader or ""
            if fresh and not restart:
                self._room(group_id, before, now_ms())
                before = before.add_pending(req.member_id, now_ms(), req.session_timeout_ms)
            after = static.join(before, req, now_ms(), fresh=fresh)
            await self._write(p, group_id, after)
            return after

        group: ClassicGroup = await self.store.owned(group_id, change)
        if not group.member(req.member_id).awaiting_join:  # its round completed, or none began
            answer = self._answer(group, req.member_id)
            if not (restart and group.state == STABLE):
                return answer
            # a restarted leader must not assign (a Stable group would not broadcast it):
            # KIP-814's skip_assignment, or below v9 the leader id as it was (Kafka's)
            skip = group.leader == req.member_id
            return replace(answer, skip_assignment=skip, leader_before=leader_before)
        return await self._await_round(group_id, req, group.generation)

    def _room(self, group_id: str, group: ClassicGroup, now: int) -> None:
        """GROUP_MAX_SIZE_REACHED (81) when one more member would pass the cap."""
        waiting = sum(1 for t in group.pending.values() if t >= now)
        full(group_id, len(group.members) + waiting, self.max_members)

    async def _await_round(self, group_id: str, req: JoinRequest, started: int) -> JoinAnswer:
        member_id = req.member_id
        while True:
            group = self.group(group_id)
            if group is not None and not group.has(member_id):
                static.validate(group, member_id, req.instance_id)  # 82: a restart replaced it
            if group is None or not group.has(member_id):
                raise errors.UnknownMemberId(
                    f"member {member_id!r} left group {group_id!r} while it joined: join again"
                )
            if group.generation > started:
                return self._answer(group, member_id)
            if group.state == PREPARING and now_ms() >= group.deadline_ms:
                await self._expire(group_id)
                continue
            if self.closing:
                raise errors.RebalanceInProgress("the sidecar is stopping: join again")
            await asyncio.sleep(POLL_S)
            await self.store.read(group_id)

    def _answer(self, group: ClassicGroup, member_id: str) -> JoinAnswer:
        leader = group.leader or ""
        members = (
            tuple(
                (m.member_id, m.instance_id, m.metadata(group.protocol))
                for m in group.members.values()
            )
            if member_id == leader
            else ()
        )
        return JoinAnswer(
            member_id, group.generation, group.protocol_type, group.protocol, leader, members
        )

    # -- SyncGroup --------------------------------------------------------------------------

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: Mapping[str, bytes],
        *,
        protocol_type: str | None,
        protocol: str | None,
        instance_id: str | None = None,
    ) -> SyncAnswer:
        """SyncGroup: the leader's assignment stored; each member its own (a follower
        waits for the leader's, up to its session). 82, 25, 22, 27 as Kafka; 23 when the
        protocol type or name given is not the group's."""

        async def change(p: int) -> ClassicGroup:
            group = self._kafka_group(group_id, member_id)
            static.check(group, member_id, instance_id, generation)
            if group.state == PREPARING:
                raise errors.RebalanceInProgress("the group is rebalancing: join again")
            _same_protocol(group, protocol_type, protocol)
            after = group.sync(member_id, generation, assignments)
            refreshed = after.seen(member_id, now_ms())
            if after is not group or refreshed is not None:
                await self._write(p, group_id, refreshed or after)
            return refreshed or after

        group: ClassicGroup = await self.store.owned(group_id, change)
        session_ms = group.member(member_id).session_timeout_ms
        deadline = time.monotonic() + session_ms / 1000
        while True:
            static.validate(group, member_id, instance_id)  # 82 once a restart replaced it
            if group.state == STABLE and group.generation == generation:
                m = group.member(member_id)
                return SyncAnswer(group.protocol_type, group.protocol, m.assignment)
            if group.generation != generation or group.state == PREPARING:
                raise errors.RebalanceInProgress("the group is rebalancing: join again")
            if time.monotonic() >= deadline or self.closing:
                raise errors.RebalanceInProgress("the leader brought no assignment: join again")
            await asyncio.sleep(POLL_S)
            group = await self.read(group_id) or ClassicGroup.new()

    # -- Heartbeat, LeaveGroup ----------------------------------------------------------------

    def _kafka_group(self, group_id: str, member_id: str) -> ClassicGroup:
        group = self.group(group_id)
        if group is None:
            self._not_http(group_id)
            raise errors.UnknownMemberId(f"member {member_id!r} is not in group {group_id!r}")
        return group

    async def heartbeat(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> None:
        """Heartbeat: 82 (a static member's replaced id), 25, 22, 27 while
        PreparingRebalance (the member joins again); its session refreshed."""
        await self.store.read(group_id)
        group = self._kafka_group(group_id, member_id)
        static.check(group, member_id, instance_id, generation)
        if group.seen(member_id, now_ms()) is not None:

            async def change(p: int) -> ClassicGroup:
                current = self._kafka_group(group_id, member_id)
                static.check(current, member_id, instance_id, generation)
                refreshed = current.seen(member_id, now_ms())
                if refreshed is not None:
                    await self._write(p, group_id, refreshed)
                return refreshed or current

            group = await self.store.owned(group_id, change)
        if group.state == PREPARING:
            raise errors.RebalanceInProgress("the group is rebalancing: join again")

    async def leave(
        self, group_id: str, member_ids: Sequence[str | tuple[str, str | None]]
    ) -> list[errors.KafkaError | None]:
        """LeaveGroup of each member, named by its id or (member id, instance id): None
        when it left, 25 when it was not there, 82 for a static member's replaced id; an
        instance id with an empty member id removes that static member (Kafka's)."""

        async def change(p: int) -> list[errors.KafkaError | None]:
            group = self.group(group_id)
            if group is None:
                self._not_http(group_id)
                return [errors.UnknownMemberId(f"no member {m!r}") for m in member_ids]
            out: list[errors.KafkaError | None] = []
            now = now_ms()
            for named in member_ids:
                m, instance = named if isinstance(named, tuple) else (named, None)
                try:
                    if m not in group.pending:
                        m = static.leaver(group, m, instance)
                    group = group.leave(m, now)
                    out.append(None)
                except (errors.UnknownMemberId, errors.FencedInstanceId) as exc:
                    out.append(exc)
            if any(o is None for o in out):
                await self._write(p, group_id, group)
            return out

        result: list[errors.KafkaError | None] = await self.store.owned(group_id, change)
        return result

    # -- sessions -----------------------------------------------------------------------------

    async def _expire(self, group_id: str, *, take: bool = True) -> None:
        """``take=False`` from the sweep: only as the partition's owner already."""

        async def change(p: int) -> None:
            group = self.group(group_id)
            after = None if group is None else group.expire(now_ms())
            if after is not None:
                await self._write(p, group_id, after)

        await self.store.owned(group_id, change, take=take)

    async def sweep(self, partition: int) -> None:
        """Members past their session removed (a rebalance follows), rounds past their
        deadline completed: on a store partition this sidecar owns (NOT_COORDINATOR
        once it moved: the sweep never takes a partition)."""
        now = now_ms()
        for group_id in self.store.groups_in(partition):
            group = self.group(group_id)
            if group is not None and group.expire(now) is not None:
                await self._expire(group_id, take=False)

    # -- offsets ------------------------------------------------------------------------------

    async def commit(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        offsets: Sequence[StagedOffset],
    ) -> None:
        """OffsetCommit to a Kafka group: Kafka's checks (:meth:`ClassicGroup.validate_commit`),
        the member's session refreshed, the offsets stored, in one change."""
        validate_topics(o.topic for o in offsets)
        now = now_ms()

        async def change(p: int) -> None:
            group = self.group(group_id)
            if group is not None:
                simple = static.validate_commit(group, member_id, instance_id, generation)
                refreshed = None if simple else group.seen(member_id, now)
                if refreshed is not None:
                    await self._write(p, group_id, refreshed)
            for o in offsets:
                await self.store.write(
                    p, key("o", group_id, o.topic, o.partition), offset_doc(o, now)
                )

        await self.store.owned(group_id, change)

    async def reset_offsets(
        self, p: int, group_id: str, targets: Sequence[ResolvedReset]
    ) -> ClassicGroup | None:
        """A server-side reset of a Kafka group, inside a change of ``p``: the group
        fenced (:meth:`ClassicGroup.fenced`: a rebalance, and 22 for the generation it
        interrupts), then the ``targets`` stored as its committed offsets, which its members
        fetch when they rejoin. The fence is written first: a reset that fails halfway
        has at worst rebalanced the group. None when ``group_id`` is not a Kafka group
        (nothing is written)."""
        group = self.group(group_id)
        if group is None:
            return None
        now = now_ms()
        fenced = group.fenced(now)
        if fenced is not group:
            await self._write(p, group_id, fenced)
        for t in targets:
            staged = StagedOffset(t.topic, t.partition, t.offset, "", t.position)
            await self.store.write(
                p, key("o", group_id, t.topic, t.partition), offset_doc(staged, now)
            )
        return fenced


def _same_protocol(group: ClassicGroup, protocol_type: str | None, protocol: str | None) -> None:
    if protocol_type is not None and protocol_type != group.protocol_type:
        raise errors.InconsistentGroupProtocol(
            f"protocol type {protocol_type!r} is not the group's"
        )
    if protocol is not None and protocol != group.protocol:
        raise errors.InconsistentGroupProtocol(f"protocol {protocol!r} is not the group's")
