"""Static membership of a Kafka classic group (KIP-345, ``group.instance.id``) as pure
rules over :class:`~kop_dedup.protocol.groups.classic.ClassicGroup`, after Kafka's
``ClassicGroup.validateMember`` and ``GroupMetadataManager``'s static-member paths.

A static member is known by its instance id across restarts:

- a JoinGroup with a known instance id and no member id (a restart) takes the old
  member's place (:func:`replace`): a new member id, the old one's assignment and
  leadership; no rebalance while the group is Stable and the protocol it would select
  is the one it has, else the round Kafka starts (CompletingRebalance: a rebalance, the
  old id may already be in the leader's assignment; PreparingRebalance: it joins the
  round). No KIP-394 id round trip: its instance id already names it;
- every call that names an instance id is checked first (:func:`validate`): the id of
  another member is FENCED_INSTANCE_ID (82: the old incarnation, a zombie), an
  instance id the group does not know UNKNOWN_MEMBER_ID (25);
- a round that completes keeps its static members that did not join (only their
  session removes them: :meth:`ClassicGroup.complete_if_ready`), so a static member
  that closes without leaving costs the others no rebalance until its session passes;
- LeaveGroup may name an instance id alone (an operator's removal, :func:`leaver`).

>>> from kop_dedup.protocol.groups.classic import JoinRequest
>>> def req(m, i): return JoinRequest(m, i, "c", "h", 6000, 6000, "consumer", (("range", b""),))
>>> g = ClassicGroup.new().add_pending("a", 0, 6000).join(req("a", "i-a"), 0)
>>> g = g.sync("a", 1, {"a": b"p0"})
>>> g2 = replace(g, req("a2", "i-a"), 10)
>>> (g2.state, g2.generation, g2.leader, g2.member("a2").assignment)
('Stable', 1, 'a2', b'p0')
>>> try:
...     validate(g2, "a", "i-a")
... except Exception as exc:
...     print(exc.errno)
82
"""

from __future__ import annotations

import dataclasses

from kop_dedup import errors
from kop_dedup.protocol.groups.classic import (
    COMPLETING,
    PREPARING,
    STABLE,
    ClassicGroup,
    JoinRequest,
)

__all__ = ["check", "join", "leaver", "replace", "replaces", "validate", "validate_commit"]


def validate(group: ClassicGroup, member_id: str, instance_id: str | None) -> None:
    """Kafka's ``validateMember``: with an instance id, 25 when the group does not know
    it, 82 when it names another member id; then 25 when the member id is not in the
    group."""
    if instance_id is not None:
        current = group.by_instance(instance_id)
        if current is None:
            raise errors.UnknownMemberId(
                f"static member {instance_id!r} is not in the group: join again"
            )
        if current != member_id:
            raise errors.FencedInstanceId(
                f"static member {instance_id!r} is now member {current!r}: member "
                f"{member_id!r} was replaced by a newer instance with the same "
                "group.instance.id"
            )
    if not group.has(member_id):
        raise errors.UnknownMemberId(f"member {member_id!r} is not in the group: join again")


def replace(group: ClassicGroup, req: JoinRequest, now_ms: int) -> ClassicGroup:
    """A JoinGroup of a known instance id under a new member id (``req.member_id``):
    the member that had that instance id replaced in place (its assignment kept, its
    leadership passed on), then Kafka's step for the group's state (see the module
    docstring). The caller checked the protocols (:meth:`ClassicGroup.check_protocols`
    with the old member left out)."""
    old_id = group.by_instance(req.instance_id)
    if old_id is None:
        raise ValueError(f"no static member {req.instance_id!r} to replace")
    old = group.member(old_id)
    new = dataclasses.replace(
        old,
        member_id=req.member_id,
        client_id=req.client_id,
        client_host=req.client_host,
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=req.rebalance_timeout_ms,
        protocols=req.protocols,
        last_seen_ms=now_ms,
        awaiting_join=group.state == PREPARING,
    )
    members = {
        (req.member_id if k == old_id else k): (new if k == old_id else m)
        for k, m in group.members.items()
    }
    leader = req.member_id if group.leader == old_id else group.leader
    swapped = dataclasses.replace(group, members=members, leader=leader)
    if group.state == STABLE and swapped.select_protocol() == group.protocol:
        return swapped
    if group.state in (STABLE, COMPLETING):
        joining = {**members, req.member_id: dataclasses.replace(new, awaiting_join=True)}
        return (
            dataclasses.replace(swapped, members=joining).prepare(now_ms).complete_if_ready(now_ms)
        )
    return swapped.complete_if_ready(now_ms)


def leaver(group: ClassicGroup, member_id: str, instance_id: str | None) -> str:
    """The member a LeaveGroup identity names: by instance id alone when the member id
    is empty (Kafka's administrative removal), else the member id checked as
    :func:`validate` (25, 82)."""
    if not member_id and instance_id is not None:
        current = group.by_instance(instance_id)
        if current is None:
            raise errors.UnknownMemberId(f"static member {instance_id!r} is not in the group")
        return current
    validate(group, member_id, instance_id)
    return member_id


def check(group: ClassicGroup, member_id: str, instance_id: str | None, generation: int) -> None:
    """A Heartbeat's or SyncGroup's checks, in Kafka's order: :func:`validate` (82, 25),
    then the generation (:meth:`ClassicGroup.check`: 22)."""
    validate(group, member_id, instance_id)
    group.check(member_id, generation)


def validate_commit(
    group: ClassicGroup, member_id: str, instance_id: str | None, generation: int
) -> bool:
    """Kafka's ``validateOffsetCommit`` with the instance id: a commit outside group
    management on an Empty group passes unchecked; one that names an instance id is
    :func:`validate`-d first (82, 25); then :meth:`ClassicGroup.validate_commit`."""
    if instance_id is not None and not (generation < 0 and not group.members):
        validate(group, member_id, instance_id)
    return group.validate_commit(member_id, instance_id, generation)


def replaces(group: ClassicGroup, req: JoinRequest, *, fresh: bool) -> bool:
    """Whether a JoinGroup that came without a member id (``fresh``: ``req.member_id``
    is the one just made for it) is a restart of a static member the group knows."""
    return fresh and req.instance_id is not None and group.by_instance(req.instance_id) is not None


def join(group: ClassicGroup, req: JoinRequest, now_ms: int, *, fresh: bool) -> ClassicGroup:
    """A JoinGroup: a static restart (:func:`replaces`) replaces the old member; a
    member id that names an instance id is :func:`validate`-d (82, 25), unless it is a
    pending new member's; then :meth:`ClassicGroup.join`."""
    if replaces(group, req, fresh=fresh):
        group.check_protocols(req)
        return replace(group, req, now_ms)
    if req.instance_id is not None and req.member_id not in group.pending:
        group.check_protocols(req)
        validate(group, req.member_id, req.instance_id)
    return group.join(req, now_ms)
