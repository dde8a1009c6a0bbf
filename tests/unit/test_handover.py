"""The hand-over of produce channels: at every listing of the members, this node closes
the producers it holds on partitions another node leads, whatever moved them.

A real :class:`Cluster` over a :class:`Membership` that is handed views as a listing
would hand them; the channels are the channel manager's, on the fakes of
``test_channels``.
"""

from __future__ import annotations

import asyncio

from kop_dedup.cluster.handover import Handover
from kop_dedup.cluster.members import Membership
from kop_dedup.cluster.ownership import Cluster
from kop_dedup.cluster.placement import ClusterView, Member, place
from kop_dedup.produce.channels import ChannelManager
from kop_dedup.pulsar.naming import Naming
from tests.unit.test_channels import manager, opened, run

ME, OTHER = Member(1, "127.0.0.1", 9001), Member(2, "127.0.0.1", 9002)
TWO = ClusterView.of([ME, OTHER])
DATA = "persistent://public/kafka"


def _cluster(
    mgr: ChannelManager, counts: dict[str, int], journals: str = "persistent://public/sys/txn-j."
) -> tuple[Membership, Handover]:
    async def partitions_of(topic: str) -> int:
        return counts[topic]

    membership = Membership(None, None, "unit-members")  # type: ignore[arg-type]
    membership._me = ME  # joined: listed as itself
    cluster = Cluster(membership, partitions_of=partitions_of)
    handover = Handover(cluster, mgr, Naming("public", "kafka", "kop"), journals=journals)
    cluster.on_data(handover.retire_moved)
    return membership, handover


def _partition_led_by(node: int, topic: str, count: int) -> int:
    return place(f"topic:{topic}", count, TWO.node_ids).index(node)


def test_a_channel_on_a_partition_another_node_leads_closes_at_the_next_listing_members_unchanged():
    # a produce checked the leader under one view and opened its producer under the next
    # (or anything else left a name here): the next listing closes it, not the idle reaper
    async def go() -> tuple[bool, list[str]]:
        mgr, publisher, _ = manager()
        membership, _ = _cluster(mgr, {"t": 4})
        await membership._publish(TWO)  # the listing that saw node 2 join
        theirs = _partition_led_by(OTHER.node_id, "t", 4)
        channel = await opened(mgr, (f"{DATA}/t-partition-{theirs}", 7, 0))
        mgr.release(channel)
        await membership._publish(TWO)  # the next listing: the same members
        await asyncio.sleep(0.05)
        return channel.closed, publisher.log

    closed, log = run(go())
    assert closed
    assert "closed kop-7-0" in log


def test_a_channel_still_in_use_closes_when_its_last_batch_is_answered():
    async def go() -> tuple[bool, bool]:
        mgr, _, _ = manager()
        membership, _ = _cluster(mgr, {"t": 4})
        theirs = _partition_led_by(OTHER.node_id, "t", 4)
        channel = await opened(mgr, (f"{DATA}/t-partition-{theirs}", 7, 0))
        await membership._publish(TWO)
        held = channel.closed  # its batch is still inside the sidecar
        mgr.release(channel)
        return held, channel.closed

    assert run(go()) == (False, True)


def test_the_channels_of_partitions_this_node_leads_stay_open_as_the_topic_grows():
    async def go() -> list[bool]:
        mgr, _, _ = manager()
        counts = {"t": 3}
        membership, _ = _cluster(mgr, counts)
        await membership._publish(TWO)
        mine = [p for p, n in enumerate(place("topic:t", 3, TWO.node_ids)) if n == ME.node_id]
        channels = [await opened(mgr, (f"{DATA}/t-partition-{p}", 7, 0)) for p in mine]
        for channel in channels:
            mgr.release(channel)
        counts["t"] = 8  # CreatePartitions
        for _ in range(3):
            await membership._publish(TWO)
        return [c.closed for c in channels]

    closed = run(go())
    assert closed  # this node leads some of them
    assert not any(closed)


def test_a_node_that_has_not_joined_closes_nothing():
    async def go() -> bool:
        mgr, _, _ = manager()
        membership, _ = _cluster(mgr, {"t": 4})
        membership._me = Member(3, "127.0.0.1", 9003)  # not among the members listed
        theirs = _partition_led_by(OTHER.node_id, "t", 4)
        channel = await opened(mgr, (f"{DATA}/t-partition-{theirs}", 7, 0))
        mgr.release(channel)
        await membership._publish(TWO)
        return channel.closed

    assert not run(go())


def test_journal_channels_are_left_to_the_transaction_coordinator():
    async def go() -> bool:
        mgr, _, _ = manager()
        membership, _ = _cluster(mgr, {"t": 4})
        channel = await opened(mgr, ("persistent://public/sys/txn-j.log-partition-3", 7, 0))
        mgr.release(channel)
        await membership._publish(TWO)
        await membership._publish(TWO)
        return channel.closed

    assert not run(go())


def test_journal_channels_in_the_data_namespace_are_left_alone_too():
    # SYSTEM_NAMESPACE may name the data namespace: a journal partition then looks like a
    # Kafka topic's partition, and its leader is no journal's owner
    async def go() -> bool:
        mgr, _, _ = manager()
        membership, _ = _cluster(mgr, {}, journals=f"{DATA}/txn-journal.")
        theirs = _partition_led_by(OTHER.node_id, "txn-journal.log", 8)
        channel = await opened(mgr, (f"{DATA}/txn-journal.log-partition-{theirs}", 7, 0))
        mgr.release(channel)
        await membership._publish(TWO)
        return channel.closed

    assert not run(go())
