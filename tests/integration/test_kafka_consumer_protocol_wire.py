"""ConsumerGroupHeartbeat and ConsumerGroupDescribe request by request, the same
requests to the reference Kafka broker and to the listener, the answers compared: the
join (a member epoch, the whole topic assigned by the topic id Metadata answers), the
epoch checks of heartbeats and commits (110, 113, 25), a describe of a consumer group
and of a classic one (69), a leave. Then what the listener refuses where Kafka would
migrate a group between protocols (documented): a classic JoinGroup into a consumer
group with members (23), a consumer heartbeat into a classic group with members (69),
and ``kafka-consumer-groups --list`` showing groups of both types."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from kop_dedup.transports.kafka.schemas import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
)
from tests.integration.kafka_consume import create
from tests.kafka_cli import GROUPS, run_tools
from tests.kafka_group_wire import delete_groups, member
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration]


def _beat(c: WireClient, group: str, member_id: str, epoch: int, **kw: Any) -> Any:
    return c.call(
        ConsumerGroupHeartbeatRequest(
            group_id=group,
            member_id=member_id,
            member_epoch=epoch,
            instance_id=None,
            rack_id=None,
            rebalance_timeout_ms=kw.get("rebalance_timeout_ms", 30_000),
            subscribed_topic_names=kw.get("topics"),
            subscribed_topic_regex=None,
            server_assignor=kw.get("assignor"),
            topic_partitions=kw.get("owned"),
        ),
        1,
    )


def _describe(c: WireClient, *groups: str) -> Any:
    return c.call(
        ConsumerGroupDescribeRequest(group_ids=list(groups), include_authorized_operations=False),
        1,
    )


def _commit(c: WireClient, group: str, topic: str, member_id: str, epoch: int) -> int:
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    p = t.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""
    )
    answer = c.call(
        OffsetCommitRequest(
            group_id=group,
            generation_id_or_member_epoch=epoch,
            member_id=member_id,
            group_instance_id=None,
            topics=[t(name=topic, partitions=[p])],
        ),
        9,
    )
    return int(answer.topics[0].partitions[0].error_code)


def _fetch(c: WireClient, group: str, topic: str, member_id: str | None, epoch: int) -> Any:
    """OffsetFetch v9 as the member: (group error, partition 0's offset), or with an
    error the topics listed."""
    g = OffsetFetchRequest.OffsetFetchRequestGroup
    asked = g(
        group_id=group,
        member_id=member_id,
        member_epoch=epoch,
        topics=[g.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])],
    )
    answer = c.call(OffsetFetchRequest(groups=[asked], require_stable=True), 9).groups[0]
    if answer.error_code:  # the topics listed with a group's error (Kafka: none)
        return answer.error_code, [(t.name, len(t.partitions)) for t in answer.topics]
    return answer.error_code, answer.topics[0].partitions[0].committed_offset


def _ready(c: WireClient, group: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if c.call(FindCoordinatorRequest(key=group, key_type=0), 2).error_code == 0:
            code = _describe(c, group).groups[0].error_code
            if code not in (14, 15, 16):
                return
        time.sleep(0.3)
    raise AssertionError(f"no coordinator for {group}")


def _settled(c: WireClient, group: str, member_id: str, epoch: int) -> int:
    """The member's epoch once a heartbeat at it answers it unchanged. Kafka may bump it
    once more after the join (a loaded reference broker computed the first target
    assignment before the new topic's partitions were in its metadata image), and the
    epoch checks below are relative to the member's current epoch."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = _beat(c, group, member_id, epoch)
        assert answer.error_code == 0, answer
        if answer.member_epoch == epoch:
            return epoch
        epoch = answer.member_epoch
        time.sleep(0.2)
    raise AssertionError(f"{group}: the member's epoch kept moving ({epoch})")


def _assigned(c: WireClient, group: str, member_id: str, epoch: int) -> tuple[int, Any]:
    """The member's settled epoch and its assignment once the assignment holds something
    (30 s at most): a loaded reference broker answered a settled epoch with an empty
    assignment, the new topic not yet in its metadata image, and assigned it later."""
    deadline = time.monotonic() + 30
    while True:
        epoch = _settled(c, group, member_id, epoch)
        settled = _describe(c, group).groups[0].members[0].assignment.topic_partitions
        if settled or time.monotonic() > deadline:
            return epoch, settled
        time.sleep(0.2)


def scenario(bootstrap: str) -> dict[str, Any]:
    topic = create(bootstrap, 2, "kip848w")
    group = f"kip848w-{uuid.uuid4().hex[:8]}"
    mid = str(uuid.uuid4())[:22]
    out: dict[str, Any] = {}
    with WireClient(bootstrap) as c:
        _ready(c, group)
        asked = MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)
        meta = c.call(MetadataRequest(topics=[asked], allow_auto_topic_creation=False), 12)
        tid = meta.topics[0].topic_id
        joined = _beat(c, group, mid, 0, topics=[topic], owned=[])
        out["join"] = (joined.error_code, joined.member_id, joined.member_epoch > 0)
        epoch, settled = _assigned(c, group, mid, joined.member_epoch)
        out["assigned"] = sorted((tp.topic_id == tid, p) for tp in settled for p in tp.partitions)
        out["beat"] = _beat(c, group, mid, epoch).error_code
        out["beat_ahead"] = _beat(c, group, mid, epoch + 1).error_code
        out["beat_unknown"] = _beat(c, group, "nobody-" + mid[:10], 5).error_code
        out["commit"] = _commit(c, group, topic, mid, epoch)
        out["commit_stale"] = _commit(c, group, topic, mid, epoch - 1)
        out["commit_ahead"] = _commit(c, group, topic, mid, epoch + 1)
        out["commit_unknown"] = _commit(c, group, topic, "nobody", epoch)
        out["fetch"] = _fetch(c, group, topic, mid, epoch)
        out["fetch_stale"] = _fetch(c, group, topic, mid, epoch - 1)
        out["fetch_unknown"] = _fetch(c, group, topic, "nobody", epoch)
        out["fetch_admin"] = _fetch(c, group, topic, None, -1)
        described = _describe(c, group).groups[0]
        out["described"] = (
            described.error_code,
            described.group_state,
            described.assignor_name,
            [(m.member_id, m.member_epoch, m.subscribed_topic_names) for m in described.members],
            [
                (tp.topic_name, tp.topic_id == tid, sorted(tp.partitions))
                for tp in described.members[0].assignment.topic_partitions
            ],
        )
        out["unknown_described"] = _describe(c, f"none-{uuid.uuid4().hex[:8]}").groups[0].error_code
        classic_view = c.call(
            DescribeGroupsRequest(groups=[group], include_authorized_operations=False), 5
        ).groups[0]
        out["describe_groups"] = (
            classic_view.error_code,
            classic_view.group_state,
            classic_view.protocol_type,
            classic_view.protocol_data,
            len(classic_view.members),
        )
        out["delete_live"] = delete_groups(c, group)
        left = _beat(c, group, mid, -1)
        out["leave"] = (left.error_code, left.member_epoch)
        out["after_leave"] = _describe(c, group).groups[0].group_state
        out["delete_empty"] = delete_groups(c, group)
        out["after_delete"] = _describe(c, group).groups[0].error_code
    return out


def test_consumer_group_heartbeat_and_describe_answer_as_kafka(
    sidecar_kafka: str, kafka_reference: Any
) -> None:
    ours, theirs = scenario(sidecar_kafka), scenario(kafka_reference.bootstrap)
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    assert theirs["beat_ahead"] == 110
    assert theirs["commit_stale"] == 113
    assert theirs["delete_live"] == [68]
    for k in theirs:
        if k in ("join", "described"):
            continue
        assert ours[k] == theirs[k], k
    # the member ids are each run's own; the rest as Kafka
    assert ours["join"][0::2] == theirs["join"][0::2]
    assert ours["described"][:3] == theirs["described"][:3]
    # a member epoch is the server's own count: Kafka may bump it once more after the
    # join (a refresh of the subscribed topics' metadata), so it is compared as positive
    assert [(m[1] > 0, len(m[2])) for m in ours["described"][3]] == [
        (m[1] > 0, len(m[2])) for m in theirs["described"][3]
    ]
    assert [(t[1], t[2]) for t in ours["described"][4]] == [
        (t[1], t[2]) for t in theirs["described"][4]
    ]


def test_one_group_id_one_protocol_and_both_listed(sidecar_kafka: str, tmp_path: Path) -> None:
    topic = create(sidecar_kafka, 1, "kip848p")
    consumer_group, classic_group = (f"kip848p-{uuid.uuid4().hex[:8]}" for _ in range(2))
    mid = str(uuid.uuid4())[:22]
    with WireClient(sidecar_kafka) as c:
        assert _beat(c, consumer_group, mid, 0, topics=[topic], owned=[]).error_code == 0
        member(c, classic_group)  # a classic group with a member
        from tests.kafka_group_wire import join

        assert join(c, consumer_group, "").error_code == 23  # INCONSISTENT_GROUP_PROTOCOL
        refused = _beat(c, classic_group, str(uuid.uuid4())[:22], 0, topics=[topic], owned=[])
        assert refused.error_code == 69  # GROUP_ID_NOT_FOUND: not a consumer group
        assert _describe(c, classic_group).groups[0].error_code == 69
        s = ["--bootstrap-server", sidecar_kafka]
        listed, described = run_tools(
            [
                (GROUPS, [*s, "--list", "--type"]),
                (GROUPS, [*s, "--describe", "--group", classic_group, "--state"]),
            ],
            tmp_path,
        )
        rows = {line.split()[0]: line.split()[1:] for line in listed.lines if line.strip()}
        assert [t.lower() for t in rows[consumer_group][:1]] == ["consumer"], listed.text
        assert [t.lower() for t in rows[classic_group][:1]] == ["classic"], listed.text
        assert any(line.startswith(classic_group) for line in described.lines), described.text
        # the member leaves: the empty consumer group becomes classic with its next member
        assert _beat(c, consumer_group, mid, -1).error_code == 0
        assert member(c, consumer_group).error_code == 0


@pytest.mark.parametrize("name", [None, ""], ids=["librdkafka", "java"])
def test_metadata_names_a_topic_asked_by_its_id(sidecar_kafka: str, name: str | None) -> None:
    """The KIP-848 consumers ask Metadata for their assignment's topics by id, librdkafka
    with null names, Kafka's Java consumer (``MetadataRequest.Builder.forTopicIds``) with
    empty ones: any nonzero id makes it a request by id, names ignored, as Kafka serves
    it; an unknown id is 100 UNKNOWN_TOPIC_ID with the id."""
    topic = create(sidecar_kafka, 2, "kip848id")
    t = MetadataRequest.MetadataRequestTopic
    with WireClient(sidecar_kafka) as c:
        by_name = c.call(MetadataRequest(topics=[t(name=topic, topic_id=None)]), 12).topics[0]
        nobody = uuid.uuid4()
        asked = [t(name=name, topic_id=by_name.topic_id), t(name=name, topic_id=nobody)]
        got = c.call(MetadataRequest(topics=asked, allow_auto_topic_creation=False), 12).topics
    assert by_name.topic_id.int != 0
    answered = {x.topic_id: x for x in got}
    assert len(got) == 2, got
    mine = answered[by_name.topic_id]
    assert (mine.error_code, mine.name, len(mine.partitions)) == (0, topic, 2)
    assert (answered[nobody].error_code, answered[nobody].name) == (100, None)


def test_confluent_kafka_consumers_of_the_consumer_protocol_share_a_topic(
    sidecar_kafka: str,
) -> None:
    """librdkafka (confluent-kafka 2.16) with group.protocol=consumer: two consumers of
    one group split a 4-partition topic and read every record once between them."""
    from confluent_kafka import Consumer, Producer

    topic = create(sidecar_kafka, 4, "kip848c")
    group = f"kip848c-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": sidecar_kafka})
    for n in range(40):
        p.produce(topic, value=str(n).encode(), partition=n % 4)
    assert p.flush(30) == 0
    conf = {
        "bootstrap.servers": sidecar_kafka,
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
    }
    consumers = [Consumer(conf), Consumer(conf)]
    seen: list[bytes] = []
    try:
        for c in consumers:
            c.subscribe([topic])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for c in consumers:
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    seen.append(m.value())
            sizes = [len(c.assignment()) for c in consumers]
            if len(seen) >= 40 and sizes == [2, 2]:
                break
        assert sizes == [2, 2], sizes
        assert sorted(seen) == sorted(str(n).encode() for n in range(40))
    finally:
        for c in consumers:
            c.close()


def test_http_groups_and_consumer_protocol_groups_refuse_each_other(
    sidecar: Any, sidecar_kafka: str
) -> None:
    import httpx

    topic = create(sidecar_kafka, 1, "kip848h")
    consumer_group, http_group = (f"kip848h-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with httpx.Client(base_url=sidecar.url, timeout=60) as http, WireClient(sidecar_kafka) as c:
        joined = http.post(f"/v1/groups/{http_group}/members", json={"topics": [topic]})
        assert joined.status_code == 200, joined.text
        refused = _beat(c, http_group, str(uuid.uuid4())[:22], 0, topics=[topic], owned=[])
        assert refused.error_code == 69  # not a consumer group
        assert (
            _beat(c, consumer_group, str(uuid.uuid4())[:22], 0, topics=[topic], owned=[]).error_code
            == 0
        )
        taken = http.post(f"/v1/groups/{consumer_group}/members", json={"topics": [topic]})
        assert (taken.status_code, taken.json()["errorCode"]) == (409, 23), taken.text


def test_server_side_reset_of_a_consumer_protocol_group_waits_for_no_members(
    sidecar: Any, sidecar_kafka: str
) -> None:
    """With members it is refused (68: they would commit over it); once they left, the
    reset is the group's committed offset, which its next member fetches."""
    import httpx
    from confluent_kafka import Producer

    topic = create(sidecar_kafka, 1, "kip848r")
    group = f"kip848r-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": sidecar_kafka})
    for n in range(3):
        producer.produce(topic, value=str(n).encode(), partition=0)
    assert producer.flush(30) == 0
    mid = str(uuid.uuid4())[:22]
    with httpx.Client(base_url=sidecar.url, timeout=60) as http, WireClient(sidecar_kafka) as c:
        joined = _beat(c, group, mid, 0, topics=[topic], owned=[])
        assert joined.error_code == 0
        assert _commit(c, group, topic, mid, joined.member_epoch) == 0
        body = {"topic": topic, "to": "offset", "value": 0}
        refused = http.post(f"/v1/groups/{group}/reset", json=body)
        assert refused.json().get("errorCode") == 68, refused.text
        assert _beat(c, group, mid, -1).error_code == 0
        reset = http.post(f"/v1/groups/{group}/reset", json={**body, "value": 2})
        assert reset.status_code == 200, reset.text
        assert _fetch(c, group, topic, None, -1) == (0, 2)  # was 0, committed by the member
