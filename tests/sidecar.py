"""Run the sidecar for tests: in a thread (uvicorn on a real socket) or as a process.

Both talk to the session's real broker. ``ThreadSidecar`` is cheap and is what
most API tests use; ``ProcessSidecar`` is a real ``kop-dedup serve`` process
that fault tests can SIGKILL and restart.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Self, TypeVar

import uvicorn

from kop_dedup.settings import Settings
from kop_dedup.transports.http import create_app
from kop_dedup_tools.launcher import free_port
from kop_dedup_tools.sidecar import SidecarProcess, wait_ready

T = TypeVar("T")

SESSION_SYSTEM_NAMESPACE = f"sys-{uuid.uuid4().hex[:10]}"
"""The system namespace of sidecars started without one: one per test session, so they
form one cluster while they run side by side, and never a cluster with the sidecars of
another session on the same broker (a developer's second run, or agents sharing a broker:
two sessions' sidecars in ``kop-dedup-system`` coordinated each other's groups and
failed each other's tests)."""


class ThreadSidecar:
    """uvicorn serving create_app() in a background thread on a free port."""

    def __init__(
        self, pulsar: Any, *, cluster_of: ThreadSidecar | None = None, **settings: Any
    ) -> None:
        """``cluster_of``: join that sidecar's cluster (its system namespace); sidecars
        started without one share :data:`SESSION_SYSTEM_NAMESPACE`, and so form one
        cluster while they run side by side."""
        if cluster_of is not None:
            settings.setdefault("system_namespace", cluster_of.settings.system_namespace)
        settings.setdefault("system_namespace", SESSION_SYSTEM_NAMESPACE)
        self.port = free_port()
        settings.setdefault(
            "kafka_listener", "127.0.0.1:0"
        )  # never 9092: sidecars run side by side
        self.settings = Settings(
            pulsar_service_url=pulsar.service_url,
            pulsar_admin_url=pulsar.admin_url,
            host="127.0.0.1",
            port=self.port,
            log_level="WARNING",
            **settings,
        )
        self.app = create_app(self.settings)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            access_log=False,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadSidecar:
        self.thread.start()
        wait_ready(self.url)
        return self

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run ``coro`` on the sidecar's event loop (its runtime's objects live there)."""
        loop = self.server.servers[0].get_loop()
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kafka(self) -> Any:
        """The Kafka listener (None when off)."""
        return self.app.state.kafka

    @property
    def kafka_bootstrap(self) -> str:
        """``host:port`` of the Kafka listener, for ``bootstrap.servers``."""
        host, port = self.kafka.bound
        return f"{host}:{port}"


class ProcessSidecar(SidecarProcess):
    """A real ``python -m kop_dedup serve`` process on a free port, logging into
    ``log_dir`` (kill, terminate, start again on the same port)."""

    def __init__(
        self, pulsar: Any, log_dir: Path, port: int | None = None, **settings: Any
    ) -> None:
        settings.setdefault("system_namespace", SESSION_SYSTEM_NAMESPACE)
        super().__init__(
            pulsar.service_url, pulsar.admin_url, log_dir=log_dir, port=port, **settings
        )
