"""What the HTTP edge reads of a body before it knows who sent it: nothing.

init-producer-id, end-txn and txn-offset-commit are read ahead of their routes (to find
the transactional id's coordinator): the token is checked before a byte of the body is
read, the body is bounded (``MAX_TXN_REQUEST_BYTES``) before it is parsed, and a body
nested past any parser's depth is a 422 like any other broken body, never a 500.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from kop_dedup.settings import Settings
from tests.helpers import uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

TXN_POSTS = ["/v1/init-producer-id", "/v1/end-txn", "/v1/txn-offset-commit"]
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def sc(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadSidecar]:
    roles = tmp_path_factory.mktemp("bodies") / "roles"
    roles.write_text("alice:tok-alice\n")
    with ThreadSidecar(
        pulsar, system_namespace=uniq("sys"), auth_roles_file=roles, kafka_listener=""
    ) as sidecar:
        yield sidecar


def _head_only(url: str, path: str, length: int, token: str | None) -> tuple[bytes, float]:
    """Send a request's head announcing ``length`` bytes of body and only its first
    bytes; (the answer's status line, seconds to it), or (b"", ...) when none came."""
    parts = urlsplit(url)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    started = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as s:
        s.sendall(head.encode() + b"[{},{},")
        try:
            answer = s.recv(4096)
        except TimeoutError:
            answer = b""
    return answer.split(b"\r\n", 1)[0], time.monotonic() - started


@pytest.mark.parametrize("path", TXN_POSTS)
def test_an_unauthenticated_body_is_answered_401_before_it_is_read(sc, path):
    # 15 MB announced, a few bytes sent: the answer cannot wait for (or parse) the rest
    status, took = _head_only(sc.url, path, 15_000_000, token=None)
    assert status.startswith(b"HTTP/1.1 401"), (status, took)
    status, took = _head_only(sc.url, path, 15_000_000, token="tok-nobody")
    assert status.startswith(b"HTTP/1.1 403"), (status, took)


@pytest.mark.parametrize("path", TXN_POSTS)
@pytest.mark.parametrize("token", [None, "tok-alice"])
def test_a_body_nested_past_any_parser_is_a_4xx_not_a_500(sc, path, token):
    headers = {**JSON, **({"Authorization": f"Bearer {token}"} if token else {})}
    with httpx.Client(base_url=sc.url, timeout=30) as api:
        for raw in (b"[" * 200_000, b'{"transactionalId": "t", "x": ' + b"[" * 200_000):
            r = api.post(path, content=raw, headers=headers)
            assert r.status_code == (401 if token is None else 422), r.text
        assert api.get("/healthz").status_code == 200


def test_a_txn_body_one_byte_past_max_txn_request_bytes_is_413_before_parsing(sc):
    limit = Settings.model_fields["max_txn_request_bytes"].default
    alice = {**JSON, "Authorization": "Bearer tok-alice"}
    tid = uniq("big")

    def body(size: int) -> bytes:
        start = b'{"transactionalId": "' + tid.encode() + b'"'
        return start + b" " * (size - len(start) - 1) + b"}"

    with httpx.Client(base_url=sc.url, timeout=30) as api:
        r = api.post("/v1/init-producer-id", content=body(limit + 1), headers=alice)
        assert r.status_code == 413, r.text
        assert "KOP_DEDUP_MAX_TXN_REQUEST_BYTES" in r.json()["errorMessage"]
        chunks = (body(limit + 1)[i : i + 65536] for i in range(0, limit + 1, 65536))
        r = api.post("/v1/end-txn", content=chunks, headers=alice)  # no content-length
        assert r.status_code == 413, r.text
        r = api.post("/v1/init-producer-id", content=body(limit), headers=alice)
        assert r.status_code == 200, r.text
        assert r.json()["errorCode"] == 0, r.text
