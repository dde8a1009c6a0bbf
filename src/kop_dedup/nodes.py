"""Several nodes on one host: ``kop-dedup serve --nodes N``.

Python runs one core per process, so a host with N cores serves best as N nodes of the
cluster. ``serve --nodes N`` starts N ``kop-dedup serve`` processes from the same
settings, node ``i`` (0-based) with every address shifted by ``i``:

- the HTTP API on ``port + i`` and the Kafka listener on ``kafka port + i`` (a port of 0
  stays 0: a free port each);
- ``KOP_DEDUP_KAFKA_ADVERTISED`` and an explicit ``KOP_DEDUP_PEER_URL`` on their port
  ``+ i`` (the host stays);
- ``KOP_DEDUP_NODE_ID`` ``+ i`` when it is set (otherwise each node derives its id from
  its own addresses, as a single node does).

They share the system namespace, so they are one cluster with every other node of it.
The supervisor forwards SIGTERM and SIGINT to every node once (each stops gracefully,
within ``KOP_DEDUP_SHUTDOWN_TIMEOUT_MS``), waits for them all and exits 0 when they all
did; a node still running after the budget (and a margin) is killed. A node that exits
by itself is started again after a second when it had run at least
:data:`STEADY_S`; one that exits sooner (its port taken, a setting wrong) stops the
others and its status is the supervisor's. On Linux each node also gets SIGTERM if the
supervisor dies without passing the stop on.

>>> env = node_env(Settings(port=8090, kafka_listener="0.0.0.0:9092", node_id=4), 1)
>>> env["KOP_DEDUP_PORT"], env["KOP_DEDUP_KAFKA_LISTENER"], env["KOP_DEDUP_NODE_ID"]
('8091', '0.0.0.0:9093', '5')
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

from kop_dedup.settings import Settings, split_address

__all__ = ["STEADY_S", "node_env", "run_nodes"]

log = logging.getLogger(__name__)

STEADY_S = 10.0
"""A node that ran this long before it exited is started again; one that exited sooner
failed to start, and the supervisor stops."""
_RESTART_DELAY_S = 1.0
_STOP_MARGIN_S = 5.0
_POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


def _shift(address: str, by: int, name: str) -> str:
    host, port = split_address(address, name)
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port + by if port else 0}"


def _shift_url(url: str, by: int) -> str:
    parts = urlsplit(url)
    if parts.port is None:
        return url
    netloc = f"{parts.hostname}:{parts.port + by}"
    if ":" in (parts.hostname or ""):
        netloc = f"[{parts.hostname}]:{parts.port + by}"
    return urlunsplit(parts._replace(netloc=netloc))


def node_env(settings: Settings, index: int) -> dict[str, str]:
    """The settings that differ for node ``index`` (0-based), as ``KOP_DEDUP_*``
    environment variables."""
    env = {
        "KOP_DEDUP_HOST": settings.host,
        "KOP_DEDUP_PORT": str(settings.port + index if settings.port else 0),
        "KOP_DEDUP_PULSAR_SERVICE_URL": settings.pulsar_service_url,
        "KOP_DEDUP_PULSAR_ADMIN_URL": settings.pulsar_admin_url,
    }
    if settings.kafka_listener.strip():
        env["KOP_DEDUP_KAFKA_LISTENER"] = _shift(settings.kafka_listener, index, "kafka_listener")
    if settings.kafka_advertised:
        env["KOP_DEDUP_KAFKA_ADVERTISED"] = _shift(
            settings.kafka_advertised, index, "kafka_advertised"
        )
    if settings.peer_url:
        env["KOP_DEDUP_PEER_URL"] = _shift_url(settings.peer_url, index)
    if settings.node_id is not None:
        env["KOP_DEDUP_NODE_ID"] = str(settings.node_id + index)
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Node:
    def __init__(self, index: int, env: Mapping[str, str], argv: Sequence[str]) -> None:
        self.index, self.env, self.argv = index, dict(env), list(argv)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(  # noqa: S603 - this interpreter running kop_dedup
            self.argv,
            env=self.env,
            # a Ctrl-C in the terminal reaches the supervisor only: it passes one stop on
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        log.info(
            "node %d: pid %d, HTTP port %s, Kafka %s",
            self.index,
            self.proc.pid,
            self.env.get("KOP_DEDUP_PORT"),
            self.env.get("KOP_DEDUP_KAFKA_LISTENER", "off"),
        )

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)


def run_nodes(
    count: int,
    settings: Settings,
    *,
    graceful_seconds: float,
    environ: Mapping[str, str],
    command: Sequence[str] | None = None,
) -> int:
    """Run ``count`` nodes until a stop; the supervisor's exit status. ``command``: what
    each node runs (default: this interpreter running ``kop_dedup serve``)."""
    if count > 1 and settings.port == 0:
        raise ValueError("serve --nodes needs a base HTTP port (KOP_DEDUP_PORT or --port), not 0")
    serve = ["-m", "kop_dedup", "serve", "--graceful-seconds", str(graceful_seconds)]
    argv = list(command) if command else [sys.executable, *serve]
    nodes = [_Node(i, {**environ, **node_env(settings, i)}, argv) for i in range(count)]
    stopping: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        if not stopping:
            stopping.append(signum)
            for node in nodes:
                node.signal(signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for node in nodes:
            if not stopping:
                node.start()
        status = _supervise(nodes, stopping)
        if status is not None:  # a node failed at its start: stop the others (a stop asked
            for node in nodes:  # was passed on once already: a second SIGTERM could land
                node.signal(signal.SIGTERM)  # after a node's handlers and kill it)
        return _wait_all(nodes, settings.shutdown_timeout_ms / 1000 + _STOP_MARGIN_S, status)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(nodes: list[_Node], stopping: list[int]) -> int | None:
    """Until a stop is asked (None) or a node fails at its start (its status)."""
    while not stopping:
        time.sleep(_POLL_S)
        for node in nodes:
            code = None if node.proc is None else node.proc.poll()
            if code is None or stopping:
                continue
            ran = time.monotonic() - node.started
            if ran < STEADY_S:
                log.error(
                    "node %d exited with %d %.1f s after its start: stopping the others",
                    node.index,
                    code,
                    ran,
                )
                return code or 1
            log.warning(
                "node %d exited with %d after %.0f s: starting it again", node.index, code, ran
            )
            time.sleep(_RESTART_DELAY_S)
            if not stopping:
                node.start()
    return None


def _wait_all(nodes: list[_Node], budget_s: float, status: int | None) -> int:
    """Wait for every node to exit (killing one still running after ``budget_s``); the
    supervisor's status: ``status`` when a node failed, else 0 when every node exited 0."""
    deadline = time.monotonic() + budget_s
    codes = []
    for node in nodes:
        if node.proc is None:
            continue
        try:
            codes.append(node.proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            log.warning("node %d still ran %.0f s after the stop: killed", node.index, budget_s)
            node.signal(signal.SIGKILL)
            codes.append(node.proc.wait())
    if status is not None:
        return status
    return 0 if all(code == 0 for code in codes) else 1
