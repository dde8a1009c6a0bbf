"""A consumer group's state as typed, immutable data, and its membership transitions
(Kafka's ``GroupMetadata``): no I/O, no clock (``now_ms`` is passed in).

What the group store keeps per group, each read with ``from_doc`` and written with
``to_doc`` (the stored JSON; ``v`` is the store's version of the doc):

* :class:`Group` (``["g", group]``): configuration, generation, members, assignment,
  the partition counts of the members' topics, and when membership or configuration
  last changed (the retention clock of a group without members).
* :class:`Delivery` (``["d", group, member, topic, partition]``, member "" in
  clustering mode): where the member's next pull starts, the reset epoch it applied,
  the inflight ages, and the token of the pull that recorded it.
* :class:`Committed` (``["o", group, topic, partition]`` for the group,
  ``["b", group, member, topic, partition]`` for a broadcast member).

Membership: :meth:`Group.join`, :meth:`Group.leave` and :meth:`Group.expire` return the
new group and the deliveries to send back (partitions that moved, and everything of
the members that rejoined, left or expired): those go back to their committed offsets.

>>> g = Group.new(GroupConfig(Mode.CLUSTERING))
>>> g, back = g.join("a", ("t",), {"t": 2}, now_ms=0)
>>> g.generation, g.assigned("a"), back
(1, (('t', 0), ('t', 1)), [])
>>> g, back = g.join("b", ("t",), {"t": 2}, now_ms=1)
>>> g.assigned("b"), back
((('t', 1),), [('a', ('t', 1))])
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kop_dedup import errors

__all__ = [
    "AutoReset",
    "Committed",
    "Delivery",
    "Doc",
    "Group",
    "GroupConfig",
    "InflightEntry",
    "Member",
    "Mode",
    "StaleMember",
    "TopicPartition",
    "assign",
    "expired",
]

TopicPartition = tuple[str, int]
Doc = dict[str, Any]
InflightEntry = tuple[int, int]
"""(first offset of a pull, when it was answered in epoch ms)."""


class Mode(enum.Enum):
    CLUSTERING = "clustering"
    BROADCAST = "broadcast"


class AutoReset(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"


class StaleMember(errors.KafkaError):
    """A commit or call from a member the group moved on from (HTTP 409); ``error`` is
    Kafka's code for it (22 ILLEGAL_GENERATION or 25 UNKNOWN_MEMBER_ID)."""

    def __init__(self, error: errors.KafkaError) -> None:
        super().__init__(error.message)
        self.error = error

    @classmethod
    def unknown(cls, group: str, member: str) -> StaleMember:
        return cls(
            errors.UnknownMemberId(
                f"member {member!r} is not in group {group!r} (its session expired, or it "
                "left): join again"
            )
        )

    @classmethod
    def generation(cls, group: str, generation: int, current: int) -> StaleMember:
        if generation > current:
            return cls(
                errors.IllegalGeneration(
                    f"generation {generation} is ahead of group {group!r}'s generation "
                    f"{current}: it was never handed out; send the generation a join, "
                    "heartbeat or pull answered"
                )
            )
        return cls(
            errors.IllegalGeneration(
                f"generation {generation} is stale: group {group!r} is at generation "
                f"{current}; heartbeat or pull for the new assignment"
            )
        )


@dataclass(frozen=True, slots=True)
class GroupConfig:
    mode: Mode = Mode.CLUSTERING
    auto_offset_reset: AutoReset = AutoReset.LATEST
    session_timeout_ms: int = 30_000
    broadcast_expire_ms: int = 120_000


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    topics: tuple[str, ...]
    joined_ms: int
    last_seen_ms: int


def expired(member: Member, config: GroupConfig, now_ms: int) -> bool:
    """Missed its session: no heartbeat, pull or commit for ``session_timeout_ms``."""
    return now_ms - member.last_seen_ms >= config.session_timeout_ms


def assign(
    mode: Mode, members: Mapping[str, Iterable[str]], partitions: Mapping[str, int]
) -> dict[str, tuple[TopicPartition, ...]]:
    """Partitions per member. Clustering: each topic's partitions round-robin over its
    subscribers in member-id order (deterministic: every sidecar computes the same);
    broadcast: every subscriber gets every partition of its topics.

    >>> assign(Mode.CLUSTERING, {"a": ("t",), "b": ("t",)}, {"t": 3})
    {'a': (('t', 0), ('t', 2)), 'b': (('t', 1),)}
    """
    subscribers: dict[str, list[str]] = {}
    for member in sorted(members):
        for topic in dict.fromkeys(members[member]):
            subscribers.setdefault(topic, []).append(member)
    out: dict[str, list[TopicPartition]] = {m: [] for m in members}
    for topic in sorted(subscribers):
        who = subscribers[topic]
        for p in range(partitions.get(topic, 0)):
            if mode is Mode.BROADCAST:
                for member in who:
                    out[member].append((topic, p))
            else:
                out[who[p % len(who)]].append((topic, p))
    return {m: tuple(sorted(tps)) for m, tps in out.items()}


Back = list[tuple[str, TopicPartition]]
"""(member, partition): deliveries that go back to their committed offsets."""


@dataclass(frozen=True, slots=True)
class Group:
    """One group's configuration and membership (see the module docstring)."""

    config: GroupConfig
    generation: int = 0
    members: Mapping[str, Member] = field(default_factory=dict)
    assignment: Mapping[str, tuple[TopicPartition, ...]] = field(default_factory=dict)
    partitions: Mapping[str, int] = field(default_factory=dict)
    changed_ms: int | None = None
    """When membership or configuration last changed (None: stored before it was kept)."""
    version: int = 0

    @staticmethod
    def new(config: GroupConfig) -> Group:
        return Group(config)

    # -- reading ----------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self.config.mode

    def owner(self, member: str) -> str:
        """Whose deliveries a member reads: the group's ("") in clustering, its own in
        broadcast."""
        return "" if self.config.mode is Mode.CLUSTERING else member

    def assigned(self, member: str) -> tuple[TopicPartition, ...]:
        return self.assignment.get(member, ())

    def member(self, group: str, member: str) -> Member:
        """The member, or StaleMember (25) when it is not in the group."""
        found = self.members.get(member)
        if found is None:
            raise StaleMember.unknown(group, member)
        return found

    # -- transitions ------------------------------------------------------------------------

    def configure(
        self,
        group: str,
        *,
        mode: Mode | None = None,
        auto_offset_reset: AutoReset | None = None,
        session_timeout_ms: int | None = None,
        broadcast_expire_ms: int | None = None,
        now_ms: int,
    ) -> Group:
        """Create or update the configuration; the mode of a group with members is fixed."""
        if mode is not None and mode is not self.config.mode and self.members:
            raise errors.InvalidRequest(
                f"group {group!r} has members; its mode stays {self.config.mode.value} until "
                "they leave"
            )
        c = self.config
        config = GroupConfig(
            mode or c.mode,
            auto_offset_reset or c.auto_offset_reset,
            c.session_timeout_ms if session_timeout_ms is None else session_timeout_ms,
            c.broadcast_expire_ms if broadcast_expire_ms is None else broadcast_expire_ms,
        )
        return replace(self, config=config, changed_ms=now_ms)

    def join(
        self, member: str, topics: Sequence[str], counts: Mapping[str, int], *, now_ms: int
    ) -> tuple[Group, Back]:
        """(Re)join: a new generation; what the member had comes again."""
        members = {
            **self.members,
            member: Member(member, tuple(dict.fromkeys(topics)), now_ms, now_ms),
        }
        return self._rebalance(members, counts, back=(member,), now_ms=now_ms)

    def leave(self, group: str, member: str, *, now_ms: int) -> tuple[Group, Back]:
        self.member(group, member)
        members = {m: v for m, v in self.members.items() if m != member}
        return self._rebalance(members, {}, back=(member,), now_ms=now_ms)

    def expire(self, now_ms: int) -> tuple[Group, Back, list[str]] | None:
        """The members that missed their session leave (None: none did)."""
        gone = [m for m, v in self.members.items() if expired(v, self.config, now_ms)]
        if not gone:
            return None
        members = {m: v for m, v in self.members.items() if m not in gone}
        group, back = self._rebalance(members, {}, back=gone, now_ms=now_ms)
        return group, back, gone

    def seen(self, member: str, now_ms: int) -> Group | None:
        """The member's session refreshed; None when the stored time is recent enough
        (less than a quarter of a session old: not worth a write)."""
        entry = self.members[member]
        if now_ms - entry.last_seen_ms < self.config.session_timeout_ms // 4:
            return None
        return replace(self, members={**self.members, member: replace(entry, last_seen_ms=now_ms)})

    def _rebalance(
        self,
        members: Mapping[str, Member],
        counts: Mapping[str, int],
        *,
        back: Sequence[str],
        now_ms: int,
    ) -> tuple[Group, Back]:
        partitions = {**self.partitions, **counts}
        new = assign(self.config.mode, {m: v.topics for m, v in members.items()}, partitions)
        moved: Back = []
        for m, tps in self.assignment.items():
            kept = set(new.get(m, ())) if m not in back else set()
            moved += [(m, tp) for tp in tps if tp not in kept]
        group = replace(
            self,
            generation=self.generation + 1,
            members=dict(members),
            assignment=new,
            partitions=partitions,
            changed_ms=now_ms,
        )
        return group, moved

    # -- storage ----------------------------------------------------------------------------

    @classmethod
    def from_doc(cls, doc: Doc) -> Group:
        return cls(
            GroupConfig(
                Mode(doc["mode"]),
                AutoReset(doc["autoOffsetReset"]),
                int(doc["sessionTimeoutMs"]),
                int(doc["broadcastExpireMs"]),
            ),
            int(doc.get("generation", 0)),
            {
                m: Member(m, tuple(d["topics"]), int(d["joinedMs"]), int(d["lastSeenMs"]))
                for m, d in doc.get("members", {}).items()
            },
            {
                m: tuple((str(t), int(p)) for t, p in tps)
                for m, tps in doc.get("assignment", {}).items()
            },
            {str(t): int(n) for t, n in doc.get("partitions", {}).items()},
            None if doc.get("changedMs") is None else int(doc["changedMs"]),
            int(doc.get("v", 0)),
        )

    def to_doc(self) -> Doc:
        c = self.config
        return {
            "mode": c.mode.value,
            "autoOffsetReset": c.auto_offset_reset.value,
            "sessionTimeoutMs": c.session_timeout_ms,
            "broadcastExpireMs": c.broadcast_expire_ms,
            "generation": self.generation,
            "members": {
                m: {"topics": list(v.topics), "joinedMs": v.joined_ms, "lastSeenMs": v.last_seen_ms}
                for m, v in self.members.items()
            },
            "assignment": {m: [list(tp) for tp in tps] for m, tps in self.assignment.items()},
            "partitions": dict(self.partitions),
            "changedMs": self.changed_ms,
        }


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a member's (clustering: the group's) deliveries of a partition stand."""

    offset: int | None = None
    """Where the next pull starts (None: at the committed offset)."""
    position: str | None = None
    reset_epoch: int = 0
    """The last reset applied (a reset with a higher epoch is pending)."""
    inflight: tuple[InflightEntry, ...] = ()
    member: str | None = None
    pull: str | None = None
    """The token of the pull that recorded it (a commit based on it names it)."""
    at_ms: int | None = None
    version: int = 0

    def rewound(self) -> Delivery:
        """Back to the committed offset; the reset epoch stays (a reset applies once)."""
        return replace(self, offset=None, position=None, inflight=(), pull=None)

    @classmethod
    def from_doc(cls, doc: Doc | None) -> Delivery:
        if doc is None:
            return cls()
        return cls(
            None if doc.get("offset") is None else int(doc["offset"]),
            doc.get("position"),
            int(doc.get("resetEpoch", 0)),
            tuple((int(o), int(ms)) for o, ms in doc.get("inflight") or []),
            doc.get("member"),
            doc.get("pull"),
            None if doc.get("atMs") is None else int(doc["atMs"]),
            int(doc.get("v", 0)),
        )

    def to_doc(self) -> Doc:
        return {
            "offset": self.offset,
            "position": self.position,
            "resetEpoch": self.reset_epoch,
            "inflight": [list(e) for e in self.inflight],
            "member": self.member,
            "pull": self.pull,
            "atMs": self.at_ms,
        }


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed offset (the next record to read) of the group or a broadcast member."""

    offset: int
    position: str | None = None
    metadata: str = ""
    commit_ms: int | None = None
    seen_ms: int | None = None
    """Broadcast: when the member was last seen (its commit counts as seen)."""
    pull: str | None = None
    """An empty-body commit: the token of the pull whose delivery it committed."""
    version: int = 0

    @classmethod
    def from_doc(cls, doc: Doc | None) -> Committed | None:
        if doc is None:
            return None
        return cls(
            int(doc["offset"]),
            doc.get("position"),
            str(doc.get("metadata") or ""),
            None if doc.get("commitMs") is None else int(doc["commitMs"]),
            None if doc.get("seenMs") is None else int(doc["seenMs"]),
            doc.get("pull"),
            int(doc.get("v", 0)),
        )

    def to_doc(self) -> Doc:
        doc: Doc = {
            "offset": self.offset,
            "position": self.position,
            "metadata": self.metadata,
            "commitMs": self.commit_ms,
        }
        if self.seen_ms is not None:
            doc["seenMs"] = self.seen_ms
        if self.pull is not None:
            doc["pull"] = self.pull
        return doc
