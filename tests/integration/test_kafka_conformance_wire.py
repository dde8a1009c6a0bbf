"""Kafka itself as the oracle for the listener's answers to bad input: the same request,
sent with a bare wire client to the reference broker and to the sidecar, gets the same
error code (or the same closed connection)."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from kop_dedup.protocol.records import rec
from kop_dedup.transports.kafka.batches import build_batch
from tests.kafka_conformance import Target
from tests.kafka_wire import WireClient, produce_request

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _produce_code(target: Target, request, version: int = 9) -> int:
    with WireClient(target.bootstrap) as c:
        return c.call(request, version).responses[0].partition_responses[0].error_code


def _codes(conformance, scenario) -> None:
    kafka, sidecar = conformance
    assert scenario(kafka) == scenario(sidecar)


def test_metadata_for_unknown_and_invalid_topics_without_auto_creation(conformance):
    def scenario(target: Target) -> list[int]:
        names = [target.unique("missing"), "no/such", "a" * 250]
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names],
            allow_auto_topic_creation=False,
        )
        with WireClient(target.bootstrap) as c:
            answer = c.call(request, 9)
        return [t.error_code for t in sorted(answer.topics, key=lambda t: names.index(t.name))]

    _codes(conformance, scenario)


def test_produce_to_a_missing_partition_or_topic(conformance):
    def scenario(target: Target) -> list[int]:
        topic = target.create_topic(partitions=1)
        return [
            _produce_code(target, produce_request(topic, 3, [rec(b"x")])),
            _produce_code(target, produce_request(target.unique("absent"), 0, [rec(b"x")])),
        ]

    _codes(conformance, scenario)


def test_an_oversized_record_is_message_too_large(conformance):
    def scenario(target: Target) -> int:
        topic = target.create_topic(partitions=1)
        return _produce_code(target, produce_request(topic, 0, [rec(b"x" * 1_200_000)]))

    _codes(conformance, scenario)


def test_a_corrupt_batch_and_a_magic_1_batch(conformance):
    def scenario(target: Target) -> list[int]:
        topic = target.create_topic(partitions=1)
        crc = bytearray(build_batch([rec(b"hello")]))
        crc[-1] ^= 0xFF
        magic = bytearray(build_batch([rec(b"hello")]))
        magic[16] = 1
        return [
            _produce_code(target, produce_request(topic, 0, [], raw=bytes(crc))),
            _produce_code(target, produce_request(topic, 0, [], raw=bytes(magic))),
        ]

    _codes(conformance, scenario)


def test_invalid_required_acks(conformance):
    def scenario(target: Target) -> int:
        topic = target.create_topic(partitions=1)
        return _produce_code(target, produce_request(topic, 0, [rec(b"x")], acks=5))

    _codes(conformance, scenario)


def test_api_versions_above_the_brokers_answers_35_in_a_v0_body(conformance):
    def scenario(target: Target) -> tuple[int, bool]:
        request = ApiVersionsRequest(client_software_name="c", client_software_version="1")
        request.API_VERSION = 3
        request.with_header(correlation_id=5, client_id="c")
        frame = bytearray(request.encode(header=True, framed=True))
        struct.pack_into(">h", frame, 6, 99)
        with WireClient(target.bootstrap) as c:
            c.send_bytes(bytes(frame))
            answer = c.receive_frame()
        body = ApiVersionsResponse.decode(answer[4:], version=0)
        listed = {k.api_key for k in body.api_keys}
        return body.error_code, 18 in listed

    _codes(conformance, scenario)


def test_an_unknown_api_key_and_produce_v2_close_the_connection(conformance):
    def scenario(target: Target) -> list[bool]:
        closed = []
        with WireClient(target.bootstrap) as c:
            c.send_bytes(struct.pack(">ihhih", 10, 999, 0, 1, -1))
            closed.append(c.closed_by_peer())
        topic = target.create_topic(partitions=1)
        request = produce_request(topic, 0, [rec(b"x")])
        request.API_VERSION = 3
        request.with_header(correlation_id=1, client_id="c")
        frame = bytearray(request.encode(header=True, framed=True))
        struct.pack_into(">h", frame, 6, 2)
        with WireClient(target.bootstrap) as c:
            c.send_bytes(bytes(frame))
            closed.append(c.closed_by_peer())
        return closed

    _codes(conformance, scenario)


def test_a_produce_naming_a_partition_twice_is_answered_as_kafka_answers(conformance):
    # one partition's data twice in one request (and its topic twice): a client never
    # sends it; a hostile one had both gathered, decoded and inflated. Kafka produces
    # the data named last, once, and answers each partition once
    def scenario(target: Target) -> list[object]:
        topic = target.create_topic(partitions=2)
        target.produce(topic, [(0, None, b"warm"), (1, None, b"warm")])  # both have leaders
        data = ProduceRequest.TopicProduceData
        part = data.PartitionProduceData
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=30000,
            topic_data=[
                data(
                    name=topic,
                    partition_data=[
                        part(index=0, records=build_batch([rec(b"first")])),
                        part(index=1, records=build_batch([rec(b"one")])),
                        part(index=0, records=build_batch([rec(b"second")])),
                    ],
                ),
                data(name=topic, partition_data=[part(index=1, records=build_batch([rec(b"x")]))]),
            ],
        )
        with WireClient(target.bootstrap) as c:
            answer = c.call(request, 9)
        answered = sorted(  # Kafka answers its map's order
            (t.name == topic, p.index, p.error_code, p.base_offset)
            for t in answer.responses
            for p in t.partition_responses
        )
        stored = {p: [r.value for r in rs] for p, rs in target.read(topic, 2).items()}
        return [answered, stored]

    _codes(conformance, scenario)
