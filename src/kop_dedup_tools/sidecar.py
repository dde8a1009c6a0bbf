"""A ``kop-dedup serve`` subprocess on a free loopback port: for the benchmark and for
tests that kill, stop or restart a sidecar.

>>> sc = SidecarProcess("pulsar://127.0.0.1:6650", "http://127.0.0.1:8080", log_dir=out)
>>> sc.start()          # waits for /readyz; SidecarError with the log's tail if it exits
>>> sc.url, sc.kafka_bootstrap, sc.log_path   # HTTP, and the Kafka listener's host:port
>>> sc.kill()           # SIGKILL, as a crash; sc.start() again comes back on the same port
>>> sc.stop()           # SIGTERM (graceful), SIGKILL after a bound

Its output goes to ``<log_dir>/sidecar-<port>.log``, appended across restarts and never
deleted, so a failure that names the log can be read afterwards. :meth:`cpu_seconds`
and :meth:`rss_mb` sample the process (they need ``psutil``: ``pip install
'kop-dedup[bench]'``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import httpx

from kop_dedup_tools.processes import free_port

__all__ = ["SidecarError", "SidecarProcess", "log_tail", "wait_ready"]


class SidecarError(RuntimeError):
    """The sidecar did not start (exited, or never became ready); the message says why
    and ends with its log's tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log, or a note that there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or f"({path} is empty)"


def wait_ready(
    url: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll ``url``/readyz until it answers 200; TimeoutError (with the last answer or
    error) past ``timeout``, SidecarError at once when ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last: object = "no answer yet"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SidecarError(f"the sidecar exited with {proc.returncode} before it was ready")
        try:
            r = httpx.get(f"{url}/readyz", timeout=2)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    raise TimeoutError(f"sidecar at {url} not ready within {timeout}s: {last}")


def _psutil() -> Any:
    try:
        import psutil  # noqa: PLC0415 - only sampling needs it
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "sampling the sidecar's CPU and memory needs psutil: "
            "pip install 'kop-dedup[bench]' (or pip install psutil)"
        ) from exc
    return psutil


class SidecarProcess:
    """``python -m kop_dedup serve`` against the given broker; settings as keyword
    arguments (``reorder_window_ms=1500`` becomes ``KOP_DEDUP_REORDER_WINDOW_MS``)."""

    def __init__(
        self,
        service_url: str,
        admin_url: str,
        *,
        log_dir: Path,
        port: int | None = None,
        kafka_port: int | None = None,
        log_level: str = "WARNING",
        **settings: Any,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # a free port of its own, kept across restarts (never 9092: sidecars run side by side)
        self.kafka_port = kafka_port or free_port()
        self.kafka_bootstrap = f"127.0.0.1:{self.kafka_port}"
        self.log_path = Path(log_dir) / f"sidecar-{self.port}.log"
        self.env = {
            "KOP_DEDUP_PULSAR_SERVICE_URL": service_url,
            "KOP_DEDUP_PULSAR_ADMIN_URL": admin_url,
            "KOP_DEDUP_HOST": "127.0.0.1",
            "KOP_DEDUP_PORT": str(self.port),
            "KOP_DEDUP_KAFKA_LISTENER": self.kafka_bootstrap,
            "KOP_DEDUP_LOG_FORMAT": "json",
            "KOP_DEDUP_LOG_LEVEL": log_level,
            **{f"KOP_DEDUP_{k.upper()}": str(v) for k, v in settings.items()},
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self._ps: Any = None

    def start(self, timeout: float = 60.0) -> Self:
        """Start (again, after a kill or stop) and wait until ready."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kop_dedup", "serve"],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C meant for the caller does not reach it
            )
        self._ps = None
        try:
            wait_ready(self.url, timeout, self.proc)
        except (SidecarError, TimeoutError) as exc:
            self.stop()
            raise SidecarError(f"{exc}; log tail ({self.log_path}):\n{self.log_tail()}") from exc
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise SidecarError("the sidecar was never started")
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    # -- sampling (the benchmark) --------------------------------------------------

    def _process(self) -> Any:
        if self._ps is None:
            self._ps = _psutil().Process(self.pid)
        return self._ps

    def cpu_seconds(self) -> float:
        """User plus system CPU time the sidecar has used so far."""
        t = self._process().cpu_times()
        return float(t.user + t.system)

    def rss_mb(self) -> float:
        return float(self._process().memory_info().rss) / 2**20

    # -- stopping (faults and clean-up) -----------------------------------------------

    def kill(self) -> None:
        """SIGKILL: no graceful anything, as a crash."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM and wait for the exit status (the graceful stop)."""
        if self.proc is None:
            raise SidecarError("the sidecar was never started")
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; nothing when it is not running."""
        if self.running():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.terminate(timeout=timeout)
            self.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
