"""Fuzz the Kafka listener: random frames, truncated frames, random bodies after valid
headers, mutated record batches. Nothing crashes, nothing leaks (connections, file
descriptors, tasks), and a well-behaved client is served throughout.

The counts are fixed and the generator seeded (``KOP_DEDUP_FUZZ_SEED`` changes it), so
a failure can be replayed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import struct
import uuid
from collections.abc import Iterator

import psutil
import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kop_dedup.protocol.records import rec
from tests.helpers import uniq, wait_until
from tests.kafka_wire import WireClient, produce_request
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("KOP_DEDUP_FUZZ_SEED", "1807"))
RANDOM_FRAMES = 300
TRUNCATED_FRAMES = 200
RANDOM_BODIES = 400
MUTATED_BATCHES = 300
AUTH_SHARE = 2  # with authentication on, half as many of each (the suite's time budget)
# APIs whose random bodies cannot change what other tests see (no topic creation or
# deletion, no config, partition or log start change): auto-creation is off on the
# fuzzed sidecar; Create/DeleteTopics, the alters, CreatePartitions and DeleteRecords are
# left out, the admin reads (ListOffsets, OffsetForLeaderEpoch, DescribeConfigs,
# DescribeCluster, DescribeProducers, DescribeTransactions, ListTransactions) are in
_SAFE_KEYS = (0, 1, 2, 3, 10, 17, 18, 22, 23, 24, 25, 26, 28, 32, 36, 60, 61, 65, 66)


TOKEN = "fuzz-token"
AUTH = b"\0fuzz\0" + TOKEN.encode()


@pytest.fixture(scope="module", params=["auth-off", "auth-on"])
def fuzzed(pulsar, request) -> Iterator[ThreadSidecar]:
    """The listener without authentication, and with it: then half of each kind of
    input comes before authentication (closed unread past 512 KiB, undecoded unless
    ApiVersions or SASL) and half after it (decoded as with authentication off)."""
    tokens = [TOKEN] if request.param == "auth-on" else []
    with ThreadSidecar(
        pulsar,
        system_namespace=uniq("sys"),
        kafka_auto_create_topics=False,
        kafka_max_request_bytes=1 << 20,
        kafka_request_read_timeout_ms=2_000,
        auth_tokens=tokens,
    ) as sc:
        yield sc


def _auth_on(sc: ThreadSidecar) -> bool:
    return bool(sc.settings.http_tokens())


def _sasl_frames() -> bytes:
    """SaslHandshake v1 and SaslAuthenticate v1 with the token, framed."""
    out = b""
    for i, (request, version) in enumerate(
        (
            (SaslHandshakeRequest(mechanism="PLAIN"), 1),
            (SaslAuthenticateRequest(auth_bytes=AUTH), 1),
        )
    ):
        request.API_VERSION = version
        request.with_header(correlation_id=1_000_000 + i, client_id="fuzz")
        out += bytes(request.encode(header=True, framed=True))
    return out


def _authenticated(sock: socket.socket) -> bool:
    """Authenticate ``sock``; whether the listener said yes."""
    sock.sendall(_sasl_frames())
    for _ in range(2):  # the two answers; the second carries the verdict
        head = _recv_exactly(sock, 4)
        body = _recv_exactly(sock, struct.unpack(">i", head)[0])
    return body[4:6] == b"\x00\x00"  # SaslAuthenticate v1: correlation id, error code


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _tasks(sc: ThreadSidecar) -> int:
    async def count() -> int:
        return len(asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(count(), sc.kafka.loop).result(10)


def _send_and_close(address: str, data: bytes, read: bool, authenticate: bool = False) -> None:
    """Send ``data`` (after SASL, with ``authenticate``); with ``read``, wait for one
    answer frame or the close (0.2 s at most: a frame the listener still waits the rest
    of gets no answer), then leave."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        if authenticate:
            assert _authenticated(s)
        try:
            s.sendall(data)
            if read:
                s.settimeout(0.2)
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
                    if len(got) >= 4 and len(got) >= 4 + struct.unpack_from(">i", got)[0]:
                        break
        except (OSError, TimeoutError):
            pass


def _valid_frames(topic: str) -> list[bytes]:
    out = []
    for request, version in (
        (ApiVersionsRequest(client_software_name="fuzz", client_software_version="1"), 3),
        (MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]), 9),
        (produce_request(topic, 0, [rec(b"v" * 40, b"k")] * 3, codec="lz4"), 9),
    ):
        request.API_VERSION = version
        request.with_header(correlation_id=1, client_id="fuzz")
        out.append(bytes(request.encode(header=True, framed=True)))
    return out


def _client(sc: ThreadSidecar) -> WireClient:
    c = WireClient(sc.kafka_bootstrap)
    if _auth_on(sc):
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        assert c.call(SaslAuthenticateRequest(auth_bytes=AUTH), 1).error_code == 0
    return c


def _well_behaved(sc: ThreadSidecar, topic: str) -> None:
    with _client(sc) as c:
        assert (
            c.call(
                ApiVersionsRequest(client_software_name="ok", client_software_version="1"), 3
            ).error_code
            == 0
        )
        answer = c.call(produce_request(topic, 0, [rec(b"still-served")]), 9)
        assert answer.responses[0].partition_responses[0].error_code == 0


def test_random_truncated_and_mutated_input_harms_nothing(fuzzed, caplog):
    caplog.set_level(logging.INFO, logger="kop_dedup.kafka")
    rng = random.Random(SEED)
    address = fuzzed.kafka_bootstrap
    auth = _auth_on(fuzzed)
    n = {
        k: v // (AUTH_SHARE if auth else 1)
        for k, v in {
            "RANDOM_FRAMES": RANDOM_FRAMES,
            "TRUNCATED_FRAMES": TRUNCATED_FRAMES,
            "RANDOM_BODIES": RANDOM_BODIES,
            "MUTATED_BATCHES": MUTATED_BATCHES,
        }.items()
    }
    topic = f"kf-{uuid.uuid4().hex[:8]}"
    with _client(fuzzed) as c:
        from kafka.protocol.admin import CreateTopicsRequest

        t = CreateTopicsRequest.CreatableTopic(
            name=topic, num_partitions=1, replication_factor=1, assignments=[], configs=[]
        )
        assert (
            c.call(CreateTopicsRequest(topics=[t], timeout_ms=30000, validate_only=False), 5)
            .topics[0]
            .error_code
            == 0
        )
    _well_behaved(fuzzed, topic)
    process = psutil.Process()
    fds, tasks = process.num_fds(), _tasks(fuzzed)
    valid = _valid_frames(topic)
    counts = dict.fromkeys(("random", "truncated", "bodies", "batches"), 0)

    for i in range(n["RANDOM_FRAMES"]):  # anything at all, a size prefix or not
        size = rng.choice(
            [rng.randrange(0, 64), rng.randrange(0, 4096), rng.randrange(-5, 1 << 24)]
        )
        body = rng.randbytes(rng.randrange(0, 256))
        data = (
            struct.pack(">i", size) + body
            if rng.random() < 0.7
            else rng.randbytes(rng.randrange(1, 64))
        )
        _send_and_close(address, data, read=i % 3 == 0, authenticate=auth and i % 2 == 1)
        counts["random"] += 1
    _well_behaved(fuzzed, topic)

    for i in range(n["TRUNCATED_FRAMES"]):  # a valid request cut anywhere, then the client leaves
        frame = rng.choice(valid)
        cut = frame[: rng.randrange(1, len(frame))]
        _send_and_close(address, cut, read=i % 2 == 0, authenticate=auth and i % 4 >= 2)
        counts["truncated"] += 1
    _well_behaved(fuzzed, topic)

    for i in range(n["RANDOM_BODIES"]):  # a valid header of a served API, then random bytes
        key = rng.choice(_SAFE_KEYS)
        version = rng.randrange(0, 13)
        header = struct.pack(">hhih", key, version, rng.randrange(1 << 31), 4) + b"fuzz"
        if rng.random() < 0.5:
            header += b"\x00"  # an empty tagged-fields section (flexible header)
        body = rng.randbytes(rng.randrange(0, 512))
        frame = header + body
        framed = struct.pack(">i", len(frame)) + frame
        _send_and_close(address, framed, read=True, authenticate=auth and i % 2 == 1)
        counts["bodies"] += 1
    _well_behaved(fuzzed, topic)

    with _client(fuzzed) as c:  # one connection, many bad batches: each is answered
        for _ in range(n["MUTATED_BATCHES"]):
            raw = bytearray(
                produce_request(
                    topic,
                    0,
                    [rec(rng.randbytes(30))] * 3,
                    codec=rng.choice(["none", "gzip", "lz4", "zstd", "snappy"]),
                )
                .topic_data[0]
                .partition_data[0]
                .records
            )
            for _ in range(rng.randrange(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            answer = c.call(produce_request(topic, 0, [], raw=bytes(raw)), 9)
            code = answer.responses[0].partition_responses[0].error_code
            assert code in {0, 2, 3, 10, 45, 46, 47, 53, 76, 87}, code
            counts["batches"] += 1
    _well_behaved(fuzzed, topic)

    wait_until("every fuzzing connection is closed", lambda: fuzzed.kafka.connections == 0)
    wait_until("no file descriptor leaked", lambda: process.num_fds() <= fds + 2)
    wait_until("no task leaked", lambda: _tasks(fuzzed) <= tasks)
    assert counts == {
        "random": n["RANDOM_FRAMES"],
        "truncated": n["TRUNCATED_FRAMES"],
        "bodies": n["RANDOM_BODIES"],
        "batches": n["MUTATED_BATCHES"],
    }
    # bad input is logged once, at INFO; an ERROR would be a handler that broke on it
    broken = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert broken == []
    assert any("kafka connection closed" in r.getMessage() for r in caplog.records)
    config = {"bootstrap.servers": address, "enable.idempotence": True}
    if auth:
        config |= {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "fuzz",
            "sasl.password": TOKEN,
        }
    producer = Producer(config)
    done: list = []
    producer.produce(topic, b"after-the-fuzz", on_delivery=lambda e, m: done.append(e))
    assert producer.flush(60) == 0
    assert done == [None]
