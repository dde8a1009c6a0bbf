"""Hostile input before SASL authentication, against a real ``kop-dedup serve`` process
(its resident memory measured from outside): a frame over the unauthenticated limit is
closed from its size header, a request that stops half way is closed by the read
deadline, a failed authentication is closed after Kafka's delay, a non-ASCII password
is a plain failure, nothing but ApiVersions and SASL is decoded, connections are capped.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kop_dedup.protocol.records import rec
from tests.helpers import uniq, wait_until
from tests.kafka_wire import WireClient, produce_request
from tests.sidecar import ProcessSidecar

pytestmark = pytest.mark.integration

TOKEN = "before-auth-token"
READ_TIMEOUT_MS = 1_000
PER_ADDRESS = 12


@pytest.fixture(scope="module")
def guarded(pulsar, tmp_path_factory) -> Iterator[ProcessSidecar]:
    sc = ProcessSidecar(
        pulsar,
        tmp_path_factory.mktemp("before-auth"),
        log_level="INFO",
        system_namespace=uniq("sys"),
        auth_tokens=f'["{TOKEN}"]',
        kafka_request_read_timeout_ms=READ_TIMEOUT_MS,
        kafka_max_connections_per_address=PER_ADDRESS,
    )
    with sc:
        yield sc


def _connect(sc: ProcessSidecar) -> socket.socket:
    host, port = sc.kafka_bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the peer closed (EOF or reset), reading and dropping what comes;
    None when it is still open after ``seconds``."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            if time.monotonic() - start > seconds:
                return None
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return None
    return time.monotonic() - start


def _warm(sc: ProcessSidecar) -> None:
    with WireClient(sc.kafka_bootstrap) as c:
        answer = c.call(
            ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3
        )
        assert answer.error_code == 0


def test_an_unauthenticated_15_mib_frame_is_closed_from_its_header(guarded):
    _warm(guarded)
    before = guarded.rss_mb()
    sock = _connect(guarded)
    size = 15 << 20
    header = struct.pack(">ihhih", size, 3, 9, 1, 4) + b"evil"
    sent = {"bytes": 0}

    def flood() -> None:  # keeps sending the body for as long as the listener takes it
        chunk = b"\x00" * (1 << 20)
        try:
            sock.sendall(header)
            for _ in range(15):
                sock.sendall(chunk)
                sent["bytes"] += len(chunk)
        except OSError:
            pass

    sender = threading.Thread(target=flood, daemon=True)
    started = time.monotonic()
    sender.start()
    took = _closed_within(sock, 5)
    sender.join(10)
    sock.close()
    assert took is not None, "never closed"
    assert took < 1.0, f"closed after {took} s"
    assert time.monotonic() - started < 5
    assert sent["bytes"] < size  # the body was never taken in full
    grown = guarded.rss_mb() - before
    assert grown < 4, f"resident memory grew by {grown:.1f} MiB"
    assert "KOP_DEDUP_KAFKA_MAX_UNAUTHENTICATED_BYTES" in guarded.log_path.read_text()


def test_a_frame_over_the_unauthenticated_limit_is_read_after_authentication(guarded):
    with WireClient(guarded.kafka_bootstrap) as c:
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0me\0" + TOKEN.encode()), 1)
        assert auth.error_code == 0
        request = produce_request(uniq("missing"), 0, [rec(b"x" * 600_000)])
        answer = c.call(request, 9)  # a 600 KiB frame: served, the topic is just missing
        assert answer.responses[0].partition_responses[0].error_code == 3


def test_a_size_header_alone_is_closed_by_the_read_deadline(guarded):
    with _connect(guarded) as sock:
        sock.sendall(struct.pack(">i", 100))
        took = _closed_within(sock, 10)
    assert took is not None, "never closed"
    assert READ_TIMEOUT_MS / 1000 * 0.9 <= took < READ_TIMEOUT_MS / 1000 + 2, took


def test_half_a_size_header_is_closed_by_the_read_deadline(guarded):
    with _connect(guarded) as sock:
        sock.sendall(b"\x00")
        took = _closed_within(sock, 10)
    assert took is not None, "never closed"
    assert took < READ_TIMEOUT_MS / 1000 + 2, took


def test_a_failed_authentication_is_answered_then_closed_after_kafkas_delay(guarded):
    with WireClient(guarded.kafka_bootstrap) as c:
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0me\0wrong"), 1)
        answered = time.monotonic()
        assert auth.error_code == 58
        assert c.closed_by_peer(5)
        assert time.monotonic() - answered >= 0.08  # 100 ms after the answer


def test_a_non_ascii_password_is_a_plain_authentication_failure(guarded):
    with WireClient(guarded.kafka_bootstrap) as c:
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        password = "pässwörd-ü".encode()
        auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0me\0" + password), 1)
        assert auth.error_code == 58
        assert "Invalid username or password" in auth.error_message
        assert c.closed_by_peer(5)
    log = guarded.log_path.read_text()
    assert "Traceback" not in log
    assert "TypeError" not in log


def test_no_request_but_api_versions_and_sasl_is_decoded_before_authentication(guarded):
    with WireClient(guarded.kafka_bootstrap) as c:
        topics = [MetadataRequest.MetadataRequestTopic(name="t")]
        c.send(MetadataRequest(topics=topics, allow_auto_topic_creation=False), 9)
        with pytest.raises(ConnectionError):  # closed without an answer, as Kafka does
            c.receive_frame()
    assert "Metadata before SASL authentication" in guarded.log_path.read_text()


def test_connections_over_the_per_address_cap_are_closed_as_accepted(guarded):
    held = [_connect(guarded) for _ in range(PER_ADDRESS)]
    try:
        for sock in held:  # each is served (and so counted) before the next is tried
            sock.sendall(b"")
        wait_until(
            "the held connections are served",
            lambda: _api_versions_on(held[-1]),
        )
        extra = _connect(guarded)
        took = _closed_within(extra, 5)
        extra.close()
        assert took is not None
        assert took < 1.0
    finally:
        for sock in held:
            sock.close()
    wait_until("a connection is served again once others closed", lambda: _served(guarded))
    assert "KOP_DEDUP_KAFKA_MAX_CONNECTIONS_PER_ADDRESS" in guarded.log_path.read_text()


def _api_versions_on(sock: socket.socket) -> bool:
    request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    request.API_VERSION = 3
    request.with_header(correlation_id=1, client_id="cap")
    sock.sendall(bytes(request.encode(header=True, framed=True)))
    sock.settimeout(5)
    return len(sock.recv(4)) == 4 and bool(sock.recv(65536))


def _served(sc: ProcessSidecar) -> bool:
    try:
        _warm(sc)
    except (OSError, ConnectionError):
        return False
    return True
