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
  chunk that does not fit ends the request with the same 429 (what was read is let go);
- a body not whole ``HTTP_REQUEST_READ_TIMEOUT_MS`` after the request began: 408, its
  bytes let go (a client that announces a body and sends none holds the budget no
  longer than that).

A request alone is always admitted (up to ``MAX_REQUEST_BYTES``), so a budget smaller
than one body never stops a quiet sidecar. The produce endpoint's own budget
(``MAX_INFLIGHT_BYTES``, which waits) then bounds what is parsed at once.

>>> reading = InFlight(64 << 20)
>>> app = Admitted(app, reading, max_request_bytes=16 << 20, read_timeout_s=30.0)
"""

from __future__ import annotations

import asyncio

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


class _Slow(Exception):
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


class _Body:
    """One request's body as the app receives it: admitted chunk by chunk when it came
    without a length, and whole before ``deadline``."""

    def __init__(
        self, receive: Receive, budget: InFlight, announced: int | None, read_s: float
    ) -> None:
        self._receive, self._budget, self._announced = receive, budget, announced
        self.held = announced or 0
        self._whole = False
        self._deadline = asyncio.get_running_loop().time() + read_s

    async def receive(self) -> Message:
        if self._whole:  # the body is read: a long poll waits for the client's disconnect
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise _Slow from None
        if message["type"] != "http.request":
            return message
        self._whole = not message.get("more_body", False)
        n = len(message.get("body", b""))
        if self._announced is None and n:
            if not self._budget.take(n, self.held):
                raise _Refused
            self.held += n
        return message


class Admitted:
    """ASGI middleware: admits a request's body into ``budget`` before it is read (see
    the module docstring)."""

    def __init__(
        self, app: ASGIApp, budget: InFlight, *, max_request_bytes: int, read_timeout_s: float
    ) -> None:
        self.app, self.budget, self.limit = app, budget, max_request_bytes
        self.read_s = read_timeout_s

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
        body = _Body(receive, budget, announced, self.read_s)
        answering = False

        async def watched(message: Message) -> None:
            nonlocal answering
            answering = answering or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, body.receive, watched)
        except _Refused:
            if not answering:
                await busy(budget)(scope, receive, send)
        except _Slow:
            if not answering:
                await self._slow(scope, receive, send)
        finally:
            budget.release(body.held)

    async def _slow(self, scope: Scope, receive: Receive, send: Send) -> None:
        """408: the body did not arrive in time."""
        await JSONResponse(
            {
                "error": "REQUEST_TIMEOUT",
                "errorMessage": f"the request body was not complete {self.read_s:g} s after "
                "the request began (KOP_DEDUP_HTTP_REQUEST_READ_TIMEOUT_MS)",
            },
            status_code=408,
        )(scope, receive, send)
