"""Kafka consumer groups through the listener, with real clients: confluent-kafka,
kafka-python and aiokafka members in one group split the partitions, rebalance when a
member joins, leaves or is killed, commit, and read every record (none lost); a member
moved to a second sidecar keeps its membership; Kafka and HTTP groups refuse each
other's calls (23, 409)."""

from __future__ import annotations

import signal
import uuid
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.protocol.consumer import (
    HeartbeatRequest,
    SyncGroupRequest,
)

from kop_dedup.cluster.placement import GROUP_LOG, place
from kop_dedup.coordination.partitions import partition_of
from tests.integration.kafka_consume import create, produce
from tests.integration.kafka_members import Member, killable_member, split, wait_until
from tests.kafka_group_wire import commit, join
from tests.kafka_group_wire import member as new_member
from tests.kafka_tools import run_verifiable_consumer
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

PARTITIONS = 6


def _records(n: int, tag: str) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(i % PARTITIONS, None, f"{tag}-{i}".encode()) for i in range(n)]


def _committed(
    bootstrap: str, topic: str, group: str, partitions: int = PARTITIONS
) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def _describe(bootstrap: str, group: str) -> Any:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return SimpleNamespace(
        state=described.state.name,
        protocol_type="consumer" if described.is_simple_consumer_group is False else "",
        members=described.members,
    )


def _listed(bootstrap: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return {g.group_id for g in admin.list_consumer_groups().result(timeout=30).valid}


def _ends(produced: list[Any]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for r in produced:
        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
    return ends


def test_three_clients_split_a_topic_and_rebalance_on_join_and_leave(kg: ThreadSidecar):
    bootstrap = kg.kafka_bootstrap
    topic = create(bootstrap, PARTITIONS, "grp")
    group = f"g-{uuid.uuid4().hex[:8]}"
    produced = produce(bootstrap, topic, _records(120, "a"))
    members: list[Member] = []
    try:
        first = Member("confluent", bootstrap, topic, group).start()
        members.append(first)
        wait_until(
            lambda: first.assigned == frozenset(range(PARTITIONS)), what="one member holds all"
        )
        others = [Member(k, bootstrap, topic, group).start() for k in ("kafka-python", "aiokafka")]
        members += others
        wait_until(lambda: split(members, PARTITIONS), what="three members split the partitions")
        described = _describe(bootstrap, group)
        assert (described.state, described.protocol_type, len(described.members)) == (
            "STABLE",
            "consumer",
            3,
        )
        assert group in _listed(bootstrap)
        produced += produce(bootstrap, topic, _records(120, "b"))
        leaving = others[0]
        leaving.stop()  # LeaveGroup: the two left take its partitions
        rest = [first, others[1]]
        wait_until(lambda: split(rest, PARTITIONS), what="two members split after a leave")
        produced += produce(bootstrap, topic, _records(120, "c"))
        wanted = {(r.partition, r.offset) for r in produced}
        wait_until(lambda: wanted <= {s for m in members for s in m.seen}, what="every record read")
        for m in rest:
            m.stop()
        ends = _ends(produced)
        assert _committed(bootstrap, topic, group) == ends
        with httpx.Client(base_url=kg.url, timeout=60) as http:
            lag = http.get(f"/v1/groups/{group}/lag")
        assert lag.status_code == 200, lag.text
        rows = {
            r["partition"]: (r["committed"], r["end"], r["lag"]) for r in lag.json()["partitions"]
        }
        assert rows == {p: (end, end, 0) for p, end in ends.items()}
        assert _describe(bootstrap, group).state == "EMPTY"
    finally:
        for m in members:
            m.halt()


def test_a_killed_member_is_expired_and_its_partitions_move(kg: ThreadSidecar):
    bootstrap = kg.kafka_bootstrap
    topic = create(bootstrap, PARTITIONS, "grk")
    group = f"g-{uuid.uuid4().hex[:8]}"
    survivor = Member("confluent", bootstrap, topic, group).start()
    wait_until(lambda: survivor.assigned == frozenset(range(PARTITIONS)), what="first member")
    victim = killable_member(bootstrap, topic, group)
    try:
        wait_until(
            lambda: 0 < len(survivor.assigned) < PARTITIONS, what="the second member's share"
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        produced = produce(bootstrap, topic, _records(60, "k"))
        wait_until(
            lambda: survivor.assigned == frozenset(range(PARTITIONS)),
            what="the survivor takes every partition back after the session",
        )
        wanted = {(r.partition, r.offset) for r in produced}
        wait_until(lambda: wanted <= set(survivor.seen), what="the survivor reads all")
    finally:
        if victim.poll() is None:
            victim.kill()
        survivor.stop()
    assert _committed(bootstrap, topic, group) == _ends(produced)


def test_a_member_keeps_its_membership_when_its_coordinator_moves_to_a_node_that_joins(
    kg: ThreadSidecar, pulsar: Any
):
    """The group's coordinator is kg alone; a node joins the cluster and takes the group's
    state partition over: the member finds it there with its membership intact, and the
    old coordinator sends it on (16)."""
    mine = kg.runtime.cluster.me.node_id
    newcomer = mine + 1
    owners = place(GROUP_LOG, kg.settings.offsets_partitions, [mine, newcomer])
    group = next(
        g
        for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(1000))
        if owners[partition_of(g, kg.settings.offsets_partitions)] == newcomer
    )
    with WireClient(kg.kafka_bootstrap) as c:
        joined = new_member(c, group, session_ms=30_000, retry=False)
        assert (joined.generation_id, joined.leader) == (1, joined.member_id)
        assert _sync(c, group, joined.member_id) == (0, b"mine")
    with ThreadSidecar(pulsar, cluster_of=kg, node_id=newcomer) as other:
        p = partition_of(group, kg.settings.offsets_partitions)
        wait_until(
            lambda: (
                p in other.runtime.cluster.owned_partitions()[GROUP_LOG]
                and p not in kg.runtime.cluster.owned_partitions()[GROUP_LOG]
            ),
            what="the newcomer to load the group's partition",
        )
        with WireClient(kg.kafka_bootstrap) as c:
            beat = c.call(
                HeartbeatRequest(
                    group_id=group,
                    generation_id=1,
                    member_id=joined.member_id,
                    group_instance_id=None,
                ),
                3,
            )
            assert beat.error_code == 16  # NOT_COORDINATOR: find the coordinator again
        with WireClient(other.kafka_bootstrap) as c2:
            _moved(other, c2, group, joined.member_id)
    # kg is the module's one-node cluster again before the next test asks it anything
    # (until then the newcomer's share answered 16 there)
    wait_until(
        lambda: (
            len(kg.runtime.cluster.owned_partitions()[GROUP_LOG]) == kg.settings.offsets_partitions
        ),
        what="kg to own every group partition again",
    )


def _sync(c: WireClient, group: str, member: str) -> tuple[int, bytes]:
    sync = c.call(
        SyncGroupRequest(
            group_id=group,
            generation_id=1,
            member_id=member,
            group_instance_id=None,
            assignments=[
                SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=b"mine")
            ],
        ),
        3,
    )
    return sync.error_code, bytes(sync.assignment)


def _moved(other: ThreadSidecar, c2: WireClient, group: str, member: str) -> None:
    """The member, at the other sidecar: its heartbeat, its assignment, its commit."""
    beat = c2.call(
        HeartbeatRequest(group_id=group, generation_id=1, member_id=member, group_instance_id=None),
        3,
    )
    assert beat.error_code == 0
    assert _sync(c2, group, member) == (0, b"mine")  # Stable: its own assignment again
    stale = c2.call(
        HeartbeatRequest(group_id=group, generation_id=0, member_id=member, group_instance_id=None),
        3,
    )
    assert stale.error_code == 22
    topic = create(other.kafka_bootstrap, 1, "grm")
    assert commit(c2, group, topic, member, 1, offset=0) == 0


def test_kafka_and_http_groups_refuse_each_other(kg: ThreadSidecar):
    kafka_group, http_group = f"k-{uuid.uuid4().hex[:8]}", f"h-{uuid.uuid4().hex[:8]}"
    topic = create(kg.kafka_bootstrap, 1, "grx")
    with httpx.Client(base_url=kg.url, timeout=60) as http, WireClient(kg.kafka_bootstrap) as c:
        joined = http.post(f"/v1/groups/{http_group}/members", json={"topics": [topic]})
        assert joined.status_code == 200, joined.text
        first = join(c, http_group, "", retry=False)
        assert first.error_code == 23
        new_member(c, kafka_group, retry=False)
        member = joined.json()["memberId"]
        refused = http.post(f"/v1/groups/{kafka_group}/members", json={"topics": [topic]})
        assert (refused.status_code, refused.json()["errorCode"]) == (409, 23)
        pull = http.post(f"/v1/groups/{kafka_group}/members/{member}/pull", json={"maxRecords": 10})
        assert (pull.status_code, pull.json()["errorCode"]) == (409, 23)
        committed = http.post(f"/v1/groups/{kafka_group}/members/{member}/commit", json={})
        assert (committed.status_code, committed.json()["errorCode"]) == (409, 23)
        # the HTTP group's members own it
        assert commit(c, http_group, topic, "", -1, offset=0) == 25


def test_kafkas_verifiable_consumer_reads_every_record_in_a_group(kg: ThreadSidecar, tmp_path):
    bootstrap = kg.kafka_bootstrap
    topic = create(bootstrap, 3, "grv")
    produced = produce(bootstrap, topic, [(i % 3, None, str(i).encode()) for i in range(300)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumed = run_verifiable_consumer(bootstrap, topic, group, tmp_path, max_messages=300)
    assert consumed.run is not None
    assert consumed.run.returncode == 0, consumed.run.stderr_tail()
    assert consumed.failed_commits == ()
    assert sorted((r.partition, r.offset, r.value) for r in consumed.records) == sorted(
        (r.partition, r.offset, r.value.decode()) for r in produced if r.value is not None
    )
    assert _committed(bootstrap, topic, group, partitions=3) == _ends(produced)
