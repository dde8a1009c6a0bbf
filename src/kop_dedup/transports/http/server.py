"""``kop-dedup serve``: run the API under uvicorn.

uvicorn handles SIGTERM: it stops accepting connections, lets in-flight
requests finish (bounded by ``--graceful-seconds``), then runs the lifespan
shutdown, which flushes and closes every Pulsar producer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from kop_dedup.cli import add_pulsar_url_options

__all__ = ["add_cli", "serve"]

log = logging.getLogger(__name__)


def serve(settings: Any = None, *, graceful_seconds: float = 25.0) -> None:
    import uvicorn  # noqa: PLC0415

    from kop_dedup.observability.logs import configure  # noqa: PLC0415
    from kop_dedup.settings import Settings  # noqa: PLC0415
    from kop_dedup.transports.http import create_app  # noqa: PLC0415

    settings = settings or Settings()
    configure(settings.log_format, settings.log_level)
    app = create_app(settings)
    kafka = settings.kafka_address()
    print(
        f"kop-dedup listening on http://{settings.host}:{settings.port} "
        f"(Pulsar {settings.pulsar_service_url}, admin {settings.pulsar_admin_url}, "
        f"namespace {settings.tenant}/{settings.namespace}); API docs at /docs; "
        + ("Kafka listener off" if kafka is None else f"Kafka clients at {kafka[0]}:{kafka[1]}"),
        flush=True,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        timeout_graceful_shutdown=int(graceful_seconds),
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )
    _server_class()(config).run()


def _server_class() -> Any:
    import uvicorn  # noqa: PLC0415

    class Server(uvicorn.Server):
        """uvicorn's server, telling the produce service at the first SIGTERM/SIGINT."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            runtime = (
                getattr(self.config.app.state, "runtime", None)
                if hasattr(self.config.app, "state")
                else None
            )
            loop = getattr(self, "_loop", None)
            if runtime is not None and loop is not None:
                loop.call_soon_threadsafe(runtime.service.begin_shutdown)
            super().handle_exit(sig, frame)

        async def serve(self, sockets: Any = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the captured signal once it has stopped, so the process
            # would die "by SIGTERM"; a completed graceful stop is a clean exit (status 0)
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    return Server


def _handler(args: argparse.Namespace) -> int:
    from kop_dedup.settings import Settings  # noqa: PLC0415

    overrides: dict[str, Any] = {}
    for name in ("host", "port", "pulsar_service_url", "pulsar_admin_url"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    serve(Settings(**overrides), graceful_seconds=args.graceful_seconds)
    return 0


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the HTTP sidecar",
        description="Run the HTTP sidecar. Settings come from KOP_DEDUP_* env vars; "
        "these flags override them.",
    )
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    add_pulsar_url_options(p, env_defaults=False)  # Settings reads the env and .env
    p.add_argument("--graceful-seconds", type=float, default=25.0)
    p.set_defaults(func=_handler)
