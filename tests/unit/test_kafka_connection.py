"""The Kafka listener's connection and negotiation, on a stub runtime (no Pulsar):
framing, version negotiation, answers in request order, concurrency, acks=0, closing
where Kafka closes, the SASL gate, an unexpected exception."""

from __future__ import annotations

import asyncio
import io
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kafka.protocol.api_header import ResponseClassRegistry, ResponseHeader
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest

from kop_dedup import errors
from kop_dedup.produce.service import BatchResult, ProduceService
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.pulsar.naming import Naming
from kop_dedup.security.authorizer import OPEN
from kop_dedup.settings import Settings
from kop_dedup.transports.kafka.apis import API_TABLE
from kop_dedup.transports.kafka.listener import KafkaListener
from tests.kafka_wire import produce_request
from tests.unit.asgi import unjoined_cluster


class StubAdmin:
    def __init__(self) -> None:
        self.topics_ = {"slow": 1, "orders": 2}

    def known_partitions(self, topic: str) -> int | None:
        return None  # asked every time

    async def partitions(self, topic: str, *, create_with: int | None) -> int:
        if topic not in self.topics_:
            if create_with is None:
                raise errors.UnknownTopicOrPartition(f"topic {topic!r} does not exist")
            self.topics_[topic] = create_with
        return self.topics_[topic]

    async def topics(self) -> list[str]:
        return sorted(self.topics_)

    async def entry_index(self, topic: str, ledger: int, entry: int) -> tuple[int, int]:
        return entry, 1


class StubService:
    """Produce answers after the delay the first record's value names (seconds)."""

    partition_count = ProduceService.partition_count  # the real one, over StubAdmin
    _bounded = staticmethod(ProduceService._bounded)

    def __init__(self, admin: StubAdmin) -> None:
        self.admin = admin
        self.naming = Naming("public", "kafka", "kop")
        self.running = self.most = self.entries = 0
        self.fail_with: Exception | None = None

    async def produce(self, batch: KafkaBatch, deadline: float) -> BatchResult:
        if self.fail_with is not None:
            raise self.fail_with
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(float(batch.records[0].value or b"0"))
        finally:
            self.running -= 1
        self.entries += 1
        return BatchResult(batch.topic, batch.partition, None, f"7:{self.entries}:0:0")


class StubAllocator:
    def __init__(self) -> None:
        self.next = 1000

    async def allocate(self) -> int:
        self.next += 1
        return self.next


class StubRuntime:
    def __init__(self, **settings: Any) -> None:
        self.settings = Settings(kafka_listener="127.0.0.1:0", **settings)
        self.admin = StubAdmin()
        self.service = StubService(self.admin)
        self.registry = type("R", (), {"allocator": StubAllocator()})()
        self.publisher = type("P", (), {"client": None})()  # Fetch's readers: never opened here
        self.cluster = unjoined_cluster()
        self.authorizer = OPEN  # no checks, no client quotas kept


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.cid = reader, writer, 0

    async def send(self, request: Any, version: int) -> int:
        self.cid += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.cid, client_id="unit")
        self.writer.write(bytes(request.encode(header=True, framed=True)))
        await self.writer.drain()
        return self.cid

    async def frame(self) -> bytes:
        size = struct.unpack(">i", await self.reader.readexactly(4))[0]
        return await self.reader.readexactly(size)

    async def answer(self, request: Any, version: int) -> tuple[int, Any]:
        frame = await self.frame()
        cls = ResponseClassRegistry._response_class_registry[request.API_KEY]
        data = io.BytesIO(frame)
        flexible = cls.flexible_version_q(version) and request.API_KEY != 18
        header = ResponseHeader.decode(data, flexible=flexible)
        return header.correlation_id, cls.decode(frame[data.tell() :], version=version)

    async def call(self, request: Any, version: int) -> Any:
        cid = await self.send(request, version)
        got, body = await self.answer(request, version)
        assert got == cid
        return body

    async def closed(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(), 5) == b""
        except ConnectionError:
            return True


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


def run(
    test: Callable[[KafkaListener, StubRuntime, Client], Awaitable[None]], **settings: Any
) -> StubRuntime:
    runtime = StubRuntime(**settings)

    async def main() -> None:
        listener = KafkaListener(runtime)  # type: ignore[arg-type]
        await listener.start()
        reader, writer = await asyncio.open_connection(*listener.bound)
        try:
            await test(listener, runtime, Client(reader, writer))
        finally:
            writer.close()
            await listener.close()

    asyncio.run(main())
    return runtime


def _versions(v: int = 3) -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="unit", client_software_version="1.0")


def test_api_versions_is_answered_at_every_version_it_serves():
    async def test(_l, _r, c):
        for v in range(5):
            body = await c.call(_versions(), v)
            assert body.error_code == 0
            keys = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
            assert keys == {a.key: a.versions for a in API_TABLE.values() if a.advertised}

    run(test)


def test_api_versions_above_ours_gets_35_and_a_v0_body_then_the_client_goes_on():
    async def test(_l, _r, c):
        request = _versions()
        request.API_VERSION = 3
        request.with_header(correlation_id=41, client_id="unit")
        frame = bytearray(request.encode(header=True, framed=True))
        struct.pack_into(">h", frame, 6, 7)
        c.writer.write(bytes(frame))
        raw = await c.frame()
        assert struct.unpack_from(">i", raw)[0] == 41
        body = ApiVersionsResponse.decode(raw[4:], version=0)
        assert body.error_code == errors.UnsupportedVersion.errno
        assert (18, 0, 4) in {(k.api_key, k.min_version, k.max_version) for k in body.api_keys}
        assert (await c.call(_versions(), 3)).error_code == 0

    run(test)


def test_a_bad_client_software_name_is_invalid_request():
    async def test(_l, _r, c):
        await c.send(
            ApiVersionsRequest(client_software_name="-bad-", client_software_version="1"), 3
        )
        raw = await c.frame()  # header v0 (4 bytes), then a v3 body starting with its code
        # (kafka-python would decode any error as v0; Kafka answers at the asked version)
        assert struct.unpack_from(">h", raw, 4)[0] == errors.InvalidRequest.errno

    run(test)


def test_pipelined_produce_requests_run_together_and_answer_in_order():
    async def test(_l, runtime, c):
        delays = [b"0.8", b"0.6", b"0.4", b"0.2", b"0"]  # 2.0 s one after the other
        started = time.monotonic()
        sent = [await c.send(produce_request("slow", 0, [rec(d)]), 9) for d in delays]
        sent.append(await c.send(MetadataRequest(topics=None), 9))
        got = [struct.unpack_from(">i", await c.frame())[0] for _ in sent]
        assert got == sent
        # side by side (0.8 s), not one after the other (2.0 s), with room for a busy machine
        assert time.monotonic() - started < 1.8
        assert runtime.service.most == 5

    run(test)


def test_no_more_than_five_requests_of_a_connection_are_handled_at_once():
    async def test(_l, runtime, c):
        sent = [await c.send(produce_request("slow", 0, [rec(b"0.2")]), 9) for _ in range(9)]
        got = [struct.unpack_from(">i", await c.frame())[0] for _ in sent]
        assert got == sent
        assert runtime.service.most == 5

    run(test)


def test_acks_zero_gets_no_answer():
    async def test(_l, runtime, c):
        await c.send(produce_request("slow", 0, [rec(b"0")], acks=0), 9)
        body = await c.call(
            InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1), 4
        )
        assert (body.error_code, body.producer_id, body.producer_epoch) == (0, 1001, 0)
        assert runtime.service.entries == 1

    run(test)


def test_produce_answers_the_base_offset_derived_from_the_entry_before():
    async def test(listener, _r, c):
        offsets = []
        for _ in range(3):
            answer = await c.call(produce_request("slow", 0, [rec(b"0")] * 4), 9)
            offsets.append(answer.responses[0].partition_responses[0].base_offset)
        # the stub broker says entry E holds index E: the first is looked up, then derived
        assert offsets == [-2, 2, 6]
        assert (listener._shared.offsets.looked_up, listener._shared.offsets.derived) == (1, 2)

    run(test)


def test_an_unknown_api_key_closes_the_connection():
    async def test(_l, _r, c):
        c.writer.write(struct.pack(">ihhih", 10, 4242, 0, 1, -1))
        assert await c.closed()

    run(test)


def test_a_frame_over_the_limit_closes_the_connection():
    async def test(listener, _r, c):
        c.writer.write(struct.pack(">i", 4097) + b"x" * 10)
        assert await c.closed()
        await eventually(lambda: listener.stats.closed["oversized"] == 1)

    run(test, kafka_max_request_bytes=4096)


def test_a_body_that_does_not_parse_closes_the_connection():
    async def test(listener, _r, c):
        c.writer.write(struct.pack(">ihhih", 12, 3, 9, 5, -1) + b"\xff\xff")
        assert await c.closed()
        await eventually(lambda: listener.stats.closed["malformed"] == 1)

    run(test)


def test_requests_before_authentication_close_without_an_answer():
    async def test(listener, _r, c):
        assert (await c.call(_versions(), 3)).error_code == 0  # allowed before SASL
        topics = [MetadataRequest.MetadataRequestTopic(name="orders")]
        await c.send(MetadataRequest(topics=topics), 9)
        assert await c.closed()  # as Kafka: not decoded, not answered
        await eventually(lambda: listener.stats.closed["auth"] == 1)

    run(test, auth_tokens=["t0k"])


def test_an_unexpected_exception_answers_unknown_server_error_and_the_connection_goes_on():
    async def test(listener, runtime, c):
        runtime.service.fail_with = RuntimeError("boom")
        body = await c.call(produce_request("slow", 0, [rec(b"0")]), 9)
        assert body.responses[0].partition_responses[0].error_code == -1
        assert (await c.call(_versions(), 3)).error_code == 0
        assert listener.stats.requests[("Produce", "UNKNOWN_SERVER_ERROR")] == 1

    run(test)


def test_metadata_answers_this_node_as_leader_of_every_partition():
    async def test(listener, _r, c):
        body = await c.call(
            MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="orders")]), 9
        )
        broker = body.brokers[0]
        assert (broker.node_id, broker.host, broker.port) == (0, *listener.bound)
        assert [
            (p.partition_index, p.leader_id, p.isr_nodes) for p in body.topics[0].partitions
        ] == [
            (0, 0, [0]),
            (1, 0, [0]),
        ]

    run(test)


def test_a_metadata_request_that_fails_still_names_this_node():
    async def test(listener, runtime, c):
        async def unavailable() -> list[str]:
            raise errors.KafkaStorageError("the broker does not answer")

        runtime.admin.topics = unavailable
        body = await c.call(MetadataRequest(topics=None), 9)
        assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(0, *listener.bound)]
        assert body.controller_id == 0

    run(test)


def test_a_taken_address_is_refused_with_a_message_naming_the_setting():
    import socket

    import pytest

    from kop_dedup.transports.kafka.listener import ListenerError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runtime = StubRuntime()
        runtime.settings = Settings(kafka_listener=f"127.0.0.1:{port}")

        async def main() -> None:
            with pytest.raises(ListenerError, match="KOP_DEDUP_KAFKA_LISTENER"):
                await KafkaListener(runtime).start()  # type: ignore[arg-type]

        asyncio.run(main())
