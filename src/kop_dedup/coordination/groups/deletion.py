"""DeleteGroups and OffsetDelete, as Kafka's group coordinator answers them, for Kafka
classic groups and HTTP groups alike (the rules: :mod:`kop_dedup.protocol.groups.deletion`).

Both run as the owner of the group's store partition, on the state as it then is, so
any sidecar serves them and every sidecar's next read sees the result. A group is
deleted through retention's one removal path (:meth:`GroupRetention.forget
<kop_dedup.coordination.groups.retention.GroupRetention.forget>`): every key removed
(committed offsets, offsets pending in a transaction, resets, deliveries, the
membership record), its readers closed, the Pulsar subscriptions that followed its
commits deleted. OffsetDelete removes a partition's committed offset and any offset
pending in a transaction for it (Kafka's tombstone drops both: that transaction's
commit then leaves the partition alone).

A group is known while the store holds any key of it (a group of plain commits
included, as Kafka's Empty group of a simple consumer), or while a role owns its name (a
group claimed by its first use but never stored: deleting it frees the name); unknown is
GROUP_ID_NOT_FOUND (69). NOT_COORDINATOR and the broker's failures come from the store, retriable.
"""

from __future__ import annotations

from collections.abc import Sequence

from kop_dedup import errors
from kop_dedup.coordination.groups.coordinator import GroupCoordinator
from kop_dedup.coordination.groups.retention import GroupRetention
from kop_dedup.coordination.groups.state import GroupState
from kop_dedup.coordination.groups.store import key
from kop_dedup.protocol.groups import TopicPartition
from kop_dedup.protocol.groups.deletion import check_delete_group, subscribed_topics

__all__ = ["GroupDeletion", "TopicDeletion"]

TopicDeletion = tuple[str, list[tuple[int, errors.KafkaError | None]]]
"""(topic, [(partition, None when deleted or the partition's error)])."""


def _unknown(group_id: str) -> errors.GroupIdNotFound:
    return errors.GroupIdNotFound(f"group {group_id!r} does not exist")


class GroupDeletion:
    def __init__(self, groups: GroupCoordinator, retention: GroupRetention) -> None:
        self._groups, self._retention = groups, retention

    async def delete_group(self, group_id: str) -> None:
        """DeleteGroups of one group: every key of it removed; 68 NON_EMPTY_GROUP while
        it has members, 69 GROUP_ID_NOT_FOUND when nothing of it is stored."""
        if not group_id:  # "" names the store partition's own record, never a group
            raise _unknown(group_id)
        groups = self._groups

        def may(state: GroupState) -> bool:
            if not state.stored:
                check_delete_group(groups.classic.group(group_id), None)  # 68 with members
                raise _unknown(group_id)
            check_delete_group(groups.classic.group(group_id), state.group)
            return True

        try:
            await self._retention.forget(group_id, may)
        except errors.GroupIdNotFound:
            if await self._retention.released(group_id) is None:  # not even claimed
                raise

    async def delete_offsets(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[int]]]
    ) -> list[TopicDeletion]:
        """OffsetDelete: the committed offsets of partitions of topics no member
        subscribes to removed (86 GROUP_SUBSCRIBED_TO_TOPIC for the others). Raises for
        the whole request: 24 INVALID_GROUP_ID (""), 69, 68 (members of a protocol type
        other than ``consumer``)."""
        if not group_id:
            raise errors.InvalidGroupId("the group id is empty")
        groups, store = self._groups, self._groups.store

        async def change(p: int) -> tuple[list[TopicDeletion], list[TopicPartition]]:
            state = groups.state(group_id)
            if not state.stored:
                raise _unknown(group_id)
            kept = subscribed_topics(groups.classic.group(group_id), state.group)
            out: list[TopicDeletion] = []
            removed: list[TopicPartition] = []
            for topic, partitions in topics:
                if kept is None or topic in kept:
                    subscribed = errors.GroupSubscribedToTopic(
                        f"a member of group {group_id!r} subscribes to {topic!r}"
                    )
                    out.append((topic, [(i, subscribed) for i in partitions]))
                    continue
                for i in partitions:
                    if (topic, i) in state.offsets:
                        removed.append((topic, i))
                    await store.remove(p, key("o", group_id, topic, i))
                    await store.pending.remove_all(p, group_id, topic, i)
                out.append((topic, [(i, None) for i in partitions]))
            return out, removed

        result: tuple[list[TopicDeletion], list[TopicPartition]]
        result = await store.owned(group_id, change)
        answer, removed = result
        if removed:
            await self._retention.forgotten(group_id, sorted(set(removed)))
        return answer
