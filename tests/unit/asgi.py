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

from kop_dedup import errors
from kop_dedup.cluster.members import Membership
from kop_dedup.cluster.ownership import Cluster
from kop_dedup.coordination.transactions.requests import InitProducerId, ProducerIdAndEpoch
from kop_dedup.coordination.transactions.stats import TxnStats
from kop_dedup.observability.stats import Stats
from kop_dedup.observability.wire import WireStats
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


class StubRegistry:
    def __init__(self) -> None:
        self.allocator = StubAllocator()


class StubTransactions:
    """The coordinator's init-producer-id as the route sees it (epoch + 1 per call)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = TxnStats()
        self.epochs: dict[str, int] = {}
        self.init_producer_id: Callable[..., Awaitable[ProducerIdAndEpoch]] = self._bump

    def owned_open(self) -> int:
        return 0

    def check_timeout(self, timeout_ms: int | None) -> int:
        timeout = timeout_ms or self.settings.default_transaction_timeout_ms
        if not 0 < timeout <= self.settings.max_transaction_timeout_ms:
            raise errors.InvalidTransactionTimeout(f"transactionTimeoutMs {timeout}")
        return timeout

    async def _bump(self, request: InitProducerId) -> ProducerIdAndEpoch:
        self.check_timeout(request.timeout_ms)
        tid = request.transactional_id
        self.epochs[tid] = self.epochs.get(tid, -1) + 1
        return ProducerIdAndEpoch(4242, self.epochs[tid])


def unjoined_cluster() -> Cluster:
    """A node that has not joined a cluster: it answers as a one-node cluster and
    forwards nothing (the unit tests' runtimes have no Pulsar to list members on)."""

    async def no_topics(topic: str) -> int:
        raise errors.UnknownTopicOrPartition(topic)

    return Cluster(Membership(None, None, "unit-members"), partitions_of=no_topics)  # type: ignore[arg-type]


class StubRuntime:
    def __init__(self, settings: Settings) -> None:
        self.settings, self.service, self.stats = settings, StubService(), Stats()
        self.kafka_stats = WireStats()
        self.registry = StubRegistry()
        self.transactions = StubTransactions(settings)
        self.cluster = unjoined_cluster()


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
