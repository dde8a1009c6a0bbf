"""ListOffsets, OffsetCommit and OffsetFetch through the Kafka listener, request by
request and through each client's own calls (``committed()``, ``offsets_for_times``)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import TopicPartition

from tests.integration.kafka_consume import (
    confluent_consumer,
    create,
    list_offsets_request,
    offset_commit_request,
    offset_fetch_request,
    produce,
)
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def _listed(address, topic, times, version=7):
    with WireClient(address) as c:
        answer = c.call(list_offsets_request(topic, times), version)
    return [(p.error_code, p.offset, p.timestamp) for p in answer.topics[0].partitions]


def _committed(address, group, topic, partitions, version=7, **kw):
    with WireClient(address) as c:
        answer = c.call(offset_fetch_request(group, topic, partitions, **kw), version)
    return {
        (t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
        for t in answer.topics
        for p in t.partitions
    }


def _commit(address, group, topic, offsets, version=8, **kw):
    with WireClient(address) as c:
        answer = c.call(offset_commit_request(group, topic, offsets, **kw), version)
    return {p.partition_index: p.error_code for t in answer.topics for p in t.partitions}


# -- ListOffsets ----------------------------------------------------------------------------


def test_list_offsets_answers_earliest_latest_and_the_first_record_at_a_time(sidecar_kafka):
    topic = create(sidecar_kafka, 2)
    base = 1_000_000_000_000
    produce_at(sidecar_kafka, topic, [(0, base + i * 10) for i in range(6)])
    produce(sidecar_kafka, topic, [(0, b"k", b"now")] * 5, **{"batch.num.messages": 2})
    assert _listed(sidecar_kafka, topic, {0: -2, 1: -2}) == [(0, 0, -1), (0, 0, -1)]
    assert _listed(sidecar_kafka, topic, {0: -1, 1: -1}) == [(0, 11, -1), (0, 0, -1)]
    # by time: record timestamps (create time), not when Pulsar stored them
    assert _listed(sidecar_kafka, topic, {0: base + 25}) == [(0, 3, base + 30)]
    assert _listed(sidecar_kafka, topic, {0: base + 30}) == [(0, 3, base + 30)]
    assert _listed(sidecar_kafka, topic, {0: base + 51})[0][:2] == (0, 6)  # the first "now"
    assert _listed(sidecar_kafka, topic, {0: 0})[0][:2] == (0, 0)
    assert _listed(sidecar_kafka, topic, {0: int(time.time() * 1000) + 3_600_000}) == [(0, -1, -1)]
    assert _listed(sidecar_kafka, topic, {1: base}) == [(0, -1, -1)]  # empty partition


def produce_at(address, topic, stamped):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "enable.idempotence": True})
    for partition, ts in stamped:
        producer.produce(topic, value=str(ts).encode(), partition=partition, timestamp=ts)
    assert producer.flush(30) == 0


def test_list_offsets_max_timestamp_is_the_latest_record_of_the_last_batch(sidecar_kafka):
    topic = create(sidecar_kafka, 1)
    assert _listed(sidecar_kafka, topic, {0: -3}) == [(0, -1, -1)]
    produce_at(sidecar_kafka, topic, [(0, 5000), (0, 9000), (0, 7000)])
    code, offset, ts = _listed(sidecar_kafka, topic, {0: -3})[0]
    assert (code, ts) == (0, 9000)
    assert offset == 1


def test_list_offsets_of_an_unknown_topic_partition_or_a_repeated_one(sidecar_kafka):
    topic = create(sidecar_kafka, 1)
    assert _listed(sidecar_kafka, topic, {3: -1}) == [(3, -1, -1)]
    assert _listed(sidecar_kafka, "nope-" + topic, {0: -1}) == [(3, -1, -1)]
    with WireClient(sidecar_kafka) as c:
        request = list_offsets_request(topic, {0: -1})
        request.topics[0].partitions.append(request.topics[0].partitions[0])
        answer = c.call(request, 7)
    assert [p.error_code for p in answer.topics[0].partitions] == [42, 42]


def test_offsets_for_times_in_confluent_kafka_python_and_aiokafka(sidecar_kafka):
    topic = create(sidecar_kafka, 1)
    base = 1_600_000_000_000
    produce_at(sidecar_kafka, topic, [(0, base + i * 1000) for i in range(10)])
    consumer = confluent_consumer(sidecar_kafka)
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=30)
        assert found[0].offset == 5
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        assert (low, high) == (0, 10)
    finally:
        consumer.close()

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPythonTP

    kp = KafkaConsumer(bootstrap_servers=sidecar_kafka, group_id=None)
    try:
        tp = KafkaPythonTP(topic, 0)
        got = kp.offsets_for_times({tp: base + 4500})[tp]
        assert (got.offset, got.timestamp) == (5, base + 5000)
        assert kp.beginning_offsets([tp]) == {tp: 0}
        assert kp.end_offsets([tp]) == {tp: 10}
    finally:
        kp.close()

    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTP

    async def aio() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=sidecar_kafka, group_id=None)
        await consumer.start()
        try:
            tp = AioTP(topic, 0)
            got = (await consumer.offsets_for_times({tp: base + 4500}))[tp]
            assert (got.offset, got.timestamp) == (5, base + 5000)
            assert await consumer.end_offsets([tp]) == {tp: 10}
        finally:
            await consumer.stop()

    asyncio.run(aio())


# -- OffsetCommit / OffsetFetch -------------------------------------------------------------


def test_offset_fetch_of_nothing_committed_is_minus_one(sidecar_kafka):
    topic = create(sidecar_kafka, 2)
    group = _group()
    assert _committed(sidecar_kafka, group, topic, [0, 1]) == {
        (topic, 0): (-1, "", 0),
        (topic, 1): (-1, "", 0),
    }
    assert _committed(sidecar_kafka, group, None, []) == {}


def test_a_commit_is_fetched_back_with_its_metadata_at_every_version(sidecar_kafka):
    topic = create(sidecar_kafka, 2)
    group = _group()
    assert _commit(sidecar_kafka, group, topic, {0: 7, 1: 3}, metadata="m") == {0: 0, 1: 0}
    expected = {(topic, 0): (7, "m", 0), (topic, 1): (3, "m", 0)}
    for version in (1, 2, 5, 7):
        assert _committed(sidecar_kafka, group, topic, [0, 1], version=version) == expected
    assert _committed(sidecar_kafka, group, None, []) == expected  # null topics: all
    with WireClient(sidecar_kafka) as c:  # v8+: groups
        from kafka.protocol.consumer import OffsetFetchRequest

        g = OffsetFetchRequest.OffsetFetchRequestGroup
        t = g.OffsetFetchRequestTopics
        request = OffsetFetchRequest(
            groups=[
                g(
                    group_id=group,
                    member_id=None,
                    member_epoch=-1,
                    topics=[t(name=topic, partition_indexes=[1])],
                ),
                g(group_id=_group(), member_id=None, member_epoch=-1, topics=None),
            ],
            require_stable=True,
        )
        answer = c.call(request, 9)
    first, second = answer.groups
    assert [(p.partition_index, p.committed_offset) for p in first.topics[0].partitions] == [(1, 3)]
    assert (second.error_code, second.topics) == (0, [])
    for version in (2, 5, 9):
        group2 = _group()
        assert _commit(sidecar_kafka, group2, topic, {0: 11}, version=version) == {0: 0}
        assert _committed(sidecar_kafka, group2, topic, [0])[(topic, 0)][0] == 11


def test_a_commit_for_a_missing_topic_or_with_oversized_metadata_is_refused_alone(sidecar_kafka):
    topic = create(sidecar_kafka, 1)
    group = _group()
    assert _commit(sidecar_kafka, group, topic, {0: 1, 4: 1}) == {0: 0, 4: 3}
    assert _commit(sidecar_kafka, group, topic, {0: 2}, metadata="x" * 5000) == {0: 12}
    assert _committed(sidecar_kafka, group, topic, [0])[(topic, 0)][0] == 1


def test_a_generation_for_a_group_that_does_not_exist_is_refused(sidecar_kafka):
    topic = create(sidecar_kafka, 1)
    group = _group()
    assert _commit(sidecar_kafka, group, topic, {0: 1}, generation=3, member="m") == {0: 22}
    assert _commit(sidecar_kafka, group, topic, {0: 1}, generation=3, version=9) == {0: 69}
    assert _committed(sidecar_kafka, group, topic, [0])[(topic, 0)][0] == -1


def test_a_kafka_commit_never_overwrites_an_http_group_with_members(sidecar, api):
    address = sidecar.kafka_bootstrap
    topic = create(address, 1)
    group = _group()
    joined = api.post(f"/v1/groups/{group}/members", json={"topics": [topic]}).json()
    member, generation = joined["memberId"], joined["generation"]
    committed = api.post(
        f"/v1/groups/{group}/members/{member}/commit",
        json={"offsets": [{"topic": topic, "partition": 0, "offset": 5}]},
    )
    assert committed.status_code == 200, committed.text
    assert _commit(address, group, topic, {0: 99}) == {0: 25}  # no member id: unknown
    assert _commit(address, group, topic, {0: 99}, generation=generation, member="other") == {0: 25}
    assert _commit(address, group, topic, {0: 99}, generation=generation + 1, member=member) == {
        0: 22
    }
    assert _committed(address, group, topic, [0])[(topic, 0)] == (5, "", 0)
    # the member itself, at its generation: its own commit, through the group coordinator
    assert _commit(address, group, topic, {0: 6}, generation=generation, member=member) == {0: 0}
    assert _committed(address, group, topic, [0])[(topic, 0)][0] == 6
    assert api.delete(f"/v1/groups/{group}/members/{member}").status_code == 200
    assert _commit(address, group, topic, {0: 8}) == {0: 0}  # an empty group takes it
    assert _committed(address, group, topic, [0])[(topic, 0)][0] == 8


def test_offsets_pending_in_a_transaction_are_88_with_require_stable(sidecar, api):
    address = sidecar.kafka_bootstrap
    topic = create(address, 1)
    group, tid = _group(), f"tx-{uuid.uuid4().hex[:8]}"
    assert _commit(address, group, topic, {0: 4}) == {0: 0}
    init = api.post("/v1/init-producer-id", json={"transactionalId": tid}).json()
    pid, epoch = init["producerId"], init["producerEpoch"]
    staged = api.post(
        "/v1/txn-offset-commit",
        json={
            "transactionalId": tid,
            "producerId": pid,
            "producerEpoch": epoch,
            "groupId": group,
            "offsets": [{"topic": topic, "partition": 0, "offset": 9}],
        },
    ).json()
    assert staged["errorCode"] == 0, staged
    assert _committed(address, group, topic, [0], require_stable=True)[(topic, 0)] == (-1, "", 88)
    assert _committed(address, group, topic, [0])[(topic, 0)] == (4, "", 0)
    assert _committed(address, group, topic, [0], version=6)[(topic, 0)] == (4, "", 0)
    ended = api.post(
        "/v1/end-txn",
        json={"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True},
    ).json()
    assert ended["errorCode"] == 0, ended
    deadline = time.monotonic() + 30
    while _committed(address, group, topic, [0], require_stable=True)[(topic, 0)] != (9, "", 0):
        assert time.monotonic() < deadline, "the transaction's offset never became stable"
        time.sleep(0.1)


def test_commit_and_committed_in_each_client(sidecar_kafka):
    topic = create(sidecar_kafka, 2)
    group = _group()
    consumer = confluent_consumer(sidecar_kafka, **{"group.id": group})
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        consumer.commit(
            offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 1)], asynchronous=False
        )
        got = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
        assert [(t.partition, t.offset) for t in got] == [(0, 3), (1, 1)]
    finally:
        consumer.close()

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPythonTP
    from kafka.structs import OffsetAndMetadata

    kp = KafkaConsumer(bootstrap_servers=sidecar_kafka, group_id=group, enable_auto_commit=False)
    try:
        tp = KafkaPythonTP(topic, 0)
        kp.assign([tp])
        assert kp.committed(tp) == 3
        kp.commit({tp: OffsetAndMetadata(5, "kp", -1)})
        assert kp.committed(tp) == 5
    finally:
        kp.close()

    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTP

    async def aio() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=sidecar_kafka, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tp = AioTP(topic, 1)
            consumer.assign([tp])
            assert await consumer.committed(tp) == 1
            await consumer.commit({tp: 2})
            assert await consumer.committed(tp) == 2
        finally:
            await consumer.stop()

    asyncio.run(aio())
    assert _committed(sidecar_kafka, group, topic, [0, 1]) == {
        (topic, 0): (5, "kp", 0),
        (topic, 1): (2, "", 0),
    }
