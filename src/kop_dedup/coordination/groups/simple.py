"""Offsets committed and fetched by a Kafka consumer that assigns its partitions itself,
in the offset store the HTTP groups and transactions use.

Kafka's rules for an OffsetCommit (``ClassicGroup.validateOffsetCommit``), applied to
the groups the HTTP API manages, so that a Kafka client can never corrupt one:

- no such group: a commit with generation -1 is a simple commit (Kafka makes a
  "simple" group of it) and is stored; a generation >= 0 names a group that is not
  there: ``missing`` (ILLEGAL_GENERATION 22, or GROUP_ID_NOT_FOUND 69 from
  OffsetCommit v9: the caller says which);
- a group with no member: a commit with generation -1 is stored (an empty group takes
  admin commits), one with a generation names an unknown member (25);
- a group with members: a commit naming neither member nor generation is
  UNKNOWN_MEMBER_ID (25); one naming them is the member's own commit (the group
  coordinator checks it: an unknown member 25, another generation (-1 included) 22,
  a partition not assigned to it 22).

A Kafka group (JoinGroup and the rest, :mod:`.classic`) gets Kafka's own checks
(``ClassicGroup.validateOffsetCommit``): a simple commit while it is Empty, else the
member's (25, 22, 27 while CompletingRebalance).

>>> await commit(runtime.groups, "g", "", -1, [StagedOffset("t", 0, 42)], missing=...)
>>> await fetch(runtime.groups, "g", require_stable=True)   # 88 while pending
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from kop_dedup import errors
from kop_dedup.coordination.groups.coordinator import GroupCoordinator, StaleMember
from kop_dedup.coordination.groups.store import CommittedOffset, StagedOffset
from kop_dedup.protocol.groups import Group

__all__ = ["Route", "commit", "fetch", "route"]


class Route(enum.Enum):
    STORE = "store"
    """A simple commit: into the store as it is."""
    MEMBER = "member"
    """A member's commit: through the group coordinator."""


def route(
    described: Group | None,
    group: str,
    member: str,
    generation: int,
    missing: errors.KafkaError,
) -> Route:
    """Where a commit goes, or the Kafka error it gets (see the module docstring)."""
    simple = generation < 0 and not member
    if described is None:
        if generation < 0:
            return Route.STORE
        raise missing
    if not described.members:
        if generation < 0:
            return Route.STORE
        raise errors.UnknownMemberId(
            f"group {group!r} has no member: member {member!r} is not in it"
        )
    if simple:
        raise errors.UnknownMemberId(
            f"group {group!r} has members (the HTTP group API manages it): a commit without "
            "its member id and generation would overwrite what its members committed"
        )
    return Route.MEMBER


async def commit(
    groups: GroupCoordinator,
    group: str,
    member: str,
    generation: int,
    offsets: Sequence[StagedOffset],
    *,
    missing: errors.KafkaError,
    instance_id: str | None = None,
) -> None:
    """Commit ``offsets`` for ``group`` as Kafka would let this commit through; raises
    the Kafka error it gets instead (nothing is written then)."""
    http_group = await groups.describe(group)
    if http_group is None and groups.consumer.serves(group):
        await groups.consumer.commit(group, member, generation, offsets)
        return
    if http_group is None and groups.classic.is_kafka(group):
        await groups.classic.commit(group, member, instance_id, generation, offsets)
        return
    where = route(http_group, group, member, generation, missing)
    if where is Route.STORE:
        await groups.store.commit(group, offsets)
        return
    try:
        await groups.commit(
            group,
            member,
            [(o.topic, o.partition, o.offset) for o in offsets],
            generation,
        )
    except StaleMember as exc:
        raise exc.error from None


async def fetch(
    groups: GroupCoordinator, group: str, *, require_stable: bool
) -> list[CommittedOffset]:
    """The group's committed offsets (every partition it has one, or a pending one,
    for); ``require_stable``: 88 UNSTABLE_OFFSET_COMMIT where a transaction holds
    offsets not yet complete."""
    return await groups.store.fetch(group, require_stable=require_stable)
