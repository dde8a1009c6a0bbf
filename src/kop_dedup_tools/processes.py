"""A local server run as a process group of its own, for the tools and the tests.

:class:`ProcessGroup` is the process control the local Pulsar broker
(:class:`~kop_dedup_tools.launcher.LocalPulsar`) and any other server the tools run on
this machine share: it starts the server in a new session with its output appended to
a log, finds it again through a pid file (from this process or a later one), and stops
it with a bound, kills, pauses and resumes its whole group. A server class says where
its pid file and log are, builds its command line, and says when it is ready:

>>> class Server(ProcessGroup):
...     pid_file = property(lambda self: self.data / "server.pid")
...     log_file = property(lambda self: self.data / "server.log")
...     def start(self) -> float:
...         started = time.monotonic()
...         proc = self.spawn(["bin/server", f"--port={free_port()}"], cwd=self.data, env=env)
...         return self.wait_ready(proc, started, 60.0, self.is_ready, name="Server")
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["BrokerError", "ProcessGroup", "free_port"]


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerError(RuntimeError):
    """The broker could not be fetched, started or stopped; the message says why."""


class ProcessGroup(abc.ABC):
    """Control of a server running in its own process group, found through its pid file.

    ``_proc`` is the child this process started (None when it found the server running,
    or started none): a child is reaped through its ``Popen``, which must be kept, since
    a dropped ``Popen`` of a live child warns.
    """

    _proc: subprocess.Popen[bytes] | None

    @property
    @abc.abstractmethod
    def pid_file(self) -> Path:
        """Where the running server's pid is kept."""

    @property
    @abc.abstractmethod
    def log_file(self) -> Path:
        """Where the server's output is appended (across restarts; never deleted here)."""

    def spawn(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a new session (its own process group), output appended to
        the log; the pid file names it."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            proc = subprocess.Popen(  # noqa: S603 - a server's own launcher script
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        self._proc = proc
        return proc

    def wait_ready(
        self,
        proc: subprocess.Popen[bytes],
        started: float,
        timeout: float,
        ready: Callable[[], bool],
        *,
        name: str,
    ) -> float:
        """Poll ``ready()`` until it holds; the seconds since ``started``. A
        :class:`BrokerError` with the log's tail when ``proc`` exits first, or (after
        stopping it) when ``timeout`` passes."""
        deadline = started + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(
                    f"{name} exited with {proc.returncode} before it was ready; "
                    f"log tail ({self.log_file}):\n{self.log_tail()}"
                )
            if ready():
                return time.monotonic() - started
            time.sleep(0.5)
        self.stop()
        raise BrokerError(
            f"{name} was not ready within {timeout:.0f}s; log tail ({self.log_file}):\n"
            f"{self.log_tail()}"
        )

    def pid(self) -> int | None:
        """The running server's pid (from the pid file), or None when it is not running."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _signal(self, sig: signal.Signals) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        return True

    def stop(self, timeout: float = 60.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``; True when something was running."""
        pid = self.pid()
        if pid is None:
            return False
        self._signal(signal.SIGCONT)  # a paused server cannot shut down
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._alive(pid):
            time.sleep(0.2)
        if self._alive(pid):
            self._signal(signal.SIGKILL)
            while self._alive(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def _alive(self, pid: int) -> bool:
        proc = self._proc
        if proc is not None and proc.pid == pid:
            return proc.poll() is None  # reaps our own child, and Popen knows it ended
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the server's process group, as a crash would."""
        pid = self.pid()
        self._signal(signal.SIGKILL)
        while pid is not None and self._alive(pid):
            time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def rss_bytes(self) -> int | None:
        pid = self.pid()
        if pid is None:
            return None
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
