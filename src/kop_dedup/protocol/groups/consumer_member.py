"""A member of a consumer group of the consumer protocol (KIP-848) and a heartbeat as the
group sees it, as typed, immutable data, and the member-level rules after Kafka's
``ConsumerGroupMember``, ``CurrentAssignmentBuilder`` and ``GroupMetadataManager``: the
next state towards a target (:func:`reconcile`), what a heartbeat changes
(:func:`updated`), the epoch check (:func:`check_epoch`). The group
(:class:`~kop_dedup.protocol.groups.consumer.ConsumerGroup`) applies them; no I/O, no
clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kop_dedup import errors
from kop_dedup.protocol.groups.assignors import Assignment, TopicPartition

__all__ = [
    "MEMBER_STABLE",
    "UNRELEASED",
    "UNREVOKED",
    "Beat",
    "ConsumerMember",
    "check_epoch",
    "doc_tps",
    "reconcile",
    "tps",
    "updated",
]

MEMBER_STABLE = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"


def tps(items: Iterable[Any]) -> Assignment:
    return frozenset((str(t), int(p)) for t, p in items)


def doc_tps(a: Assignment) -> list[list[Any]]:
    return [[t, p] for t, p in sorted(a)]


@dataclass(frozen=True, slots=True)
class Beat:
    """A ConsumerGroupHeartbeat as the group sees it (None: unchanged since the last)."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topics: tuple[str, ...] | None = None
    regex: str | None = None
    """SubscribedTopicRegex (v1+): None unchanged, "" none."""
    assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    session_timeout_ms: int = 45_000


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    member_id: str
    epoch: int
    previous_epoch: int = -1
    state: str = MEMBER_STABLE
    assigned: Assignment = frozenset()
    revoking: Assignment = frozenset()
    topics: tuple[str, ...] = ()
    assignor: str | None = None
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    session_timeout_ms: int = 45_000
    last_seen_ms: int = 0
    revoke_by_ms: int = 0
    """While ``unrevoked_partitions``: the member is fenced if it has not revoked by then
    (its rebalance timeout, Kafka's revocation timer)."""
    regex: str | None = None
    """Its SubscribedTopicRegex (None: none); the group resolves it
    (:attr:`ConsumerGroup.resolved`)."""

    def with_epoch(self, epoch: int) -> ConsumerMember:
        if epoch == self.epoch:
            return self
        return replace(self, epoch=epoch, previous_epoch=self.epoch)

    def expired(self, now_ms: int) -> bool:
        """Past its session, or past its revocation deadline."""
        late = self.state == UNREVOKED and self.revoke_by_ms and now_ms > self.revoke_by_ms
        return now_ms - self.last_seen_ms > self.session_timeout_ms or bool(late)

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.member_id,
            "epoch": self.epoch,
            "prev": self.previous_epoch,
            "state": self.state,
            "assigned": doc_tps(self.assigned),
            "revoking": doc_tps(self.revoking),
            "topics": list(self.topics),
            "assignor": self.assignor,
            "inst": self.instance_id,
            "rack": self.rack_id,
            "client": self.client_id,
            "host": self.client_host,
            "rebalance": self.rebalance_timeout_ms,
            "session": self.session_timeout_ms,
            "seen": self.last_seen_ms,
            "revoke_by": self.revoke_by_ms,
            "regex": self.regex,
        }

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> ConsumerMember:
        return cls(
            str(d["id"]),
            int(d["epoch"]),
            int(d["prev"]),
            str(d["state"]),
            tps(d["assigned"]),
            tps(d["revoking"]),
            tuple(d["topics"]),
            d.get("assignor"),
            d.get("inst"),
            d.get("rack"),
            str(d.get("client", "")),
            str(d.get("host", "")),
            int(d["rebalance"]),
            int(d["session"]),
            int(d["seen"]),
            int(d.get("revoke_by", 0)),
            d.get("regex"),
        )


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: Assignment,
    owned: Assignment | None,
    held_elsewhere: Callable[[TopicPartition], bool],
    now_ms: int,
    topics: Iterable[str] | None = None,
) -> ConsumerMember:
    """The member's next state towards ``target`` (Kafka's ``CurrentAssignmentBuilder``).

    ``owned``: the partitions the member's heartbeat lists (None: not listed, so it may
    still hold any it held); ``held_elsewhere``: whether another member holds a partition
    (assigned or being revoked); ``topics``: what it subscribes to (default: its topic
    names)."""

    def still_owns(revoking: Assignment) -> bool:
        return owned is None or bool(owned & revoking)

    if member.state == MEMBER_STABLE and member.epoch == target_epoch:
        return member
    if member.state == UNREVOKED and still_owns(member.revoking):
        return member
    subscribed = set(member.topics if topics is None else topics)
    aim = frozenset(tp for tp in target if tp[0] in subscribed)
    kept = member.assigned & aim
    revoking = member.assigned - kept
    pending = aim - kept
    unreleased = frozenset(tp for tp in pending if held_elsewhere(tp))
    if revoking and still_owns(revoking):
        deadline = member.revoke_by_ms
        if member.state != UNREVOKED or revoking != member.revoking:
            deadline = now_ms + member.rebalance_timeout_ms
        return replace(
            member, state=UNREVOKED, assigned=kept, revoking=revoking, revoke_by_ms=deadline
        )
    state = UNRELEASED if unreleased else MEMBER_STABLE
    return replace(
        member.with_epoch(target_epoch),
        state=state,
        assigned=kept | (pending - unreleased),
        revoking=frozenset(),
        revoke_by_ms=0,
    )


def updated(current: ConsumerMember, beat: Beat, now_ms: int) -> ConsumerMember:
    """The member with what ``beat`` changed (None fields: unchanged)."""
    return replace(
        current,
        topics=tuple(sorted(set(beat.topics))) if beat.topics is not None else current.topics,
        regex=(beat.regex or None) if beat.regex is not None else current.regex,
        assignor=beat.assignor if beat.assignor is not None else current.assignor,
        instance_id=beat.instance_id or current.instance_id,
        rack_id=beat.rack_id or current.rack_id,
        client_id=beat.client_id or current.client_id,
        client_host=beat.client_host or current.client_host,
        rebalance_timeout_ms=(
            beat.rebalance_timeout_ms
            if beat.rebalance_timeout_ms > 0
            else current.rebalance_timeout_ms
        ),
        session_timeout_ms=beat.session_timeout_ms,
        last_seen_ms=now_ms,
    )


_FENCED = (
    "The consumer group member has a {} member epoch ({}) than the one known by the group "
    "coordinator ({}). The member must abandon all its partitions and rejoin."
)
"""Kafka 4.1's words for FENCED_MEMBER_EPOCH."""


def check_epoch(member: ConsumerMember, beat: Beat) -> None:
    """Kafka's ``throwIfMemberEpochIsInvalid``: an epoch above the member's is fenced; one
    below only when it is the previous epoch and the member owns no more than its
    assignment (the answer that bumped it was lost)."""
    if beat.member_epoch > member.epoch:
        raise errors.FencedMemberEpoch(_FENCED.format("greater", beat.member_epoch, member.epoch))
    if beat.member_epoch < member.epoch and (
        beat.member_epoch != member.previous_epoch
        or beat.owned is None
        or not beat.owned <= member.assigned
    ):
        raise errors.FencedMemberEpoch(_FENCED.format("smaller", beat.member_epoch, member.epoch))
