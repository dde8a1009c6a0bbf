"""DeleteGroups and OffsetDelete: Kafka itself as the oracle for their codes (the same
requests to the reference broker and to the sidecar), then Kafka's admin clients
against two sidecars (a group deleted through one has no offsets through the other),
and an HTTP group (non-empty while it has members)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import LeaveGroupRequest

from kop_dedup.protocol.groups.deletion import subscription
from tests.helpers import wait_until
from tests.integration.kafka_consume import create
from tests.kafka_conformance import Target
from tests.kafka_group_wire import commit, committed, delete_groups, member, offset_delete, sync
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _leave(c: WireClient, group: str, member_id: str) -> int:
    identity = LeaveGroupRequest.MemberIdentity(
        member_id=member_id, group_instance_id=None, reason=None
    )
    answer = c.call(LeaveGroupRequest(group_id=group, members=[identity]), 5)
    return int(answer.error_code or answer.members[0].error_code)


def _emptied(c: WireClient, group: str) -> str:
    """The group's state once it is Empty (AssertionError after 10 s). Kafka empties a
    group its last member left a moment after answering the LeaveGroup (the join phase
    completes on a timer): until then the member's topics still count as subscribed."""

    def state() -> str:
        request = DescribeGroupsRequest(groups=[group], include_authorized_operations=False)
        return str(c.call(request, 3).groups[0].group_state)

    return wait_until(f"{group} Empty", lambda: (s := state()) == "Empty" and s, timeout=10)


def _codes(conformance: tuple[Target, Target], scenario: Any) -> None:
    kafka, sidecar = conformance
    assert scenario(kafka) == scenario(sidecar)


def test_delete_groups_answers_as_kafka(conformance):
    """68 while a member is in, 0 once it left (its offsets go) and for a group of plain
    commits, 69 for a group never seen and for one deleted already."""

    def scenario(target: Target) -> list[Any]:
        group, simple = target.unique("g"), target.unique("g")
        topic = target.create_topic(partitions=1)
        with WireClient(target.bootstrap) as c:
            me = member(c, group)
            gen = me.generation_id
            codes = [sync(c, group, me.member_id, gen), commit(c, group, topic, me.member_id, gen)]
            codes += delete_groups(c, group)
            codes.append(_leave(c, group, me.member_id))
            codes.append(_emptied(c, group))
            codes.append(commit(c, simple, topic, "", -1))
            codes += delete_groups(c, group, simple, target.unique("none"))
            codes += committed(c, group, topic) + committed(c, simple, topic)
            codes += delete_groups(c, group, "")
        return codes

    _codes(conformance, scenario)


def test_offset_delete_answers_as_kafka(conformance):
    """86 for a topic a member subscribes to, 0 (offset gone) for the others; 69 for an
    unknown group, 24 for "", 68 for a group of another protocol type with members;
    once the member left, its topic's offsets go too."""

    def scenario(target: Target) -> list[Any]:
        group, connect = target.unique("g"), target.unique("g")
        mine, other = target.create_topic(partitions=1), target.create_topic(partitions=1)
        with WireClient(target.bootstrap) as c:
            me = member(c, group, metadata=subscription([mine]))
            gen = me.generation_id
            out: list[Any] = [sync(c, group, me.member_id, gen)]
            out += [commit(c, group, t, me.member_id, gen) for t in (mine, other)]
            top, parts = offset_delete(c, group, {mine: [0], other: [0, 1]})
            out += [top, parts[mine, 0], parts[other, 0], parts[other, 1]]
            out += committed(c, group, mine) + committed(c, group, other)
            out.append(offset_delete(c, target.unique("none"), {other: [0]})[0])
            out.append(offset_delete(c, "", {other: [0]})[0])
            worker = member(c, connect, ptype="connect")
            out.append(sync(c, connect, worker.member_id, worker.generation_id))
            out.append(offset_delete(c, connect, {other: [0]})[0])
            out.append(_leave(c, group, me.member_id))
            out.append(_emptied(c, group))
            out.append(offset_delete(c, group, {mine: [0]})[1][mine, 0])
            out += committed(c, group, mine)
        return out

    _codes(conformance, scenario)


@pytest.fixture(scope="module")
def other(pulsar: Any, sidecar: ThreadSidecar) -> Iterator[ThreadSidecar]:
    """A second node of the session sidecar's cluster (the group store is shared)."""
    with ThreadSidecar(pulsar, cluster_of=sidecar) as sc:
        yield sc


def _consume_and_commit(bootstrap: str, topic: str, group: str) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, 5) for p in range(2)], asynchronous=False)
    finally:
        c.close()


def _committed(bootstrap: str, topic: str, group: str) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        return [tp.offset for tp in got]
    finally:
        c.close()


def test_admin_clients_delete_groups_and_offsets_seen_from_another_sidecar(
    sidecar: ThreadSidecar, other: ThreadSidecar
):
    here, there = sidecar.kafka_bootstrap, other.kafka_bootstrap
    topic = create(here, 2, "gdel")
    cluster = other.runtime.cluster  # the raw OffsetFetch below goes to the coordinator
    deleted = next(
        g
        for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(1000))
        if cluster.is_me(cluster.group_coordinator(g))
    )
    trimmed = f"g-{uuid.uuid4().hex[:8]}"
    for group in (deleted, trimmed):
        _consume_and_commit(here, topic, group)
        assert _committed(there, topic, group) == [5, 5]

    admin = AdminClient({"bootstrap.servers": here})
    admin.delete_consumer_groups([deleted], request_timeout=30)[deleted].result(timeout=30)
    assert _committed(there, topic, deleted) == [-1001, -1001]  # librdkafka: no offset
    with WireClient(there) as c:
        assert committed(c, deleted, topic, 2) == [-1, -1]
        assert delete_groups(c, deleted) == [69]

    kadmin = KafkaAdminClient(bootstrap_servers=there)
    try:
        answer = kadmin.delete_group_offsets(trimmed, [KafkaTopicPartition(topic, 1)])
        assert {tp.partition: e.errno for tp, e in answer.items()} == {1: 0}
        assert kadmin.delete_groups([trimmed]) == {trimmed: "OK"}
    finally:
        kadmin.close()


def test_an_http_group_is_deleted_once_its_members_left(sidecar: ThreadSidecar):
    cluster = sidecar.runtime.cluster  # the wire requests go to the group's coordinator
    group = next(
        g
        for g in (f"h-{uuid.uuid4().hex[:8]}" for _ in range(1000))
        if cluster.is_me(cluster.group_coordinator(g))
    )
    topic = create(sidecar.kafka_bootstrap, 1, "gdh")
    with (
        httpx.Client(base_url=sidecar.url, timeout=60) as http,
        WireClient(sidecar.kafka_bootstrap) as c,
    ):
        joined = http.post(f"/v1/groups/{group}/members", json={"topics": [topic]})
        assert joined.status_code == 200, joined.text
        member_id = joined.json()["memberId"]
        committed_now = http.post(
            f"/v1/groups/{group}/members/{member_id}/commit",
            json={"offsets": [{"topic": topic, "partition": 0, "offset": 0}]},
        )
        assert committed_now.status_code == 200, committed_now.text
        assert delete_groups(c, group) == [68]
        assert offset_delete(c, group, {topic: [0]}) == (0, {(topic, 0): 86})
        assert http.delete(f"/v1/groups/{group}/members/{member_id}").status_code == 200
        assert delete_groups(c, group) == [0]
        assert http.get(f"/v1/groups/{group}").status_code == 404
        assert committed(c, group, topic) == [-1]
