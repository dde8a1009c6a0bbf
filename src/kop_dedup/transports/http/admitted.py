"""HTTP request bodies in flight, bounded over every connection before they are read.

:class:`Admitted` is the outermost middleware (and wraps the produce endpoint's
shortcut): before anything reads a body (the token check reads none, the routes and
the forwarding middleware do), it admits the body's bytes into one :class:`InFlight`
budget shared by all connections (``HTTP_QUEUED_MAX_REQUEST_BYTES``, as Kafka's
``queued.max.request.bytes`` bounds its request pool), held until the request is
answered:

- a ``Content-Length`` over ``MAX_REQUEST_BYTES``: 413, nothing read;
- a ``Content-Length`` that does not fit beside the bodies in flight: 429
  THROTTLING_QUOTA_EXCEEDED with ``Retry-After``, nothing read;
- a body without a length (chunked) is admitted chunk by chunk as it streams; the
  chunk that does not fit ends the request with the same 429 (what was read is let go).

A request alone is always admitted (up to ``MAX_REQUEST_BYTES``), so a budget smaller
than one body never stops a quiet sidecar. The produce endpoint's own budget
(``MAX_INFLIGHT_BYTES``, which waits) then bounds what is parsed at once.

>>> reading = InFlight(64 << 20)
>>> app = Admitted(app, reading, max_request_bytes=16 << 20)
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kop_dedup import errors
from kop_dedup.transports.http.answers import too_large

__all__ = ["RETRY_AFTER_S", "Admitted", "InFlight", "busy"]

RETRY_AFTER_S = 1
"""What a 429 tells the client to wait (seconds): bodies in flight are answered fast."""


class InFlight:
    """Bytes held at once, at most ``capacity`` (one holder alone always fits). Never
    waits: a caller that does not fit is refused."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1 byte")
        self.capacity = capacity
        self.in_use = 0
        self.refused = 0
        """Requests refused so far (for /metrics and tests)."""

    def take(self, n: int, held: int = 0) -> bool:
        """Take ``n`` bytes for a holder that already holds ``held``; False (nothing
        taken) when they do not fit beside the others'."""
        if self.in_use - held > 0 and self.in_use + n > self.capacity:
            self.refused += 1
            return False
        self.in_use += n
        return True

    def release(self, n: int) -> None:
        self.in_use = max(0, self.in_use - n)


class _Refused(Exception):
    pass


def _announced(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def busy(budget: InFlight) -> JSONResponse:
    """429: the bodies in flight leave no room for this one now."""
    error = errors.ThrottlingQuotaExceeded(
        f"request bodies in flight already hold about {budget.in_use} of "
        f"{budget.capacity} bytes (KOP_DEDUP_HTTP_QUEUED_MAX_REQUEST_BYTES); "
        f"retry after {RETRY_AFTER_S} s"
    )
    return JSONResponse(
        {"errorCode": error.errno, "error": error.name, "errorMessage": error.message},
        status_code=429,
        headers={"retry-after": str(RETRY_AFTER_S)},
    )


class Admitted:
    """ASGI middleware: admits a request's body into ``budget`` before it is read (see
    the module docstring)."""

    def __init__(self, app: ASGIApp, budget: InFlight, *, max_request_bytes: int) -> None:
        self.app, self.budget, self.limit = app, budget, max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        budget = self.budget
        announced = _announced(scope)
        if announced is not None and announced > self.limit:
            await too_large(self.limit, "MAX_REQUEST_BYTES")(scope, receive, send)
            return
        if announced and not budget.take(announced):
            await busy(budget)(scope, receive, send)
            return
        held = announced or 0
        answering = False

        async def streamed() -> Message:
            nonlocal held
            message = await receive()
            n = len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if n:
                if not budget.take(n, held):
                    raise _Refused
                held += n
            return message

        async def watched(message: Message) -> None:
            nonlocal answering
            answering = answering or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive if announced is not None else streamed, watched)
        except _Refused:
            if not answering:
                await busy(budget)(scope, receive, send)
        finally:
            budget.release(held)
