"""Static membership of a consumer group of the consumer protocol (KIP-848 with
``group.instance.id``: ConsumerGroupHeartbeat's InstanceId), as pure rules over the
members of a :class:`~kop_dedup.protocol.groups.consumer.ConsumerGroup`, after Kafka
4.1's ``GroupMetadataManager`` (``getOrMaybeSubscribeStaticConsumerGroupMember``,
``consumerGroupLeave``, ``consumerGroupStaticMemberGroupLeave``) and the request checks
of its ``GroupCoordinatorService``.

A static member is known by its instance id across restarts:

- a heartbeat at epoch -2 (:data:`LEAVE_STATIC`, a static member closing) keeps the
  member and its assignment, at epoch -2, until its session (counted from its last
  heartbeat) runs out: no new epoch, nobody else gets its partitions meanwhile;
- a member joining (epoch 0) with that instance id under a new member id takes its place
  (:func:`take_over`): the old member id is gone, the new one has its assignment, its
  subscription and its target, and the group epoch does not move unless the
  subscription changed; it answers the group's assignment epoch with the same
  partitions. While the holder is not at -2 the join is UNRELEASED_INSTANCE_ID (111),
  even under the holder's own member id;
- any other heartbeat or leave naming an instance id is of its holder: an instance id
  the group does not know is UNKNOWN_MEMBER_ID (25), another member id than the
  holder's FENCED_INSTANCE_ID (82, the old incarnation), then the usual epoch checks;
- a leave at -1 with an instance id removes its holder at once (a new epoch);
- InstanceId "" is INVALID_REQUEST (42), as is epoch -2 without an instance id, or an
  epoch below -2.

>>> members = {"a": ConsumerMember("a", 3, instance_id="i")}
>>> holder(members, Beat("b", 5, instance_id="i")).member_id
Traceback (most recent call last):
...
kop_dedup.errors.FencedInstanceId: Static member b with instance id i was fenced by member a.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kop_dedup import errors
from kop_dedup.protocol.groups.consumer_member import Beat, ConsumerMember

__all__ = ["LEAVE_STATIC", "away", "check_request", "holder", "take_over"]

LEAVE_STATIC = -2
"""Kafka's LEAVE_GROUP_STATIC_MEMBER_EPOCH."""


def check_request(beat: Beat) -> None:
    """The instance id and epoch checks Kafka's ``GroupCoordinatorService`` makes before
    the group is looked at (42)."""
    if beat.instance_id == "":
        raise errors.InvalidRequest("InstanceId can't be empty.")
    if beat.member_epoch == LEAVE_STATIC and beat.instance_id is None:
        raise errors.InvalidRequest("InstanceId can't be null.")
    if beat.member_epoch < LEAVE_STATIC:
        raise errors.InvalidRequest("MemberEpoch is invalid.")


def _holding(members: Mapping[str, ConsumerMember], instance_id: str) -> ConsumerMember | None:
    return next((m for m in members.values() if m.instance_id == instance_id), None)


def holder(members: Mapping[str, ConsumerMember], beat: Beat) -> ConsumerMember:
    """The member a heartbeat (not a join) or a leave naming an instance id is of: 25
    when the group does not know the instance id, 82 when another member id holds it."""
    assert beat.instance_id is not None
    current = _holding(members, beat.instance_id)
    if current is None:
        raise errors.UnknownMemberId(f"Instance id {beat.instance_id} is unknown.")
    if current.member_id != beat.member_id:
        raise errors.FencedInstanceId(
            f"Static member {beat.member_id} with instance id {beat.instance_id} was "
            f"fenced by member {current.member_id}."
        )
    return current


def take_over(
    members: Mapping[str, ConsumerMember], beat: Beat
) -> tuple[ConsumerMember, str] | None:
    """A join (epoch 0) naming an instance id: None when no member holds it (a new
    static member), else its holder copied under the joining member id at epoch 0 (its
    assignment, subscription and settings kept) and the holder's member id, once the
    holder left at -2; 111 while it has not."""
    assert beat.instance_id is not None
    current = _holding(members, beat.instance_id)
    if current is None:
        return None
    if current.epoch != LEAVE_STATIC:
        raise errors.UnreleasedInstanceId(
            f"Static member {beat.member_id} with instance id {beat.instance_id} cannot "
            "join the group because the instance id is owned by "
            f"{current.member_id} member."
        )
    return replace(current, member_id=beat.member_id, epoch=0, previous_epoch=0), current.member_id


def away(member: ConsumerMember) -> ConsumerMember:
    """The member after its leave at -2: epoch -2, its assignment kept, nothing being
    revoked (its revocation deadline no longer runs); its previous epoch unchanged."""
    return replace(member, epoch=LEAVE_STATIC, revoking=frozenset(), revoke_by_ms=0)
