"""The HTTP app in-process (no socket, no lifespan) over a stub runtime.

The stub service records the batches it is handed and answers each through a
function a test may replace; the stub registry hands out ids the same way.
Nothing here publishes: these are tests of the HTTP edge, not of Pulsar.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from kop_dedup.observability.stats import Stats
from kop_dedup.produce.service import BatchResult
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.settings import Settings
from kop_dedup.transports.http import create_app


class StubService:
    """Answers every batch through ``answer`` (stored by default) and keeps them."""

    def __init__(self) -> None:
        self.batches: list[KafkaBatch] = []
        self.answer: Callable[[KafkaBatch], BatchResult] = lambda b: BatchResult(
            b.topic, b.partition, None, "1:2:0:-1"
        )
        self.gate: asyncio.Event | None = None
        """When set by a test, every batch waits for it before it is answered."""

    async def produce(self, batch: KafkaBatch, deadline: float) -> BatchResult:
        self.batches.append(batch)
        if self.gate is not None:
            await self.gate.wait()
        return self.answer(batch)

    def open_producers(self) -> int:
        return 0


class StubAllocator:
    def __init__(self) -> None:
        self.allocate: Callable[[], Awaitable[int]] = self._next
        self.issued = 999

    async def _next(self) -> int:
        self.issued += 1
        return self.issued


class StubTransactional:
    def __init__(self) -> None:
        self.init: Callable[[str], Awaitable[tuple[int, int]]] = self._bump
        self.epochs: dict[str, int] = {}

    async def _bump(self, transactional_id: str) -> tuple[int, int]:
        self.epochs[transactional_id] = self.epochs.get(transactional_id, -1) + 1
        return 4242, self.epochs[transactional_id]


class StubRegistry:
    def __init__(self) -> None:
        self.allocator = StubAllocator()
        self.transactional = StubTransactional()


class StubRuntime:
    def __init__(self, settings: Settings) -> None:
        self.settings, self.service, self.stats = settings, StubService(), Stats()
        self.registry = StubRegistry()


class Client:
    """Requests straight into the ASGI app: ``post``/``get`` each on its own event loop,
    ``arequest`` on the caller's.

    ``shortcut=False`` turns the produce endpoint's shortcut off, so that POST
    /v1/produce takes FastAPI's full path (middleware, router) to the same endpoint.
    """

    def __init__(self, *, shortcut: bool = True, **settings: Any) -> None:
        s = Settings(pulsar_service_url="pulsar://127.0.0.1:1", **settings)
        self.app = create_app(s)
        if not shortcut:
            self.app.hot_path = None  # type: ignore[attr-defined]
        self.runtime = StubRuntime(s)
        self.app.state.runtime = self.runtime

    async def arequest(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as c:
            return await c.request(method, path, **kwargs)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return asyncio.run(self.arequest(method, path, **kwargs))

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)
