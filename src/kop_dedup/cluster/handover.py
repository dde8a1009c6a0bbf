"""Letting go of producer names another node owns now, so that it can open them at once.

A Pulsar producer name is held by one connection at a time: a new owner that tries a
name the previous one still holds is refused (ProducerBusy) until that one closes it.
So when ownership moves this node closes, as soon as nothing is in flight on them:

- the produce channels (``<prefix>-<pid>-<epoch>`` on a data partition) of the
  partitions another node leads, checked at every listing of the members whatever moved
  them (:meth:`Handover.retire_moved`): the new leader opens the names within a listing
  (``CLUSTER_REFRESH_MS``), not after the idle reaper (``PRODUCER_IDLE_SECONDS``);
- the journal channels of the producer ids whose transactions another node coordinates
  (their transaction-log partition moved: :meth:`Handover.release_journals`).

Copy producers are released by the transaction coordinator itself (it owns them).
"""

from __future__ import annotations

import logging

from kop_dedup.cluster.ownership import Cluster
from kop_dedup.cluster.placement import ClusterView
from kop_dedup.produce.channels import ChannelManager
from kop_dedup.pulsar.naming import Naming

__all__ = ["Handover"]

log = logging.getLogger(__name__)


class Handover:
    def __init__(
        self, cluster: Cluster, channels: ChannelManager, naming: Naming, *, journals: str
    ) -> None:
        self._cluster, self._channels, self._naming = cluster, channels, naming
        self._journals = journals
        """The prefix of journal partition topics (``persistent://<sys>/txn-journal.``)."""

    def release_journals(self, producer_ids: frozenset[int]) -> None:
        """Another node coordinates these producer ids now: free their journal names."""
        prefix = self._journals
        self._channels.retire_moved(
            lambda key: key[0].startswith(prefix) and key[1] in producer_ids
        )

    async def retire_moved(self, view: ClusterView) -> None:
        """After every listing of the members: close the channels of partitions another
        node leads in ``view``, whatever left them here (a membership change; a batch
        served under the view of a moment before, or forwarded by a node whose view
        differed). Asks nothing of Pulsar: a partition's leader depends on its index
        and the members only, not on the topic's partition count."""
        data = f"persistent://{self._naming.namespace_path}/"
        moved: set[str] = set()
        for ptopic in {key[0] for key in self._channels.open_keys()}:
            topic, sep, index = ptopic.removeprefix(data).rpartition("-partition-")
            journal = ptopic.startswith(self._journals)  # SYSTEM_NAMESPACE may be the data one
            if journal or not ptopic.startswith(data) or not sep or not index.isdigit():
                continue
            leader = self._cluster.leader_at(topic, int(index), view)
            if leader is not None and not self._cluster.is_me(leader):
                moved.add(ptopic)
        if moved:
            closed = self._channels.retire_moved(lambda key: key[0] in moved)
            if closed:
                log.info(
                    "cluster: %d partition(s) led elsewhere now; %d producer(s) closed at once",
                    len(moved),
                    closed,
                )
