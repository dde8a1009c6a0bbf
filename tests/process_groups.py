"""Stopping a test's child process that runs in a session of its own (a JVM started
with ``start_new_session=True``: Kafka Connect, a Kafka Streams app), the whole group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any

__all__ = ["kill_group", "stop_group"]


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group and reap its leader (nothing when it has exited)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_group(proc: subprocess.Popen[Any], grace: float) -> int:
    """SIGTERM the process group (a graceful stop), SIGKILL after ``grace`` seconds; the
    leader's exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_group(proc)
    return proc.returncode
