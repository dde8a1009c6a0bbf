"""Run the sidecar for tests: in a thread (uvicorn on a real socket) or as a process.

Both talk to the session's real broker. ``ThreadSidecar`` is cheap and is what
most API tests use; ``ProcessSidecar`` is a real ``kop-dedup serve`` process
that fault tests can SIGKILL and restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn

from kop_dedup.settings import Settings
from kop_dedup.transports.http import create_app
from kop_dedup_tools.launcher import free_port


def wait_ready(
    url: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"sidecar exited with {proc.returncode} before it was ready")
        try:
            r = httpx.get(f"{url}/readyz", timeout=2)
            if r.status_code == 200:
                return
            last = r.text
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"sidecar at {url} not ready within {timeout}s: {last}")


def sidecar_env(pulsar: Any, **overrides: Any) -> dict[str, str]:
    env = {
        "KOP_DEDUP_PULSAR_SERVICE_URL": pulsar.service_url,
        "KOP_DEDUP_PULSAR_ADMIN_URL": pulsar.admin_url,
        "KOP_DEDUP_LOG_FORMAT": "json",
        "KOP_DEDUP_LOG_LEVEL": "WARNING",
    }
    env.update({f"KOP_DEDUP_{k.upper()}": str(v) for k, v in overrides.items()})
    return env


class ThreadSidecar:
    """uvicorn serving create_app() in a background thread on a free port."""

    def __init__(self, pulsar: Any, **settings: Any) -> None:
        self.port = free_port()
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

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProcessSidecar:
    """A real `python -m kop_dedup serve` process on a free port."""

    def __init__(
        self, pulsar: Any, log_dir: Path, port: int | None = None, **settings: Any
    ) -> None:
        self.pulsar, self.settings = pulsar, settings
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"sidecar-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> ProcessSidecar:
        env = {
            **os.environ,
            **sidecar_env(self.pulsar, **self.settings),
            "KOP_DEDUP_PORT": str(self.port),
            "KOP_DEDUP_HOST": "127.0.0.1",
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kop_dedup", "serve"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_ready(self.url, timeout, self.proc)
        return self

    def kill(self) -> None:
        """SIGKILL: no graceful anything, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 40.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.terminate(timeout=20)
            self.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
