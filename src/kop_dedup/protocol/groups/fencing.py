"""KIP-447 fencing of a transactional offset commit made for a member, as pure data.

A TxnOffsetCommit that names a member and generation is checked as that member's own
commit would be: for a Kafka group and a ``group.instance.id``, 82 FENCED_INSTANCE_ID
when the instance is now another member id (KIP-345: :func:`.static.validate`), then 25
UNKNOWN_MEMBER_ID for a member not in the group, else 22 ILLEGAL_GENERATION for another
generation (one a reset fenced included), in that order, as Kafka's
``GroupCoordinator.handleTxnCommitOffsets`` does. The group store runs it
inside the change that writes the pending-offset marker (under the group partition's
lock, on a view proved current), so a rebalance cannot come between the check and the
marker: a zombie of generation g never stages offsets once g+1 could have fetched the
committed ones.

>>> check_txn_member("g", None, None, None, None)
>>> check_txn_member("g", None, None, None, 0)
>>> try:
...     check_txn_member("g", None, None, "m", 0)
... except Exception as exc:
...     print(exc.errno)
25
"""

from __future__ import annotations

from kop_dedup.protocol.groups import static
from kop_dedup.protocol.groups.classic import ClassicGroup
from kop_dedup.protocol.groups.metadata import Group, StaleMember

__all__ = ["check_txn_member"]


def check_txn_member(
    group_id: str,
    kafka: ClassicGroup | None,
    group: Group | None,
    member: str | None,
    generation: int | None,
    instance_id: str | None = None,
) -> None:
    """Raise what ``member``'s own commit at ``generation`` would get from the group as
    read (``kafka``: its Kafka classic form, else ``group``: its HTTP form; neither: no
    group, generation 0). ``None`` skips that check."""
    if kafka is not None:
        if instance_id is not None:
            static.validate(kafka, member or "", instance_id)
        if member is not None and not kafka.has(member):
            raise StaleMember.unknown(group_id, member).error
        if generation is not None and not kafka.current(generation):
            # a generation a reset fenced is stale: the group's next one is current
            current = max(kafka.generation, kafka.min_generation)
            raise StaleMember.generation(group_id, generation, current).error
        return
    if member is not None and (group is None or member not in group.members):
        raise StaleMember.unknown(group_id, member).error
    current = 0 if group is None else group.generation
    if generation is not None and generation != current:
        raise StaleMember.generation(group_id, generation, current).error
