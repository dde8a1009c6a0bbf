"""Produce through the Kafka listener with real clients, read back from Pulsar directly.

Every test makes its own topic; records are read back with a Pulsar reader (Fetch is
not served yet) and must be there once each, in the order produced, per partition,
at the offsets the producer was told.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import InitProducerIdRequest

from kop_dedup.protocol.records import rec
from kop_dedup.pulsar.wire import PROP_PRODUCER_ID, PROP_SEQUENCE
from tests.helpers import b64, read_all, wait_until
from tests.kafka_wire import WireClient, produce_request

pytestmark = pytest.mark.integration

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
N = 400


def _topic() -> str:
    return f"kp-{uuid.uuid4().hex[:10]}"


def _ptopic(topic: str, partition: int) -> str:
    return f"persistent://public/kafka/{topic}-partition-{partition}"


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)


def _stored(client, topic: str, partition: int, expect: int) -> list[bytes]:
    return [m.data() for m in read_all(client, _ptopic(topic, partition), expect=expect)]


def _check_partitions(reader_client, topic, delivered, partitions):
    """Each partition holds what was acknowledged, once, in order, at its offsets."""
    for p in range(partitions):
        mine = [(off, val) for part, off, val in delivered if part == p]
        stored = _stored(reader_client, topic, p, expect=len(mine))
        assert stored == [v for _, v in mine]
        assert [off for off, _ in mine] == list(range(len(mine)))


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_idempotent_producer_stores_each_record_once_in_order(
    sidecar_kafka, pulsar_reader_client, codec
):
    topic = _topic()
    _create(sidecar_kafka, topic, 2)
    producer = Producer(
        {
            "bootstrap.servers": sidecar_kafka,
            "enable.idempotence": True,
            "acks": "all",
            "max.in.flight.requests.per.connection": 5,
            "compression.type": codec,
            "linger.ms": 5,
            "batch.num.messages": 50,
        }
    )
    delivered: list[tuple[int, int, bytes]] = []
    failures: list[object] = []

    def report(err, msg):
        if err is not None:
            failures.append(err)
        else:
            delivered.append((msg.partition(), msg.offset(), msg.value()))

    for i in range(N):
        producer.produce(
            topic, f"{codec}-{i}".encode(), key=str(i % 7).encode(), on_delivery=report
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert failures == []
    assert len(delivered) == N
    _check_partitions(pulsar_reader_client, topic, delivered, 2)


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_idempotent_producer_stores_each_record_once_in_order(
    sidecar_kafka, pulsar_reader_client, codec
):
    from kafka import KafkaProducer

    topic = _topic()
    _create(sidecar_kafka, topic, 2)
    producer = KafkaProducer(
        bootstrap_servers=sidecar_kafka,
        enable_idempotence=True,
        acks="all",
        max_in_flight_requests_per_connection=5,
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
    )
    try:
        futures = [
            producer.send(topic, f"{codec}-{i}".encode(), key=str(i % 7).encode()) for i in range(N)
        ]
        producer.flush(60)
        meta = [f.get(timeout=60) for f in futures]
    finally:
        producer.close(10)
    delivered = [(m.partition, m.offset, f"{codec}-{i}".encode()) for i, m in enumerate(meta)]
    delivered.sort(key=lambda d: (d[0], d[1]))
    _check_partitions(pulsar_reader_client, topic, delivered, 2)


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_idempotent_producer_stores_each_record_once_in_order(
    sidecar_kafka, pulsar_reader_client, codec
):
    from aiokafka import AIOKafkaProducer

    topic = _topic()
    _create(sidecar_kafka, topic, 2)

    async def run() -> list[tuple[int, int, bytes]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=sidecar_kafka,
            enable_idempotence=True,
            acks="all",
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
        )
        await producer.start()
        try:
            values = [f"{codec}-{i}".encode() for i in range(N)]
            futures = [
                await producer.send(topic, v, key=str(i % 7).encode()) for i, v in enumerate(values)
            ]
            meta = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return [(m.partition, m.offset, v) for m, v in zip(meta, values, strict=True)]

    delivered = sorted(asyncio.run(run()), key=lambda d: (d[0], d[1]))
    _check_partitions(pulsar_reader_client, topic, delivered, 2)


def test_a_resent_batch_is_answered_duplicate_and_stored_once(sidecar_kafka, pulsar_reader_client):
    topic = _topic()
    _create(sidecar_kafka, topic, 1)
    with WireClient(sidecar_kafka) as c:
        init = c.call(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), 4)
        assert init.error_code == 0
        pid = init.producer_id
        records = [rec(b"a"), rec(b"b"), rec(b"c")]
        first = c.call(
            produce_request(topic, 0, records, producer_id=pid, epoch=0, base_sequence=0), 9
        )
        again = c.call(
            produce_request(topic, 0, records, producer_id=pid, epoch=0, base_sequence=0), 9
        )
    one = first.responses[0].partition_responses[0]
    two = again.responses[0].partition_responses[0]
    assert (one.error_code, one.base_offset) == (0, 0)
    assert two.error_code == 46  # DUPLICATE_SEQUENCE_NUMBER: clients count it delivered
    assert two.base_offset == 0  # one of the last 5 batches: where the original went
    messages = read_all(pulsar_reader_client, _ptopic(topic, 0), expect=3)
    assert [m.data() for m in messages] == [b"a", b"b", b"c"]
    assert {m.properties()[PROP_PRODUCER_ID] for m in messages} == {str(pid)}


def test_a_gap_in_sequences_is_answered_out_of_order(sidecar_kafka):
    topic = _topic()
    _create(sidecar_kafka, topic, 1)
    with WireClient(sidecar_kafka) as c:
        pid = c.call(
            InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1), 4
        ).producer_id
        ok = c.call(
            produce_request(topic, 0, [rec(b"a")], producer_id=pid, epoch=0, base_sequence=0), 9
        )
        gap = c.call(
            produce_request(topic, 0, [rec(b"c")], producer_id=pid, epoch=0, base_sequence=2), 9
        )
    assert ok.responses[0].partition_responses[0].error_code == 0
    assert gap.responses[0].partition_responses[0].error_code == 45


def test_a_non_idempotent_producer_is_written_without_sequences(
    sidecar_kafka, pulsar_reader_client
):
    topic = _topic()
    _create(sidecar_kafka, topic, 1)
    producer = Producer(
        {"bootstrap.servers": sidecar_kafka, "enable.idempotence": False, "acks": "1"}
    )
    for i in range(20):
        producer.produce(topic, f"plain-{i}".encode())
    assert producer.flush(60) == 0
    messages = read_all(pulsar_reader_client, _ptopic(topic, 0), expect=20)
    assert sorted(m.data() for m in messages) == sorted(f"plain-{i}".encode() for i in range(20))
    assert all(PROP_SEQUENCE not in m.properties() for m in messages)
    assert {m.properties()[PROP_PRODUCER_ID] for m in messages} == {"-1"}


def test_acks_zero_gets_no_answer_and_is_stored(sidecar_kafka, pulsar_reader_client):
    topic = _topic()
    _create(sidecar_kafka, topic, 1)
    with WireClient(sidecar_kafka) as c:
        c.send(produce_request(topic, 0, [rec(b"fire")], acks=0), 9)
        meta = c.call(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1), 4)
        # the next answer on the connection is InitProducerId's: Produce got none
        assert meta.error_code == 0
    wait_until(
        "the acks=0 record is stored",
        lambda: [m.data() for m in read_all(pulsar_reader_client, _ptopic(topic, 0))] == [b"fire"],
    )


def test_http_and_kafka_records_share_a_topic_and_its_offsets(sidecar, sidecar_kafka):
    topic = _topic()
    _create(sidecar_kafka, topic, 1)
    http = httpx.Client(base_url=sidecar.url, timeout=60)
    plain = {
        "topic": topic,
        "partition": 0,
        "producerId": -1,
        "producerEpoch": -1,
        "baseSequence": -1,
        "lastSequence": -1,
    }
    r = http.post(
        "/v1/produce",
        json={"batches": [{**plain, "records": [{"value": b64(f"http-{i}")} for i in range(3)]}]},
    )
    assert r.json()["results"][0]["errorCode"] == 0
    producer = Producer({"bootstrap.servers": sidecar_kafka, "enable.idempotence": True})
    offsets: list[int] = []
    for i in range(2):
        producer.produce(
            topic, f"kafka-{i}".encode(), on_delivery=lambda e, m: offsets.append(m.offset())
        )
        producer.flush(30)
    r = http.post(
        "/v1/produce", json={"batches": [{**plain, "records": [{"value": b64("http-3")}]}]}
    )
    assert r.json()["results"][0]["errorCode"] == 0
    assert offsets == [3, 4]
    # the group API reads the same offsets back
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert http.put(f"/v1/groups/{group}", json={"autoOffsetReset": "earliest"}).status_code == 200
    member = http.post(f"/v1/groups/{group}/members", json={"memberId": "m", "topics": [topic]})
    assert member.status_code == 200
    pulled: list[tuple[int, str]] = []
    while len(pulled) < 6:
        body = http.post(
            f"/v1/groups/{group}/members/m/pull", json={"maxRecords": 10, "waitMs": 2000}
        ).json()
        assert body["errorCode"] == 0, body
        pulled += [(r["offset"], r["value"]) for r in body["records"]]
    assert pulled == [
        (0, b64("http-0")),
        (1, b64("http-1")),
        (2, b64("http-2")),
        (3, b64("kafka-0")),
        (4, b64("kafka-1")),
        (5, b64("http-3")),
    ]
    http.close()
