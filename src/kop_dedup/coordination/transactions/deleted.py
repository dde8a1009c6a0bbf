"""Data topics deleted under a commit: the check a copy makes before it creates a copy
producer, and the guard around a deletion through this sidecar.

Kafka drops the markers of a partition whose topic was deleted; a copy does the same.
Pulsar's admin is asked afresh, before each copy producer is created, whether the
partition still exists: a broker that creates topics on use would otherwise make the
partition again, as a topic of its own holding the copy, and one that does not refuses
the producer for ever (the transactional id would stay in PrepareCommit). The answer is
the partitioned topic's metadata, never one failed call.

A deletion through this sidecar (Kafka's DeleteTopics) runs inside
:meth:`TopicDeletions.deleting`: the copier closes the topic's copy producers first and
opens none until it is done (a producer the delete disconnects reconnects, and would
make the partition again).

>>> deletions = TopicDeletions(journal, naming)
>>> async with deletions.deleting("persistent://public/kafka/orders"):
...     ...  # close the topic's producers, then delete it
>>> await deletions.check(txn, part)  # PartitionGone once it is deleted
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from kop_dedup import errors
from kop_dedup.coordination.transactions.journal import Journal
from kop_dedup.protocol.transactions import Partition, Transaction
from kop_dedup.pulsar.naming import Naming

__all__ = ["PartitionGone", "TopicDeletions"]


class PartitionGone(errors.UnknownTopicOrPartition):
    """The data partition a decision copies into no longer exists (Pulsar's admin says
    so, asked afresh): the copy drops it."""


class TopicDeletions:
    """See the module docstring."""

    def __init__(self, journal: Journal, naming: Naming) -> None:
        self._journal, self._naming = journal, naming
        self._deleting: dict[str, int] = {}
        """Topics (full names) being deleted through this sidecar, with how many times."""

    def being_deleted(self, topic: str) -> bool:
        """Whether a Kafka topic (its full name) is being deleted through this sidecar."""
        return topic in self._deleting

    @contextlib.asynccontextmanager
    async def deleting(self, topic: str) -> AsyncIterator[None]:
        """While a Kafka topic (``topic``: its full name) is being deleted."""
        self._deleting[topic] = self._deleting.get(topic, 0) + 1
        try:
            yield
        finally:
            self._deleting[topic] -= 1
            if not self._deleting[topic]:
                del self._deleting[topic]

    async def check(self, txn: Transaction, part: Partition) -> None:
        """Before a copy producer is created for ``part``: a retriable error while its
        topic is being deleted through this sidecar, :class:`PartitionGone` when the
        partition no longer exists."""
        where = f"{part.topic}-{part.partition}"
        if self.being_deleted(self._naming.topic(part.topic)):
            raise errors.KafkaStorageError(f"{where} is being deleted; the copy waits")
        if not await self._journal.data_partition_exists(part.topic, part.partition):
            raise PartitionGone(
                f"{where} no longer exists: transaction {txn.ordinal} of "
                f"{txn.transactional_id!r} is not copied there"
            )
