"""Request bytes in flight, bounded over every connection before they are read (issue
36, item 5): HTTP bodies (``HTTP_QUEUED_MAX_REQUEST_BYTES``: 429 with Retry-After,
nothing read) and Kafka frames (``KAFKA_QUEUED_MAX_REQUEST_BYTES``: the listener stops
reading until there is room, no error).

Each test holds part of the budget with requests whose head (or size header) came and
whose body has not, as a slow or hostile client does, and measures what the next
connections get.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import ApiVersionsRequest

from tests.helpers import gauges, uniq, wait_until
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

BUDGET = 1 << 20
READ_TIMEOUT_MS = 5_000
HELD = 800_000  # one slow body: what is left (248,576 bytes) is all the others get
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def sc(pulsar) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(
        pulsar,
        system_namespace=uniq("sys"),
        max_request_bytes=BUDGET,
        http_queued_max_request_bytes=BUDGET,
        kafka_queued_max_request_bytes=BUDGET,
        kafka_max_request_bytes=BUDGET,
        http_request_read_timeout_ms=READ_TIMEOUT_MS,
    ) as sidecar:
        yield sidecar


def _slow_body(url: str, path: str, length: int) -> socket.socket:
    """A connection that sent a request's head announcing ``length`` bytes of body, and
    a few of them."""
    parts = urlsplit(url)
    s = socket.create_connection((parts.hostname, parts.port), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {length}\r\n\r\n"
    )
    s.sendall(head.encode() + b'{"batches": [')
    return s


def _padded(size: int) -> bytes:
    start = b'{"batches": []'
    return start + b" " * (size - len(start) - 1) + b"}"


def _in_use(sc: ThreadSidecar, without: int = 0) -> int:
    """Body bytes the sidecar holds; ``without`` on a build that does not count them."""
    reading = getattr(sc.app.state, "reading", None)
    return without if reading is None else int(reading.in_use)


def test_a_body_that_does_not_fit_beside_those_in_flight_is_429_unread(sc):
    with httpx.Client(base_url=sc.url, timeout=30) as api, ExitStack() as slow:
        slow.enter_context(_slow_body(sc.url, "/v1/produce", HELD))
        wait_until("the slow body admitted", lambda: _in_use(sc, HELD) >= HELD)
        for path in ("/v1/produce", f"/v1/groups/{uniq('g')}/members"):
            # one byte past what is left: refused from its Content-Length
            r = api.post(path, content=_padded(BUDGET - HELD + 1), headers=JSON)
            assert r.status_code == 429, (path, r.status_code, r.text)
            assert r.headers["retry-after"] == "1"
            assert r.json()["errorCode"] == 89, r.text
            assert "KOP_DEDUP_HTTP_QUEUED_MAX_REQUEST_BYTES" in r.json()["errorMessage"]
        # without a length: admitted chunk by chunk, refused at the chunk past it
        chunks = (b" " * 100_000 for _ in range(5))
        r = api.post("/v1/produce", content=chunks, headers=JSON)
        assert r.status_code == 429, r.text
        assert gauges(api)["kop_dedup_http_request_bytes_in_flight"] >= HELD
        # what fits is read and parsed as ever (no batch: the route's 422)
        r = api.post("/v1/produce", content=_padded(BUDGET - HELD), headers=JSON)
        assert r.status_code == 422, r.text
        assert api.get("/healthz").status_code == 200
    wait_until("the slow body let go", lambda: _in_use(sc) == 0)
    with httpx.Client(base_url=sc.url, timeout=30) as api:
        r = api.post("/v1/produce", content=_padded(BUDGET), headers=JSON)  # alone: admitted
        assert r.status_code == 422, r.text
        r = api.post("/v1/produce", content=_padded(BUDGET + 1), headers=JSON)
        assert r.status_code == 413, r.text


def test_a_body_not_whole_within_the_read_timeout_is_408_and_lets_its_bytes_go(sc):
    started = time.monotonic()
    with _slow_body(sc.url, "/v1/produce", HELD) as slow:
        wait_until("the slow body admitted", lambda: _in_use(sc, HELD) >= HELD)
        slow.settimeout(READ_TIMEOUT_MS / 1000 + 10)
        status = slow.recv(4096).split(b"\r\n", 1)[0]
        took = time.monotonic() - started
        assert status.startswith(b"HTTP/1.1 408"), status  # the build before: no answer
        assert READ_TIMEOUT_MS / 1000 - 0.5 <= took <= READ_TIMEOUT_MS / 1000 + 5, took
        assert _in_use(sc) == 0  # while the client still holds its connection open


def _frame(request: Any, version: int) -> bytes:
    request.API_VERSION = version
    request.with_header(correlation_id=1, client_id="queued-test")
    return bytes(request.encode(header=True, framed=True))


def _answered(c: WireClient, within: float) -> bool:
    """Whether an answer's first bytes arrive within ``within`` seconds."""
    c.sock.settimeout(within)
    try:
        return bool(c.sock.recv(4, socket.MSG_PEEK))
    except TimeoutError:
        return False
    finally:
        c.sock.settimeout(30)


def test_kafka_frames_over_the_queued_bytes_wait_unread_until_there_is_room(sc):
    # eight connections each start a 200,000-byte request (its size header and a few
    # bytes): five fit in 1 MiB; the listener reads nothing more of the others
    big = _frame(
        ApiVersionsRequest[3](client_software_name="a" * 199_900, client_software_version="1"), 3
    )
    listener = sc.app.state.kafka
    with ExitStack() as stack:
        slow = [stack.enter_context(WireClient(sc.kafka_bootstrap)) for _ in range(8)]
        for c in slow:
            c.send_bytes(big[:20])
        if hasattr(listener, "queued"):  # the build before has no budget to watch
            wait_until("five admitted, three waiting", lambda: listener.queued.waiting == 3)
            assert listener.queued.in_use == 5 * (len(big) - 4) <= BUDGET
        # a small request on a ninth connection waits behind them: not read, no error
        small = stack.enter_context(WireClient(sc.kafka_bootstrap))
        small.send(ApiVersionsRequest[0](), 0)
        assert not _answered(small, within=1.5)
        if hasattr(listener, "queued"):
            with httpx.Client(base_url=sc.url, timeout=30) as api:
                seen = gauges(api)
            assert seen["kop_dedup_kafka_requests_waiting_for_room"] == 4, seen
            assert seen["kop_dedup_kafka_queued_request_bytes"] == 5 * (len(big) - 4), seen
        for c in slow:  # the slow bodies arrive: every request is read and answered
            c.send_bytes(big[20:])
        for c in [*slow, small]:
            assert _answered(c, within=20)
        assert small.receive(ApiVersionsRequest[0](), 0)[1].error_code == 0
    wait_until("all let go", lambda: listener.queued.in_use == 0)
    # Produce requests are handled side by side, each letting go of its bytes when done
    producer = Producer({"bootstrap.servers": sc.kafka_bootstrap, "enable.idempotence": True})
    delivered: list[object] = []
    topic = uniq("queued")
    for _ in range(50):
        producer.produce(topic, b"v" * 10_000, on_delivery=lambda e, _m: delivered.append(e))
    producer.flush(30)
    assert delivered == [None] * 50
    wait_until("the Produce requests let go", lambda: listener.queued.in_use == 0)
