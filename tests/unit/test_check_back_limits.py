"""Check-backs go only where the operator allows, within a total deadline, reading a
bounded answer (issue 30, item 5)."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from kop_dedup.coordination.transactions.checkback import Answer, CheckBack, check_back_refusal


@pytest.mark.parametrize(
    "url",
    [
        "https://app.internal:8443/txn/check",
        "https://APP.internal:8443/txn/",
    ],
)
def test_a_url_under_an_allowed_prefix_is_allowed(url):
    assert check_back_refusal(url, ["https://app.internal:8443/txn/"]) is None


@pytest.mark.parametrize(
    "url",
    [
        "https://app.internal.evil.example:8443/txn/check",  # a longer host
        "https://app.internal:8444/txn/check",  # another port
        "http://app.internal:8443/txn/check",  # another scheme
        "https://app.internal:8443/other",  # another path
        "https://evil@169.254.169.254/txn/",  # user info pointing elsewhere
        "https://app.internal/txn/check",  # the default port is not 8443
        "ftp://app.internal:8443/txn/",
    ],
)
def test_a_url_outside_every_prefix_is_refused(url):
    refused = check_back_refusal(url, ["https://app.internal:8443/txn/"])
    assert refused is not None
    assert "KOP_DEDUP_CHECK_BACK_URLS" in refused


@pytest.mark.parametrize(
    "url",
    [
        "https://app.internal:8443/txn/../admin/delete",
        "https://app.internal:8443/txn/%2e%2e/admin",
        "https://app.internal:8443/txn/%2E%2E%2fadmin",
        "https://app.internal:8443/txn/./../../x",
        "https://app.internal:8443/txn/..",
    ],
)
def test_dot_segments_cannot_climb_out_of_an_allowed_prefix(url):
    # the client would call the normalized path, outside the prefix (issue 36, item 9)
    refused = check_back_refusal(url, ["https://app.internal:8443/txn/"])
    assert refused is not None, f"{url} was allowed"
    assert "'.' or '..'" in refused


def test_the_http_client_calls_the_path_with_its_dot_segments_removed():
    assert httpx.URL("https://app.internal:8443/txn/../admin").path == "/admin"


def test_without_an_allow_list_every_url_is_refused_naming_the_setting():
    refused = check_back_refusal("http://127.0.0.1:8080/x", [])
    assert refused is not None
    assert "KOP_DEDUP_CHECK_BACK_URLS" in refused


@contextmanager
def server(body: bytes, *, trickle_s: float = 0.0) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.end_headers()
            for i in range(len(body)):
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
                time.sleep(trickle_s)

        def log_message(self, *_args: object) -> None:
            return

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/check"
    finally:
        srv.shutdown()
        srv.server_close()


def ask(client: CheckBack, url: str) -> tuple[Answer, str]:
    async def run() -> tuple[Answer, str]:
        try:
            return await client.ask(url, {"transactionalId": "t"})
        finally:
            await client.close()

    return asyncio.run(run())


def test_an_allowed_url_is_asked():
    with server(b"COMMIT") as url:
        assert ask(CheckBack(5.0, allowed=[url]), url)[0] is Answer.COMMIT


def test_a_url_not_allowed_is_never_called():
    with server(b"COMMIT") as url:
        answer, what = ask(CheckBack(5.0, allowed=["http://127.0.0.1:1/"]), url)
    assert answer is Answer.UNKNOWN
    assert what.startswith("not asked")


def test_an_answer_trickling_past_the_total_deadline_is_no_answer():
    # each byte comes well within any per-read timeout; the whole takes 1.8 s
    with server(b"COMMIT" + b" " * 12, trickle_s=0.1) as url:
        started = time.monotonic()
        answer, what = ask(CheckBack(0.5, allowed=[url]), url)
    assert answer is Answer.UNKNOWN
    assert "within" in what
    assert time.monotonic() - started < 2.0


def test_an_answer_over_the_size_cap_is_no_answer():
    with server(b"COMMIT" + b" " * 5000) as url:
        answer, what = ask(CheckBack(5.0, allowed=[url], max_bytes=1024), url)
    assert answer is Answer.UNKNOWN
    assert "1024 bytes" in what
