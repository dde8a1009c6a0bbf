"""A consumer group of the consumer protocol (KIP-848: ConsumerGroupHeartbeat,
server-side assignment) as typed, immutable data and its transitions, after Kafka's
``ConsumerGroup``, ``ConsumerGroupMember`` and ``CurrentAssignmentBuilder``: no I/O, no
clock (``now_ms`` is passed).

The group store keeps it under ``["c", group]`` (:meth:`ConsumerGroup.to_doc`), apart
from the classic groups' ``["k", group]`` and the HTTP groups' ``["g", group]``.

Epochs, as Kafka's: the **group epoch** goes up whenever the membership or a subscription
changes (or a subscribed topic gets partitions); the **target assignment** is computed
by the group's assignor at that epoch (the assignment epoch); each member moves towards
its target at its own pace (:func:`reconcile`):

- a partition the member holds but its target does not is **revoked** first: the member
  keeps its epoch (state ``unrevoked_partitions``) and gets its assignment without it;
  it moves on only when a heartbeat lists its owned partitions without it;
- a partition of its target that another member still holds (assigned, or being
  revoked) is **unreleased**: the member moves to the target epoch without it (state
  ``unreleased_partitions``) and gets it at a later heartbeat, once it is free;
- else the member is ``stable`` at the target epoch with all of its target.

So a partition never has two owners: it is given to a new member only once the previous
owner's heartbeat no longer lists it (or the owner left or was fenced).

>>> g = ConsumerGroup.new()
>>> g, m = g.heartbeat(Beat("a", 0, topics=("t",), session_timeout_ms=45000), {"t": 2}, 0)
>>> m.epoch, sorted(m.assigned), g.state
(1, [('t', 0), ('t', 1)], 'Stable')
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kop_dedup import errors
from kop_dedup.protocol.groups.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    Assignment,
    TopicPartition,
)
from kop_dedup.protocol.groups.consumer_member import (
    MEMBER_STABLE,
    UNRELEASED,
    UNREVOKED,
    Beat,
    ConsumerMember,
    check_epoch,
    doc_tps,
    reconcile,
    tps,
    updated,
)
from kop_dedup.protocol.groups.consumer_static import (
    LEAVE_STATIC,
    away,
    check_request,
    holder,
    take_over,
)

__all__ = [
    "LEAVE_EPOCHS",
    "MEMBER_STABLE",
    "UNRELEASED",
    "UNREVOKED",
    "Beat",
    "ConsumerGroup",
    "ConsumerMember",
    "reconcile",
]

LEAVE_EPOCHS = (-1, LEAVE_STATIC)
"""A heartbeat at epoch -1 leaves the group; -2 is a static member's temporary leave
(:mod:`~kop_dedup.protocol.groups.consumer_static`: kept at -2 until its session ends)."""

EMPTY, ASSIGNING, RECONCILING, STABLE = "Empty", "Assigning", "Reconciling", "Stable"


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = DEFAULT_ASSIGNOR
    members: Mapping[str, ConsumerMember] = field(default_factory=dict)
    target: Mapping[str, Assignment] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)
    """The partition counts of the subscribed topics the target was computed on."""
    resolved: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Each member's SubscribedTopicRegex -> the topics it resolved to (Kafka's
    ``ResolvedRegularExpression``), as of ``resolved_ms``."""
    resolved_ms: int = 0

    @classmethod
    def new(cls) -> ConsumerGroup:
        return cls()

    # -- reading ------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.assignment_epoch != self.epoch:
            return ASSIGNING
        settled = all(
            m.state == MEMBER_STABLE and m.epoch == self.assignment_epoch
            for m in self.members.values()
        )
        return STABLE if settled else RECONCILING

    def topics_of(self, member: ConsumerMember) -> frozenset[str]:
        """What ``member`` subscribes to: its topic names and what its regex resolved to."""
        matched = self.resolved.get(member.regex, frozenset()) if member.regex else frozenset()
        return frozenset(member.topics) | matched

    def subscribed_topics(self, extra: Iterable[str] = ()) -> set[str]:
        return {t for m in self.members.values() for t in self.topics_of(m)} | set(extra)

    def regexes(self) -> set[str]:
        """The members' SubscribedTopicRegex."""
        return {m.regex for m in self.members.values() if m.regex}

    def held_by_others(self, member_id: str) -> Callable[[TopicPartition], bool]:
        held = {
            tp
            for m in self.members.values()
            if m.member_id != member_id
            for tp in m.assigned | m.revoking
        }
        return held.__contains__

    # -- transitions --------------------------------------------------------------------

    def heartbeat(
        self,
        beat: Beat,
        counts: Mapping[str, int],
        now_ms: int,
        *,
        max_members: int = 1_000,
        resolved: Mapping[str, frozenset[str]] | None = None,
    ) -> tuple[ConsumerGroup, ConsumerMember]:
        """The group after ``beat`` and the member as answered (epoch -1: it left).
        ``counts``: the partition counts of every topic a member subscribes to after
        the beat (a topic that does not exist: absent); ``resolved``: the members'
        regular expressions resolved again (None: not). Raises 25, 42, 81, 82, 110, 111,
        112; a static member's rules: :mod:`~kop_dedup.protocol.groups.consumer_static`."""
        check_request(beat)
        if beat.assignor is not None and beat.assignor not in ASSIGNORS:
            raise errors.UnsupportedAssignor(
                f"assignor {beat.assignor!r} is not served: one of {sorted(ASSIGNORS)}"
            )
        if beat.member_epoch in LEAVE_EPOCHS:
            return self._leave(beat, counts)
        current, replaced = self._beating(beat, max_members)
        base = self._replaced(replaced, current.member_id) if replaced else self
        joined = current.member_id not in self.members and replaced is None
        member = updated(current, beat, now_ms)
        group = replace(base, members={**base.members, member.member_id: member})
        if resolved is not None:
            group = replace(group, resolved={**group.resolved, **resolved}, resolved_ms=now_ms)
        changed = (member.topics, member.regex, member.assignor) != (
            current.topics,
            current.regex,
            current.assignor,
        ) or any(group.topics_of(m) != self.topics_of(m) for m in self.members.values())
        if joined or changed or group.stale_counts(counts):
            group = group.assigned(counts, bump=True)
        member = reconcile(
            member,
            group.assignment_epoch,
            group.target.get(member.member_id, frozenset()),
            beat.owned if beat.member_epoch != 0 else beat.owned or frozenset(),
            group.held_by_others(member.member_id),
            now_ms,
            group.topics_of(member),
        )
        return replace(group, members={**group.members, member.member_id: member}), member

    def _leave(self, beat: Beat, counts: Mapping[str, int]) -> tuple[ConsumerGroup, ConsumerMember]:
        """A leave: at -1 the member is removed (a new epoch); a static member's at -2
        keeps it at -2 with its assignment (:func:`away`). Raises 25, 82."""
        if beat.instance_id is not None:
            current: ConsumerMember | None = holder(self.members, beat)
        else:
            current = self.members.get(beat.member_id)
        if current is None:
            raise errors.UnknownMemberId(f"member {beat.member_id!r} is not in the group")
        if beat.member_epoch == LEAVE_STATIC:
            left = away(current)
            return replace(self, members={**self.members, left.member_id: left}), left
        return self.without([current.member_id], counts), replace(current, epoch=-1)

    def _beating(self, beat: Beat, max_members: int) -> tuple[ConsumerMember, str | None]:
        """The member a heartbeat (not a leave) is of: a new one joining (epoch 0), one
        taking a static member's place (and the member id it replaces), else the one at
        a valid epoch. Raises 25, 42, 81, 82, 110, 111."""
        current = self.members.get(beat.member_id)
        if beat.member_epoch == 0:
            if beat.topics is None and not beat.regex and current is None:
                raise errors.InvalidRequest(
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
                )
            taking = take_over(self.members, beat) if beat.instance_id is not None else None
            if current is None and len(self.members) >= max_members:
                raise errors.GroupMaxSizeReached(
                    f"the group has {len(self.members)} members, the most it may have"
                )
            return taking or (current or ConsumerMember(beat.member_id, 0), None)
        if beat.instance_id is not None:
            current = holder(self.members, beat)
        elif current is None:
            raise errors.UnknownMemberId(f"member {beat.member_id!r} is not in the group")
        check_epoch(current, beat)
        return current, None

    def _replaced(self, old_id: str, new_id: str) -> ConsumerGroup:
        """The group with static member ``old_id`` gone and its target moved to ``new_id``
        (Kafka's ``replaceMember``): no new epoch."""
        target = {k: a for k, a in self.target.items() if k != old_id}
        target[new_id] = self.target.get(old_id, frozenset())
        members = {k: m for k, m in self.members.items() if k != old_id}
        return replace(self, members=members, target=target)

    def stale_counts(self, counts: Mapping[str, int]) -> bool:
        topics = self.subscribed_topics()
        return {t: counts.get(t, 0) for t in topics} != {t: self.counts.get(t, 0) for t in topics}

    def assigned(self, counts: Mapping[str, int], *, bump: bool) -> ConsumerGroup:
        """A new target assignment (the group epoch bumped when ``bump``)."""
        epoch = self.epoch + 1 if bump else self.epoch
        prefs = Counter(m.assignor for m in self.members.values() if m.assignor)
        name = min(prefs, key=lambda n: (-prefs[n], n)) if prefs else DEFAULT_ASSIGNOR
        topics = self.subscribed_topics()
        kept = {t: counts[t] for t in topics if t in counts}
        subs = {m.member_id: tuple(sorted(self.topics_of(m))) for m in self.members.values()}
        statics = {m.member_id: m.instance_id for m in self.members.values() if m.instance_id}
        target = ASSIGNORS[name](subs, kept, self.target, statics)
        regexes = self.regexes()
        return replace(
            self,
            epoch=epoch,
            assignment_epoch=epoch,
            assignor=name,
            target=target,
            counts=kept,
            resolved={r: ts for r, ts in self.resolved.items() if r in regexes},
        )

    def without(self, member_ids: Iterable[str], counts: Mapping[str, int]) -> ConsumerGroup:
        """The group without ``member_ids`` (left, expired or fenced): their partitions are
        free at once; a new epoch and target for the others."""
        gone = set(member_ids)
        members = {k: m for k, m in self.members.items() if k not in gone}
        if len(members) == len(self.members):
            return self
        group = replace(
            self, members=members, target={k: a for k, a in self.target.items() if k not in gone}
        )
        return group.assigned(counts, bump=True)

    def expired(self, now_ms: int) -> list[str]:
        return [k for k, m in self.members.items() if m.expired(now_ms)]

    def validate_commit(self, member_id: str, epoch: int) -> None:
        """An OffsetCommit to this group (Kafka's ``ConsumerGroup.validateOffsetCommit``):
        an admin commit (epoch < 0) only while it is empty; else the member must be in it
        (25) at its epoch: any other is STALE_MEMBER_EPOCH (113), above it too, as Kafka
        4.1 answers (its heartbeat answers 110 there)."""
        if epoch < 0 and not self.members:
            return
        member = self.members.get(member_id)
        if member is None:
            raise errors.UnknownMemberId(f"member {member_id!r} is not in the group")
        if epoch != member.epoch:
            raise errors.StaleMemberEpoch(
                f"member epoch {epoch} is not the member's ({member.epoch})"
            )

    # -- storage ------------------------------------------------------------------------

    def to_doc(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "aepoch": self.assignment_epoch,
            "assignor": self.assignor,
            "members": [m.to_doc() for m in self.members.values()],
            "target": {k: doc_tps(a) for k, a in self.target.items()},
            "counts": dict(self.counts),
            "resolved": {r: sorted(ts) for r, ts in self.resolved.items()},
            "resolved_ms": self.resolved_ms,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> ConsumerGroup | None:
        if doc is None:
            return None
        members = [ConsumerMember.from_doc(d) for d in doc["members"]]
        return cls(
            int(doc["epoch"]),
            int(doc["aepoch"]),
            str(doc["assignor"]),
            {m.member_id: m for m in members},
            {k: tps(v) for k, v in doc["target"].items()},
            {str(k): int(v) for k, v in doc["counts"].items()},
            {str(r): frozenset(ts) for r, ts in doc.get("resolved", {}).items()},
            int(doc.get("resolved_ms", 0)),
        )
