"""A Kafka classic group (JoinGroup/SyncGroup/Heartbeat/LeaveGroup, client-side
assignment) as typed, immutable data and its transitions, after Kafka's
``ClassicGroup`` and ``GroupMetadataManager``: no I/O, no clock (``now_ms`` is passed).

The group store keeps it under ``["k", group]`` (:meth:`ClassicGroup.to_doc`), apart
from the HTTP groups' ``["g", group]``: a group is one kind or the other.

States, as Kafka's: ``Empty`` (no member), ``PreparingRebalance`` (members are asked to
join again; the round completes when every member has joined or at the rebalance
deadline, members that did not join are removed), ``CompletingRebalance`` (a new
generation: the leader's SyncGroup brings the assignment), ``Stable``.

A server-side reset of a group with members (:meth:`ClassicGroup.fenced`) starts a
round and fences the generation it interrupts: a heartbeat, SyncGroup or commit at a
generation below :attr:`ClassicGroup.min_generation` is ILLEGAL_GENERATION (22), so a
member cannot commit its pre-reset position over the reset, and drops its positions
(a lost assignment, in the eager and the cooperative protocol alike) and fetches the
committed offsets after it rejoins.

>>> g = ClassicGroup.new()
>>> g = g.join(JoinRequest("a", None, "c", "h", 6000, 6000, "consumer", (("range", b""),)), 0)
>>> g.state, g.generation, g.leader                 # the only member: complete at once
('CompletingRebalance', 1, 'a')
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kop_dedup import errors

__all__ = [
    "COMPLETING",
    "EMPTY",
    "PREPARING",
    "STABLE",
    "ClassicGroup",
    "ClassicMember",
    "JoinRequest",
]

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"

Protocols = tuple[tuple[str, bytes], ...]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """A JoinGroup as the coordinator sees it (``member_id`` "" for a new member)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols


@dataclass(frozen=True, slots=True)
class ClassicMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: Protocols
    last_seen_ms: int
    awaiting_join: bool = False
    """Joined in the current PreparingRebalance round (its session does not expire
    while it waits, as Kafka's)."""
    assignment: bytes = b""

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")

    def vote(self, candidates: set[str]) -> str:
        """Its most preferred protocol among ``candidates`` (Kafka's ``vote``)."""
        return next(n for n, _ in self.protocols if n in candidates)

    def expired(self, now_ms: int) -> bool:
        return not self.awaiting_join and now_ms - self.last_seen_ms > self.session_timeout_ms

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.member_id,
            "inst": self.instance_id,
            "client": self.client_id,
            "host": self.client_host,
            "session": self.session_timeout_ms,
            "rebalance": self.rebalance_timeout_ms,
            "protocols": [[n, _b64(m)] for n, m in self.protocols],
            "seen": self.last_seen_ms,
            "awaiting": self.awaiting_join,
            "assignment": _b64(self.assignment),
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ClassicMember:
        return cls(
            str(doc["id"]),
            doc.get("inst"),
            str(doc.get("client", "")),
            str(doc.get("host", "")),
            int(doc["session"]),
            int(doc["rebalance"]),
            tuple((str(n), _unb64(m)) for n, m in doc.get("protocols", [])),
            int(doc.get("seen", 0)),
            bool(doc.get("awaiting", False)),
            _unb64(doc.get("assignment", "")),
        )


@dataclass(frozen=True, slots=True)
class ClassicGroup:
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    """By member id, in the order they joined (the first joined leads a new group)."""
    pending: dict[str, int] = field(default_factory=dict)
    """Member ids handed out by MEMBER_ID_REQUIRED (KIP-394) and when they expire."""
    deadline_ms: int = 0
    """When the PreparingRebalance round completes whoever joined."""
    min_generation: int = 0
    """Calls at a generation below it are ILLEGAL_GENERATION (a reset's fence: the
    generation the round it started completes)."""

    @classmethod
    def new(cls) -> ClassicGroup:
        return cls()

    # -- reading --------------------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def member(self, member_id: str) -> ClassicMember:
        return self.members[member_id]

    def by_instance(self, instance_id: str | None) -> str | None:
        if instance_id is None:
            return None
        return next(
            (m.member_id for m in self.members.values() if m.instance_id == instance_id), None
        )

    def _supports(self, protocol_type: str, names: Iterable[str], *, without: str) -> bool:
        """Kafka's ``supportsProtocols``: an empty group takes any; else the type must be
        the group's and one protocol supported by every other member."""
        others = [m for m in self.members.values() if m.member_id != without]
        names = set(names)
        if not others:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        common = set.intersection(*({n for n, _ in m.protocols} for m in others))
        return bool(names & common)

    def select_protocol(self) -> str:
        """Kafka's ``selectProtocol``: among the protocols every member supports, the
        one most members prefer."""
        candidates = set.intersection(*({n for n, _ in m.protocols} for m in self.members.values()))
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=lambda n: votes[n])

    # -- transitions ------------------------------------------------------------------------

    def add_pending(self, member_id: str, now_ms: int, session_timeout_ms: int) -> ClassicGroup:
        """KIP-394: a new member's id handed out, known until its session passes."""
        pending = {m: t for m, t in self.pending.items() if t >= now_ms}
        pending[member_id] = now_ms + session_timeout_ms
        return replace(self, pending=pending)

    def join(self, req: JoinRequest, now_ms: int) -> ClassicGroup:
        """A known (or pending) member joins: raises 23 (protocols), 25 (unknown id).
        The result has the member's round started, or completed when every member has
        joined; an existing member of a Stable or CompletingRebalance group whose
        protocols did not change is answered the current generation (state unchanged
        but its session refreshed)."""
        known = req.member_id in self.members
        if not known and req.member_id not in self.pending:
            self.check_protocols(req)
            raise errors.UnknownMemberId(
                f"member {req.member_id!r} is not in the group: join again"
            )
        self.check_protocols(req)
        before = self.members.get(req.member_id)
        member = ClassicMember(
            req.member_id,
            req.instance_id,
            req.client_id,
            req.client_host,
            req.session_timeout_ms,
            req.rebalance_timeout_ms,
            req.protocols,
            now_ms,
            awaiting_join=True,
            assignment=b"" if before is None else before.assignment,
        )
        pending = {m: t for m, t in self.pending.items() if m != req.member_id}
        group = replace(
            self,
            members={**self.members, req.member_id: member},
            pending=pending,
            protocol_type=self.protocol_type if self.members else req.protocol_type,
        )
        if before is not None and self.state in (STABLE, COMPLETING):
            same = before.protocols == req.protocols
            if same and (self.state == COMPLETING or req.member_id != self.leader):
                kept = replace(member, awaiting_join=False)
                return replace(group, members={**group.members, req.member_id: kept})
        if group.state != PREPARING:
            group = group.prepare(now_ms)
        return group.complete_if_ready(now_ms)

    def check_protocols(self, req: JoinRequest) -> None:
        """23 INCONSISTENT_GROUP_PROTOCOL when the join names no protocol type or
        protocols, or none that every other member supports (a new member gets it before
        its id, as Kafka's)."""
        if not req.protocol_type or not req.protocols:
            raise errors.InconsistentGroupProtocol(
                "a JoinGroup must name a protocol type and protocols"
            )
        names = (n for n, _ in req.protocols)
        if not self._supports(req.protocol_type, names, without=req.member_id):
            raise errors.InconsistentGroupProtocol(
                f"protocol type {req.protocol_type!r} with protocols "
                f"{[n for n, _ in req.protocols]} shares no protocol with the group's members "
                f"(type {self.protocol_type!r})"
            )

    def prepare(self, now_ms: int) -> ClassicGroup:
        """Start a round: every member must join again by the deadline (the longest
        rebalance timeout of its members); whoever just joined keeps its flag."""
        if not self.members:
            return self.complete_if_ready(now_ms)
        deadline = now_ms + max(m.rebalance_timeout_ms for m in self.members.values())
        members = {
            k: replace(m, assignment=b"", last_seen_ms=m.last_seen_ms)
            for k, m in self.members.items()
        }
        return replace(self, state=PREPARING, members=members, deadline_ms=deadline)

    def complete_if_ready(self, now_ms: int) -> ClassicGroup:
        """Complete the round when every member joined, or at the deadline (dynamic
        members that did not join are removed; static ones stay until their session
        passes, and while none joined the round waits another rebalance timeout, as
        Kafka's): a new generation, its protocol and a leader that joined."""
        if self.state != PREPARING:
            return self
        waiting = all(m.awaiting_join for m in self.members.values())
        if not waiting and now_ms < self.deadline_ms:
            return self
        joined = [k for k, m in self.members.items() if m.awaiting_join]
        members = {
            k: m for k, m in self.members.items() if m.awaiting_join or m.instance_id is not None
        }
        if members and not joined:
            longest = max(m.rebalance_timeout_ms for m in members.values())
            return replace(self, members=members, deadline_ms=now_ms + longest)
        generation = self.generation + 1
        if not members:
            return replace(
                self,
                state=EMPTY,
                generation=generation,
                members={},
                protocol=None,
                leader=None,
                deadline_ms=0,
            )
        done = replace(self, members=members)
        leader = self.leader if self.leader in joined else joined[0]
        return replace(
            done,
            state=COMPLETING,
            generation=generation,
            protocol=done.select_protocol(),
            leader=leader,
            deadline_ms=0,
            members={
                k: replace(m, awaiting_join=False, last_seen_ms=now_ms, assignment=b"")
                for k, m in members.items()
            },
        )

    def sync(
        self, member_id: str, generation: int, assignments: Mapping[str, bytes]
    ) -> ClassicGroup:
        """The leader's SyncGroup in CompletingRebalance: its assignment stored (members
        it left out get none), the group Stable. Checks as :meth:`check`."""
        self.check(member_id, generation)
        if self.state != COMPLETING or member_id != self.leader:
            return self
        members = {
            k: replace(m, assignment=assignments.get(k, b"")) for k, m in self.members.items()
        }
        return replace(self, state=STABLE, members=members)

    def current(self, generation: int) -> bool:
        """Whether a member's call at ``generation`` is of the group's generation and not
        fenced by a reset."""
        return generation == self.generation and generation >= self.min_generation

    def check(self, member_id: str, generation: int) -> None:
        """A member's call at a generation: 25 unknown member, 22 another generation (or
        one a reset fenced), 25 for an Empty group (Kafka's order)."""
        if member_id not in self.members:
            raise errors.UnknownMemberId(f"member {member_id!r} is not in the group: join again")
        if generation < self.min_generation and generation == self.generation:
            raise errors.IllegalGeneration(
                f"generation {generation} was fenced by a reset of the group's offsets: "
                "join again (and fetch the committed offsets)"
            )
        if generation != self.generation:
            raise errors.IllegalGeneration(
                f"generation {generation} is not the group's ({self.generation}): join again"
            )

    def fenced(self, now_ms: int) -> ClassicGroup:
        """A server-side reset of the group's offsets: with members, a round started
        (or the one under way kept) and the current generation fenced, so that every
        member rejoins and fetches the offsets again and none commits at the generation
        it read under; an Empty group is unchanged (its next members fetch them)."""
        if not self.members:
            return self
        group = self if self.state == PREPARING else self.prepare(now_ms)
        return replace(group, min_generation=self.generation + 1)

    def seen(self, member_id: str, now_ms: int) -> ClassicGroup | None:
        """The member's session refreshed; None when the stored time is recent enough
        (a quarter of its session: fewer writes)."""
        m = self.members[member_id]
        if now_ms - m.last_seen_ms < m.session_timeout_ms // 4:
            return None
        return replace(self, members={**self.members, member_id: replace(m, last_seen_ms=now_ms)})

    def leave(self, member_id: str, now_ms: int) -> ClassicGroup:
        """Remove a member (or a pending id): a rebalance follows (an Empty group when it
        was the last). UnknownMemberId when neither."""
        if member_id in self.pending:
            return replace(self, pending={m: t for m, t in self.pending.items() if m != member_id})
        if member_id not in self.members:
            raise errors.UnknownMemberId(f"member {member_id!r} is not in the group")
        return self._without([member_id], now_ms)

    def _without(self, gone: Iterable[str], now_ms: int) -> ClassicGroup:
        gone = set(gone)
        group = replace(self, members={k: m for k, m in self.members.items() if k not in gone})
        if group.state in (STABLE, COMPLETING):
            group = group.prepare(now_ms)
        if not group.members:
            group = replace(group, state=PREPARING)
        return group.complete_if_ready(now_ms)

    def expire(self, now_ms: int) -> ClassicGroup | None:
        """Members that missed their session removed, pending ids past theirs dropped, a
        round past its deadline completed; None when nothing changes."""
        gone = [k for k, m in self.members.items() if m.expired(now_ms)]
        pending = {m: t for m, t in self.pending.items() if t >= now_ms}
        due = self.state == PREPARING and now_ms >= self.deadline_ms
        if not gone and len(pending) == len(self.pending) and not due:
            return None
        group = replace(self, pending=pending)
        return group._without(gone, now_ms) if gone else group.complete_if_ready(now_ms)

    def validate_commit(self, member_id: str, instance_id: str | None, generation: int) -> bool:
        """Kafka's ``validateOffsetCommit``: True for a commit outside group management
        (generation < 0 on an Empty group), else the member's own, checked (25, 22, 27
        while CompletingRebalance); 25 for a commit with neither on a group with members."""
        if generation < 0 and self.state == EMPTY:
            return True
        if generation >= 0 or member_id or instance_id is not None:
            self.check(member_id, generation)
        elif self.state != EMPTY:
            raise errors.UnknownMemberId(
                "the group has members: a commit must carry its member id and generation"
            )
        if self.state == COMPLETING:
            raise errors.RebalanceInProgress("the group is rebalancing: join again")
        return False

    # -- stored form --------------------------------------------------------------------------

    def to_doc(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "generation": self.generation,
            "ptype": self.protocol_type,
            "protocol": self.protocol,
            "leader": self.leader,
            "members": [m.to_doc() for m in self.members.values()],
            "pending": self.pending,
            "deadline": self.deadline_ms,
            "fence": self.min_generation,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> ClassicGroup | None:
        if doc is None:
            return None
        members = [ClassicMember.from_doc(m) for m in doc.get("members", [])]
        return cls(
            str(doc.get("state", EMPTY)),
            int(doc.get("generation", 0)),
            doc.get("ptype"),
            doc.get("protocol"),
            doc.get("leader"),
            {m.member_id: m for m in members},
            {str(k): int(v) for k, v in doc.get("pending", {}).items()},
            int(doc.get("deadline", 0)),
            int(doc.get("fence", 0)),
        )
