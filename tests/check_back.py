"""An application's check-back endpoint for transaction tests: a real HTTP server on a
free port that answers per transactional id from a script, records every question,
and can hold the answers to some questions until the test releases them (an
application that answers slowly)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CheckBackApp", "serve_check_back"]


class CheckBackApp:
    """Answers per transactional id from ``script`` (the last answer repeats; UNKNOWN
    for an id with none), records every question in ``asked``. ``hold(tid, answer)``:
    the next question about ``tid`` waits until ``release(tid)``, then gets ``answer``
    (the script answers the others meanwhile)."""

    def __init__(self) -> None:
        self.script: dict[str, list[str]] = {}
        self.asked: list[dict[str, Any]] = []
        self._held: dict[str, tuple[threading.Event, str]] = {}
        self._released: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def hold(self, transactional_id: str, answer: str) -> None:
        released = self._released[transactional_id] = threading.Event()
        self._held[transactional_id] = (released, answer)

    def release(self, transactional_id: str) -> None:
        self._released[transactional_id].set()

    def questions(self, transactional_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [q for q in self.asked if q["transactionalId"] == transactional_id]

    def answer(self, body: dict[str, Any]) -> str:
        tid = body["transactionalId"]
        with self._lock:
            self.asked.append(body)
            held = self._held.pop(tid, None)
            if held is None:
                answers = self.script.get(tid, ["UNKNOWN"])
                return answers.pop(0) if len(answers) > 1 else answers[0]
        released, answer = held
        released.wait(60)
        return answer

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                raw = json.dumps({"decision": app.answer(body)}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                return

        return Handler


@contextmanager
def serve_check_back(app: CheckBackApp) -> Iterator[str]:
    """Serve ``app`` (a thread per question); yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), app.handler())
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/check"
    finally:
        for released in list(app._released.values()):
            released.set()
        server.shutdown()
        server.server_close()
