"""``create_app``: the FastAPI application and its lifespan.

>>> app = create_app(Settings(pulsar_service_url="pulsar://127.0.0.1:6650"))

The lifespan starts a :class:`~kop_dedup.runtime.Runtime` (which refuses to
start when deduplication is off) and closes it on shutdown, after uvicorn has
stopped taking requests and finished the ones in flight.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from kop_dedup import __version__, errors
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from kop_dedup.transports.http.admission import ByteBudget
from kop_dedup.transports.http.docs import mount_docs
from kop_dedup.transports.http.routes import body_schemas, router

__all__ = ["create_app"]


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, before parsing them."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> dict[str, object]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return dict(message)

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            {
                "error": "REQUEST_TOO_LARGE",
                "errorMessage": f"request body exceeds {self.limit} bytes "
                "(KOP_DEDUP_MAX_REQUEST_BYTES); send fewer or smaller batches",
            },
            status_code=413,
        )
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings)
        try:
            await runtime.start()
        except BaseException:
            await runtime.close()
            raise
        app.state.runtime = runtime
        try:
            yield
        finally:
            await runtime.close()

    app = FastAPI(
        title="kop-dedup",
        version=__version__,
        summary="Kafka-style idempotent produce over HTTP on Apache Pulsar deduplication",
        lifespan=lifespan,
        docs_url=None,  # the CDN-loaded pages; see mount_docs
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.admission = ByteBudget(settings.max_inflight_bytes)
    app.state.tokens = settings.http_tokens()
    app.include_router(router)
    mount_docs(app)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        ]
        return JSONResponse(
            {
                "error": errors.InvalidRequest.name,
                "errorCode": errors.InvalidRequest.errno,
                "errorMessage": "; ".join(problems[:20]) or "invalid request body",
                "detail": [
                    {"loc": e.get("loc"), "msg": e.get("msg"), "type": e.get("type")}
                    for e in exc.errors()[:50]
                ],
            },
            status_code=422,
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(body_schemas())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    return app
