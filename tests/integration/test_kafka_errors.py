"""Bad input on the Kafka listener gets what a Kafka broker gives: a code in a valid
answer, or a closed connection where Kafka closes; other connections never notice."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest

from kop_dedup.protocol.records import rec
from kop_dedup.transports.kafka.batches import build_batch
from tests.integration.kafka_consume import fetch_request
from tests.kafka_wire import WireClient, produce_request

pytestmark = pytest.mark.integration
_T = CreateTopicsRequest.CreatableTopic


def _topic() -> str:
    return f"ke-{uuid.uuid4().hex[:10]}"


def _created(bootstrap: str, partitions: int = 1) -> str:
    topic = _topic()
    with WireClient(bootstrap) as c:
        answer = c.call(
            CreateTopicsRequest(
                topics=[
                    _T(
                        name=topic,
                        num_partitions=partitions,
                        replication_factor=1,
                        assignments=[],
                        configs=[],
                    )
                ],
                timeout_ms=30000,
                validate_only=False,
            ),
            5,
        )
    assert answer.topics[0].error_code == 0
    return topic


def _produce_code(bootstrap: str, request, version: int = 9) -> int:
    with WireClient(bootstrap) as c:
        return c.call(request, version).responses[0].partition_responses[0].error_code


def _still_serves(bootstrap: str) -> None:
    with WireClient(bootstrap) as c:
        assert (
            c.call(
                ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3
            ).error_code
            == 0
        )


def test_api_versions_at_an_unknown_version_answers_35_with_a_v0_body(sidecar_kafka):
    with WireClient(sidecar_kafka) as c:
        request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        request.API_VERSION = 3
        request.with_header(correlation_id=7, client_id="t")
        frame = bytearray(request.encode(header=True, framed=True))
        struct.pack_into(">h", frame, 6, 9)  # the header says ApiVersions v9
        c.send_bytes(bytes(frame))
        answer = c.receive_frame()
    (correlation,) = struct.unpack_from(">i", answer)
    body = ApiVersionsResponse.decode(answer[4:], version=0)
    assert correlation == 7
    assert body.error_code == 35
    keys = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert keys[18] == (0, 4)
    assert keys[0] == (0, 12)  # Produce 0..12 advertised (KAFKA-18659)
    assert keys[1][0] == 4  # Fetch >= 4: librdkafka's idempotence gate


def test_unknown_api_key_closes_that_connection_only(sidecar_kafka):
    with WireClient(sidecar_kafka) as other, WireClient(sidecar_kafka) as c:
        c.send_bytes(struct.pack(">ihhih", 10, 999, 0, 1, -1))
        assert c.closed_by_peer()
        assert len(other.call(MetadataRequest(topics=[]), 1).brokers) == 1  # still served


def test_produce_below_v3_closes_the_connection_as_kafka_4_does(sidecar_kafka):
    topic = _created(sidecar_kafka)
    with WireClient(sidecar_kafka) as c:
        request = produce_request(topic, 0, [rec(b"x")])
        request.API_VERSION = 3
        request.with_header(correlation_id=1, client_id="t")
        frame = bytearray(request.encode(header=True, framed=True))
        struct.pack_into(">h", frame, 6, 2)
        c.send_bytes(bytes(frame))
        assert c.closed_by_peer()
    _still_serves(sidecar_kafka)


def test_a_frame_over_the_limit_closes_the_connection(sidecar, sidecar_kafka):
    limit = sidecar.settings.kafka_max_request_bytes
    with WireClient(sidecar_kafka) as c:
        c.send_bytes(struct.pack(">i", limit + 1) + b"\0" * 16)
        assert c.closed_by_peer()
    _still_serves(sidecar_kafka)


def test_a_batch_with_a_bad_crc_is_corrupt_message(sidecar_kafka):
    topic = _created(sidecar_kafka)
    data = bytearray(build_batch([rec(b"hello")]))
    data[-1] ^= 0xFF
    assert _produce_code(sidecar_kafka, produce_request(topic, 0, [], raw=bytes(data))) == 2


def test_a_magic_1_message_set_is_invalid_record(sidecar_kafka):
    topic = _created(sidecar_kafka)
    data = bytearray(build_batch([rec(b"hello")]))
    data[16] = 1  # magic
    assert _produce_code(sidecar_kafka, produce_request(topic, 0, [], raw=bytes(data))) == 87


def test_two_batches_in_one_partition_are_invalid_record(sidecar_kafka):
    topic = _created(sidecar_kafka)
    one = build_batch([rec(b"a")])
    assert _produce_code(sidecar_kafka, produce_request(topic, 0, [], raw=one + one)) == 87


def test_zstd_below_produce_v7_is_unsupported_compression(sidecar_kafka):
    topic = _created(sidecar_kafka)
    request = produce_request(topic, 0, [rec(b"z" * 100)], codec="zstd")
    assert _produce_code(sidecar_kafka, request, version=6) == 76


def test_produce_to_a_missing_topic_or_partition_is_unknown_and_creates_nothing(sidecar_kafka):
    topic = _created(sidecar_kafka, partitions=2)
    assert _produce_code(sidecar_kafka, produce_request(topic, 2, [rec(b"x")])) == 3
    missing = _topic()
    assert _produce_code(sidecar_kafka, produce_request(missing, 0, [rec(b"x")])) == 3
    assert _produce_code(sidecar_kafka, produce_request("bad-partition-1", 0, [rec(b"x")])) == 3
    with WireClient(sidecar_kafka) as c:
        meta = c.call(
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=missing)],
                allow_auto_topic_creation=False,
            ),
            9,
        )
    assert meta.topics[0].error_code == 3


def test_acks_other_than_minus_one_zero_one_is_invalid_required_acks(sidecar_kafka):
    topic = _created(sidecar_kafka)
    assert _produce_code(sidecar_kafka, produce_request(topic, 0, [rec(b"x")], acks=2)) == 21


def test_a_failed_acks_zero_produce_closes_the_connection(sidecar_kafka):
    with WireClient(sidecar_kafka) as c:
        c.send(produce_request(_topic(), 0, [rec(b"x")], acks=0), 9)
        assert c.closed_by_peer()
    _still_serves(sidecar_kafka)


def test_transactional_batches_without_the_requests_transactional_id_are_53(sidecar_kafka):
    topic = _created(sidecar_kafka)
    raw = build_batch(
        [rec(b"t")], producer_id=5, producer_epoch=0, base_sequence=0, transactional=True
    )
    assert _produce_code(sidecar_kafka, produce_request(topic, 0, [], raw=raw)) == 53


def test_fetch_is_advertised_and_served(sidecar_kafka):
    topic = _created(sidecar_kafka)
    request = fetch_request(topic, {0: 0}, max_wait_ms=10, max_bytes=1 << 20, isolation_level=1)
    with WireClient(sidecar_kafka) as c:
        answer = c.call(request, 11)
    assert answer.error_code == 0
    part = answer.responses[0].partitions[0]
    assert (part.error_code, part.high_watermark, part.records) == (0, 0, b"")


def test_create_and_delete_topics_answer_as_kafka(sidecar_kafka):
    topic = _created(sidecar_kafka, partitions=3)
    with WireClient(sidecar_kafka) as c:
        again = c.call(
            CreateTopicsRequest(
                topics=[
                    _T(
                        name=topic,
                        num_partitions=1,
                        replication_factor=1,
                        assignments=[],
                        configs=[],
                    ),
                    _T(
                        name=_topic(),
                        num_partitions=0,
                        replication_factor=1,
                        assignments=[],
                        configs=[],
                    ),
                    _T(
                        name="no/slash",
                        num_partitions=1,
                        replication_factor=1,
                        assignments=[],
                        configs=[],
                    ),
                ],
                timeout_ms=30000,
                validate_only=False,
            ),
            5,
        )
        assert [t.error_code for t in again.topics] == [36, 37, 17]
        meta = c.call(
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                allow_auto_topic_creation=False,
            ),
            9,
        )
        assert len(meta.topics[0].partitions) == 3
        deleted = c.call(DeleteTopicsRequest(topic_names=[topic, _topic()], timeout_ms=30000), 4)
        assert [r.error_code for r in deleted.responses] == [0, 3]
        gone = c.call(
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                allow_auto_topic_creation=False,
            ),
            9,
        )
        assert gone.topics[0].error_code == 3


def test_answers_leave_in_request_order_when_requests_are_pipelined(sidecar_kafka):
    topic = _created(sidecar_kafka)
    with WireClient(sidecar_kafka) as c:
        sent = [
            c.send(produce_request(topic, 0, [rec(f"r{i}".encode())] * 50), 9) for i in range(5)
        ]
        sent.append(c.send(MetadataRequest(topics=[]), 1))
        got = [struct.unpack_from(">i", c.receive_frame())[0] for _ in sent]
    assert got == sent
