"""``create_app``: the FastAPI application and its lifespan.

>>> app = create_app(Settings(pulsar_service_url="pulsar://127.0.0.1:6650"))

The lifespan starts a :class:`~kop_dedup.runtime.Runtime` (which refuses to
start when deduplication is off), then the Kafka listener on it
(``KOP_DEDUP_KAFKA_LISTENER``, unless empty; ``app.state.kafka``), then joins the
node to its cluster (as the node the listener advertises), and on shutdown,
after uvicorn has stopped taking requests and finished the ones in flight, closes
the listener first and the runtime last.

``POST /v1/produce`` is a plain ASGI endpoint (produce.py) that the app serves
ahead of FastAPI's middleware (``_App``), behind the same bound on bodies in flight
(admitted.py) and body limit as every request; every other route is FastAPI's
(routes.py, and the offline docs in docs.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kop_dedup import __version__
from kop_dedup.admission import ByteBudget
from kop_dedup.errors import KafkaError
from kop_dedup.runtime import Runtime
from kop_dedup.security.identity import Authenticator
from kop_dedup.security.pruning import prune_owners
from kop_dedup.settings import Settings
from kop_dedup.transports.http.admitted import Admitted, InFlight
from kop_dedup.transports.http.answers import invalid_request, too_large
from kop_dedup.transports.http.bodies import body_schemas
from kop_dedup.transports.http.deps import AUTHORIZATION_ERRORS, not_allowed
from kop_dedup.transports.http.docs import mount_docs
from kop_dedup.transports.http.groups import router as groups_router
from kop_dedup.transports.http.internal import router as internal_router
from kop_dedup.transports.http.owners import router as owners_router
from kop_dedup.transports.http.produce import PATH, ProduceEndpoint, openapi_paths
from kop_dedup.transports.http.quotas import router as quotas_router
from kop_dedup.transports.http.routes import router
from kop_dedup.transports.http.routing import Forwarding
from kop_dedup.transports.http.transactions import router as transactions_router
from kop_dedup.transports.kafka.listener import KafkaListener

__all__ = ["create_app"]


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, before parsing them."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > self.limit:
                    await self._refuse(scope, receive, send)
                    return
                break
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await too_large(self.limit, "MAX_REQUEST_BYTES")(scope, receive, send)


class _TooLarge(Exception):
    pass


class _App(FastAPI):
    """FastAPI, with one shortcut: ``POST <hot_path>`` goes straight to its endpoint.

    FastAPI's own path (its telemetry check, then Starlette's error pages,
    exception handlers, an exit stack and the router) costs about 10 us per
    request that the produce endpoint, which raises no HTTP exceptions and
    opens no files, does not need. A request the shortcut does not match
    exactly (another method, a trailing slash) takes that path to the same
    endpoint, which is also a route in the router; only the 500 page of an
    unexpected exception then comes from uvicorn instead of Starlette (both
    plain text, both logged).
    """

    hot_path: tuple[str, ASGIApp] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot_path
        if (
            hot is not None
            and scope["type"] == "http"
            and scope["path"] == hot[0]
            and scope["method"] == "POST"
            and not self.root_path
        ):
            scope["app"] = self
            await hot[1](scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _bound_bodies(app: _App, endpoint: ASGIApp, settings: Settings) -> None:
    """Every request behind the bodies in flight (``app.state.reading``) and the body
    limit, before anything reads its body: the outermost middleware, and the same in
    front of the produce shortcut that ``_App`` takes ahead of the middleware."""
    limit = settings.max_request_bytes
    reading = app.state.reading = InFlight(settings.http_queued_max_request_bytes)
    read_s = settings.http_request_read_timeout_ms / 1000
    admitted = Admitted(
        BodyLimit(endpoint, limit=limit), reading, max_request_bytes=limit, read_timeout_s=read_s
    )
    app.hot_path = (PATH, admitted)
    app.add_middleware(BodyLimit, limit=limit)
    app.add_middleware(Admitted, budget=reading, max_request_bytes=limit, read_timeout_s=read_s)


def _maximum(schemas: dict[str, Any], model: str, field: str, limit: int) -> None:
    """The document shows the cap a setting puts on a field (the route refuses more)."""
    prop = schemas[model]["properties"][field]
    for kind in prop.get("anyOf", [prop]):
        if kind.get("type") == "integer":
            kind["maximum"] = limit


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings)
        prune_owners(runtime.authorizer, runtime.group_retention, runtime.transactions.state)
        try:
            await runtime.start()
        except BaseException:
            await runtime.close()
            raise
        kafka: KafkaListener | None = None
        try:
            if settings.kafka_address() is not None:
                kafka = KafkaListener(runtime, runtime.kafka_stats)
                await kafka.start()
            app.state.kafka = kafka
            me = await runtime.join_cluster(
                None if kafka is None else (kafka.node.host, kafka.node.port)
            )
            if kafka is not None:
                kafka.joined(me.node_id)
            app.state.runtime = runtime  # from here on requests are served
            yield
        finally:
            if kafka is not None:  # first: no Kafka request may reach a closing runtime
                await kafka.close()
            await runtime.close()

    app = _App(
        title="kop-dedup",
        version=__version__,
        summary="Kafka-style idempotent produce over HTTP on Apache Pulsar deduplication",
        lifespan=lifespan,
        exception_handlers=dict.fromkeys((*AUTHORIZATION_ERRORS, KafkaError), not_allowed),
        docs_url=None,  # the CDN-loaded pages; see mount_docs
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.admission = ByteBudget(settings.max_inflight_bytes)
    app.state.auth = Authenticator.from_settings(settings)
    for routes in (
        router,
        transactions_router,
        groups_router,
        quotas_router,
        internal_router,
        owners_router,
    ):
        app.include_router(routes)
    # the hot path: a plain ASGI endpoint (produce.py), served ahead of FastAPI's own
    # path (_App) behind the body bounds (_bound_bodies), and as the router's first route
    endpoint = ProduceEndpoint(app.state)
    app.router.routes.insert(0, Route(PATH, endpoint, methods=["POST"]))
    mount_docs(app)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_request(exc.errors())

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(body_schemas())
            _maximum(schemas, "ProduceIn", "timeoutMs", settings.max_timeout_ms)
            _maximum(schemas, "PullIn", "waitMs", settings.max_pull_wait_ms)
            schema["paths"] = {**openapi_paths(), **schema.get("paths", {})}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(Forwarding, state=app.state)
    _bound_bodies(app, endpoint, settings)  # last: the outermost middleware
    return app
