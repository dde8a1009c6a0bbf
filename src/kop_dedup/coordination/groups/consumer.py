"""The coordinator of consumer groups of the consumer protocol (KIP-848:
ConsumerGroupHeartbeat, ConsumerGroupDescribe, the commits of their members): Kafka's
``GroupMetadataManager`` for server-side assignment, with the group's state
(:class:`~kop_dedup.protocol.groups.consumer.ConsumerGroup`) in the group store under
``["c", group]``, so any sidecar serves any member.

Every change runs as the owner of the group's store partition (:meth:`GroupStore.owned
<kop_dedup.coordination.groups.store.GroupStore.owned>`); the owner's sweep removes the
members past their session or their revocation deadline (a new epoch and target for
the others).

One group id, one protocol, as Kafka with ``group.consumer.migration.policy=disabled``:

- a heartbeat for a classic group with members, or for an HTTP group, is
  GROUP_ID_NOT_FOUND (69, "not a consumer group"); a classic group without members
  (its commits only) becomes a consumer group, its committed offsets kept;
- a JoinGroup for a consumer group with members is INCONSISTENT_GROUP_PROTOCOL (23)
  (:func:`refuse_classic`); one without members becomes a classic group again.

A member's SubscribedTopicRegex (:mod:`kop_dedup.protocol.groups.regex`) is resolved
over the data namespace's topics when it is new to the group, and again on a heartbeat
once :data:`~kop_dedup.protocol.groups.regex.REFRESH_MIN_INTERVAL_MS` passed since the
last resolution (a topic created meanwhile joins the subscription: a new epoch and
target), keeping only the topics the heartbeat's ``visible`` allows (the role's).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.api import ResolvedReset
from kop_dedup.coordination.groups.offsets import offset_doc
from kop_dedup.coordination.groups.settings import GroupSettings
from kop_dedup.coordination.groups.store import GroupStore, StagedOffset, key
from kop_dedup.coordination.names import validate_group_id, validate_topics
from kop_dedup.protocol.groups.consumer import (
    LEAVE_EPOCHS,
    Beat,
    ConsumerGroup,
    ConsumerMember,
)
from kop_dedup.protocol.groups.consumer_static import LEAVE_STATIC
from kop_dedup.protocol.groups.regex import (
    REFRESH_MIN_INTERVAL_MS,
    compile_regex,
    resolve,
    visible_only,
)
from kop_dedup.pulsar.naming import validate_topic

__all__ = ["ConsumerGroups", "consumer_state", "refuse_classic"]

_REFRESH_PART = 3
"""A heartbeat that changes nothing but the member's last-seen time is stored only once
this part of its session has passed since the last stored one (a write per heartbeat
would cost a Pulsar write every few seconds per member)."""


class Topics(Protocol):
    async def topics(self) -> list[str]: ...


Visible = Callable[[list[str]], Awaitable[list[str]]]
"""Of the topics a regex matched, those the heartbeating member may describe."""


def _group(store: GroupStore, group_id: str) -> ConsumerGroup | None:
    return ConsumerGroup.from_doc(store.doc(group_id, "c"))


def refuse_classic(store: GroupStore, group_id: str) -> None:
    """INCONSISTENT_GROUP_PROTOCOL (23) for a classic member joining a consumer group
    that has members (called by the classic coordinator inside its change)."""
    group = _group(store, group_id)
    if group is not None and group.members:
        raise errors.InconsistentGroupProtocol(
            f"group {group_id!r} is a consumer group (group.protocol=consumer) with members: "
            "a classic member cannot join it"
        )


def consumer_state(groups: ConsumerGroups, group_id: str) -> tuple[str, str, str]:
    """(state, protocol type, group type) of a consumer group as ListGroups answers it."""
    group = groups.group(group_id) or ConsumerGroup.new()
    return group.state, "consumer", "consumer"


class ConsumerGroups:
    def __init__(
        self,
        store: GroupStore,
        settings: GroupSettings,
        partitions_of: Callable[[str], Awaitable[int]],
        topics: Topics,
    ) -> None:
        self.store = store
        self.max_members = settings.max_members
        self._partitions_of = partitions_of
        self._topics = topics
        """What lists the data namespace's topics (the admin client), for regexes."""
        self._seen: dict[tuple[str, str], int] = {}
        """(group, member) -> the last heartbeat this sidecar answered as the owner, newer
        than the stored one (which is written only every part of a session): the sweep
        removes a member one session after its last heartbeat, not earlier."""

    # -- reading --------------------------------------------------------------------------

    def group(self, group_id: str) -> ConsumerGroup | None:
        """The group as this sidecar has read it (None: not a consumer group)."""
        return _group(self.store, group_id)

    def serves(self, group_id: str) -> bool:
        """A consumer group with members, or one no classic group shadows."""
        group = self.group(group_id)
        if group is None:
            return False
        return bool(group.members) or self.store.doc(group_id, "k") is None

    def live(self, group_id: str) -> bool:
        """A consumer group with members (retention keeps it, deletion refuses it)."""
        group = self.group(group_id)
        return group is not None and bool(group.members)

    def subscribed(self, group_id: str) -> set[str]:
        """The topics its members subscribe to (OffsetDelete keeps their offsets: 86)."""
        group = self.group(group_id)
        return set() if group is None else group.subscribed_topics()

    def check_delete(self, group_id: str) -> None:
        """DeleteGroups (and a reset): NON_EMPTY_GROUP (68) while it has members."""
        if self.live(group_id):
            raise errors.NonEmptyGroup(
                f"consumer group {group_id!r} has members (group.protocol=consumer): stop "
                "them first"
            )

    async def read(self, group_id: str) -> ConsumerGroup | None:
        await self.store.read(group_id)
        return self.group(group_id) if self.serves(group_id) else None

    async def _counts(self, topics: Iterable[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic in sorted(set(topics)):
            try:
                count = await self._partitions_of(topic)
            except errors.KafkaError:  # no such topic (yet): nothing of it to assign
                continue
            if count > 0:
                out[topic] = count
        return out

    def _other_kinds(self, group_id: str) -> bool:
        """GROUP_ID_NOT_FOUND for an HTTP group or a classic group with members; True
        when an empty classic group is to be replaced."""
        if self.store.doc(group_id, "g") is not None:
            raise errors.GroupIdNotFound(
                f"group {group_id!r} is an HTTP consumer group, not a consumer group"
            )
        classic = self.store.doc(group_id, "k")
        if classic is None:
            return False
        if classic.get("members"):
            raise errors.GroupIdNotFound(
                f"group {group_id!r} is a classic group with members, not a consumer group "
                "(its members use group.protocol=classic)"
            )
        return True

    # -- ConsumerGroupHeartbeat -----------------------------------------------------------

    async def heartbeat(
        self, group_id: str, beat: Beat, visible: Visible | None = None
    ) -> tuple[ConsumerMember | None, ConsumerMember]:
        """One heartbeat: the member before it (None: new to the group, a static
        member's new incarnation too) and as answered. Raises 25, 42,
        69, 81, 110, 112 (see :meth:`ConsumerGroup.heartbeat`), 128 for a regex that
        does not compile."""
        validate_group_id(group_id)
        if not beat.member_id:
            if beat.member_epoch != 0:
                raise errors.UnknownMemberId("a member id is needed past the join")
            beat = replace(beat, member_id=str(uuid.uuid4()))
        if beat.topics is not None:
            validate_topics(beat.topics)
        if beat.regex:
            compile_regex(beat.regex)
        # the partition counts (and the regexes' topics) are looked up outside the change
        # (admin calls, cached): for the topics of the view as it is; a topic subscribed
        # meanwhile keeps the count the group computed its target with
        known = self.group(group_id) or ConsumerGroup.new()
        started = now_ms()
        resolved = await self._resolve(known, beat, visible)
        matched = {t for ts in (resolved or {}).values() for t in ts}
        counts = await self._counts(known.subscribed_topics({*(beat.topics or ()), *matched}))

        async def change(p: int) -> tuple[ConsumerMember | None, ConsumerMember]:
            replace_classic = self._other_kinds(group_id)
            before = self.group(group_id) or ConsumerGroup.new()
            if replace_classic and before.members:
                replace_classic = False
            now = now_ms()
            # a resolution another heartbeat stored since this one listed is newer
            fresh = resolved if before.resolved_ms <= started else None
            if beat.member_epoch == LEAVE_STATIC:
                before = self._last_seen(group_id, before, beat.member_id)
            after, member = before.heartbeat(
                beat,
                {**before.counts, **counts},
                now,
                max_members=self.max_members,
                resolved=fresh,
            )
            self._note_seen(group_id, before, after, member, now)
            if replace_classic:
                await self.store.remove(p, key("k", group_id))
            if _worth_storing(before, after, member, now):
                await self.store.write(p, key("c", group_id), after.to_doc())
            return before.members.get(member.member_id), member

        result: tuple[ConsumerMember | None, ConsumerMember] = await self.store.owned(
            group_id, change
        )
        return result

    def _note_seen(
        self,
        group_id: str,
        before: ConsumerGroup,
        after: ConsumerGroup,
        member: ConsumerMember,
        now: int,
    ) -> None:
        for gone in before.members.keys() - after.members.keys():
            self._seen.pop((group_id, gone), None)  # left, or a static member replaced
        if member.epoch not in LEAVE_EPOCHS:
            self._seen[(group_id, member.member_id)] = now

    def _last_seen(self, group_id: str, group: ConsumerGroup, member_id: str) -> ConsumerGroup:
        """The group with ``member_id``'s last heartbeat answered here stored: a static
        member left at -2 stays for a session from it (Kafka's session timer, which the
        leave does not restart), whichever sidecar owns the group then."""
        member = group.members.get(member_id)
        seen = self._seen.get((group_id, member_id), 0)
        if member is None or seen <= member.last_seen_ms:
            return group
        return replace(
            group, members={**group.members, member_id: replace(member, last_seen_ms=seen)}
        )

    async def _resolve(
        self, known: ConsumerGroup, beat: Beat, visible: Visible | None
    ) -> dict[str, frozenset[str]] | None:
        """The group's regexes resolved again when one is new to it or the last
        resolution is older than REFRESH_MIN_INTERVAL_MS; None: not due."""
        regexes = known.regexes() | ({beat.regex} if beat.regex else set())
        if not regexes or beat.member_epoch in LEAVE_EPOCHS:
            return None
        new = bool(beat.regex) and beat.regex not in known.resolved
        if not new and now_ms() - known.resolved_ms < REFRESH_MIN_INTERVAL_MS:
            return None
        names = []
        for name in await self._topics.topics():
            try:
                validate_topic(name)
            except errors.InvalidTopic:
                continue  # a Pulsar topic Kafka cannot name: not a Kafka topic
            names.append(name)
        got = resolve(regexes, names)
        if visible is not None:
            got = visible_only(got, await visible(sorted({t for ts in got.values() for t in ts})))
        return got

    # -- sessions -------------------------------------------------------------------------

    async def sweep(self, partition: int) -> None:
        """Members past their session or revocation deadline removed, on a store
        partition this sidecar owns (NOT_COORDINATOR once it moved: the sweep never takes
        a partition)."""
        now = now_ms()
        for group_id in self.store.groups_in(partition):
            group = self.group(group_id)
            if group is None or not self._gone(group_id, group, now):
                continue

            async def change(p: int, group_id: str = group_id) -> None:
                current = self.group(group_id)
                gone = [] if current is None else self._gone(group_id, current, now_ms())
                if current is not None and gone:
                    after = current.without(gone, current.counts)
                    await self.store.write(p, key("c", group_id), after.to_doc())
                    for m in gone:
                        self._seen.pop((group_id, m), None)

            await self.store.owned(group_id, change, take=False)

    def _gone(self, group_id: str, group: ConsumerGroup, now: int) -> list[str]:
        """Members past their session (from their last heartbeat, stored or answered
        here) or their revocation deadline."""
        out = []
        for k, m in group.members.items():
            seen = max(m.last_seen_ms, self._seen.get((group_id, k), 0))
            if replace(m, last_seen_ms=seen).expired(now):
                out.append(k)
        return out

    # -- offsets --------------------------------------------------------------------------

    async def reset_offsets(self, p: int, group_id: str, targets: Sequence[ResolvedReset]) -> bool:
        """A server-side reset of a consumer group, inside a change of ``p``: refused
        while it has members (NON_EMPTY_GROUP 68: they would commit over it; Kafka resets
        only inactive groups), else ``targets`` stored as its committed offsets, which its
        next members fetch. False when ``group_id`` is not a consumer group."""
        if not self.serves(group_id):
            return False
        self.check_delete(group_id)  # the same rule: no member
        now = now_ms()
        for t in targets:
            staged = StagedOffset(t.topic, t.partition, t.offset, "", t.position)
            await self.store.write(
                p, key("o", group_id, t.topic, t.partition), offset_doc(staged, now)
            )
        return True

    async def commit(
        self, group_id: str, member_id: str, epoch: int, offsets: Sequence[StagedOffset]
    ) -> None:
        """OffsetCommit to a consumer group: Kafka's checks
        (:meth:`ConsumerGroup.validate_commit`: 25, 110, 113) and the offsets stored, in
        one change."""
        validate_topics(o.topic for o in offsets)
        now = now_ms()

        async def change(p: int) -> None:
            group = self.group(group_id)
            if group is not None:
                group.validate_commit(member_id, epoch)
            for o in offsets:
                await self.store.write(
                    p, key("o", group_id, o.topic, o.partition), offset_doc(o, now)
                )

        await self.store.owned(group_id, change)


def _worth_storing(
    before: ConsumerGroup, after: ConsumerGroup, member: ConsumerMember, now: int
) -> bool:
    """Whether the change must be stored: anything but the member's last-seen time
    changed, or that time is older than a part of its session."""
    old = before.members.get(member.member_id)
    if old is None or member.epoch in LEAVE_EPOCHS:
        return True
    if replace(member, last_seen_ms=old.last_seen_ms) != old:
        return True
    if replace(after, members=before.members) != before:
        return True
    return now - old.last_seen_ms > member.session_timeout_ms // _REFRESH_PART
