"""``kop-dedup serve``: run the API under uvicorn.

uvicorn handles SIGTERM: it stops accepting connections, lets in-flight
requests finish (bounded by ``--graceful-seconds`` and half of
``shutdown_timeout_ms``), then runs the lifespan shutdown, which closes every part
within what is left of ``shutdown_timeout_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from kop_dedup.cli import add_pulsar_url_options

__all__ = ["add_cli", "serve"]

log = logging.getLogger(__name__)


def serve(settings: Any = None, *, graceful_seconds: float = 25.0) -> None:
    import uvicorn  # noqa: PLC0415

    from kop_dedup.observability.logs import configure  # noqa: PLC0415
    from kop_dedup.security.cleartext import Verdict, plaintext_auth  # noqa: PLC0415
    from kop_dedup.security.exposure import Exposed, exposure_refusal  # noqa: PLC0415
    from kop_dedup.settings import Settings  # noqa: PLC0415
    from kop_dedup.transports.http import create_app  # noqa: PLC0415

    settings = settings or Settings()
    refused = exposure_refusal(settings)
    if refused is not None:
        raise Exposed(refused)
    verdict, said = plaintext_auth(settings)
    if verdict is Verdict.REFUSE:
        raise Exposed(said)
    configure(settings.log_format, settings.log_level)
    if verdict is Verdict.WARN:
        log.warning("%s", said)
    app = create_app(settings)
    kafka = settings.kafka_address()
    scheme = "http" if settings.http_tls_cert is None else "https"
    print(
        f"kop-dedup listening on {scheme}://{settings.host}:{settings.port} "
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
        # requests in flight get half the shutdown budget; the parts close in the rest
        timeout_graceful_shutdown=max(
            1, int(min(graceful_seconds, settings.shutdown_timeout_ms / 2000))
        ),
        access_log=False,
        proxy_headers=False,
        server_header=False,
        ssl_certfile=settings.http_tls_cert,
        ssl_keyfile=settings.http_tls_key,
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
                loop.call_soon_threadsafe(runtime.begin_shutdown)
                _exit_after(runtime.settings.shutdown_timeout_ms / 1000)
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


def _exit_after(budget_s: float) -> None:
    """The last resort of a bounded stop: a process still alive ``budget_s`` after it
    was told to stop exits then. What keeps it is a thread blocked in a call to a
    broker that does not answer (Python waits for such threads at exit); everything
    acknowledged was durable when it was answered, and the parts had the budget to
    hand over what they own."""

    def hard_exit() -> None:
        log.warning(
            "stopping: still running %.1f s after the stop began (a call to the broker "
            "does not return): exiting now",
            budget_s,
        )
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(budget_s, hard_exit)
    timer.daemon = True
    timer.start()


def _handler(args: argparse.Namespace) -> int:
    from kop_dedup.security.cleartext import Verdict, plaintext_auth  # noqa: PLC0415
    from kop_dedup.security.exposure import Exposed, exposure_refusal  # noqa: PLC0415
    from kop_dedup.settings import Settings  # noqa: PLC0415

    overrides: dict[str, Any] = {}
    for name in ("host", "port", "pulsar_service_url", "pulsar_admin_url"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    settings = Settings(**overrides)
    refused = exposure_refusal(settings)
    if refused is not None:
        raise Exposed(refused)
    verdict, said = plaintext_auth(settings)
    if verdict is Verdict.REFUSE:  # the warning is logged once, by serve (each node's)
        raise Exposed(said)
    if args.nodes > 1:
        from kop_dedup.nodes import run_nodes  # noqa: PLC0415
        from kop_dedup.observability.logs import configure  # noqa: PLC0415

        configure(settings.log_format, settings.log_level)
        return run_nodes(
            args.nodes, settings, graceful_seconds=args.graceful_seconds, environ=os.environ
        )
    serve(settings, graceful_seconds=args.graceful_seconds)
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
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="run N nodes of the cluster on this host, one process each (HTTP port p..p+N-1, "
        "Kafka port k..k+N-1, node id +0..N-1 when KOP_DEDUP_NODE_ID is set); SIGTERM or "
        "SIGINT stops them together (default 1: this process serves)",
    )
    p.set_defaults(func=_handler)
