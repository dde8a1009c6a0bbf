"""What every ``kop-dedup bench`` mode runs on: failures that say what failed, the
sidecar processes and their CPU, progress lines, topics, the order of targets.

>>> sc = start_sidecar(args)                   # logs into --out; says where
>>> with step("the transactions run", sc):     # a failure names the step and the log
...     cells = run(...)
>>> say(cell.progress())
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = [
    "RUN_SYSTEM_NAMESPACE",
    "BenchError",
    "Sidecars",
    "cpu_seconds",
    "describe_failure",
    "full_topic",
    "new_topic",
    "random_values",
    "running_sidecars",
    "say",
    "sidecar_settings",
    "start_sidecar",
    "step",
    "turns",
]


class BenchError(RuntimeError):
    """A benchmark step failed; the message names the step, the exception's type and
    message, and (when a sidecar ran) where its log is, with the log's tail."""


class Sidecars:
    """The sidecar processes of a run (``--sidecars N``): producer ``i`` talks to
    process ``i % N``, so each producer id is served by exactly one process (the broker
    refuses a second holder of a producer name). CPU and RSS are summed."""

    def __init__(self, procs: Sequence[SidecarProcess]) -> None:
        self.procs = list(procs)

    def url_for(self, producer: int) -> str:
        return self.procs[producer % len(self.procs)].url

    def cpu_seconds(self) -> float:
        return sum(sc.cpu_seconds() for sc in self.procs)

    def rss_mb(self) -> float:
        return sum(sc.rss_mb() for sc in self.procs)

    def __len__(self) -> int:
        return len(self.procs)


def cpu_seconds(sidecar: SidecarProcess | Sidecars | None) -> float:
    """The sidecar's CPU seconds so far (0 without one): a cell takes the difference."""
    return 0.0 if sidecar is None else sidecar.cpu_seconds()


def describe_failure(
    what: str, exc: BaseException, sc: SidecarProcess | Sidecars | None = None
) -> str:
    """``<what> failed: <Type>: <message>`` and each sidecar's state and log tail. An
    exception without a message (httpx's timeouts, a bare ``TimeoutError``) still
    names its type."""
    lines = [f"{what} failed: {type(exc).__name__}: {str(exc).strip() or '(no message)'}"]
    if exc.__cause__ is not None:
        cause = exc.__cause__
        lines.append(f"caused by {type(cause).__name__}: {str(cause).strip() or '(no message)'}")
    for one in sc.procs if isinstance(sc, Sidecars) else [] if sc is None else [sc]:
        proc = one.proc
        state = (
            "never started"
            if proc is None
            else "running"
            if proc.poll() is None
            else f"exited with {proc.returncode}"
        )
        lines += [f"sidecar {one.url} {state}; log {one.log_path}, last lines:", one.log_tail(20)]
    return "\n".join(lines)


@contextlib.contextmanager
def step(what: str, sc: SidecarProcess | Sidecars | None = None) -> Iterator[None]:
    """Turn any failure inside into a :class:`BenchError` that says what failed."""
    try:
        yield
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(describe_failure(what, exc, sc)) from exc


def say(msg: str) -> None:
    """A progress line (stderr: stdout is the report)."""
    print(msg, file=sys.stderr, flush=True)


RUN_SYSTEM_NAMESPACE = f"kop-dedup-bench-{uuid.uuid4().hex[:8]}"
"""The system namespace of this run's sidecars: the run's own, so that they form a
cluster of their own. Sidecars of one system namespace are one cluster: two benches on
one broker (developers sharing it, a bench beside a test session) joined each other's
cluster with the default one and forwarded batches of the partitions the other node led
to it, measuring both at once. ``KOP_DEDUP_SYSTEM_NAMESPACE`` in the environment, or a
``system_namespace`` setting, still wins."""


def sidecar_settings(**settings: Any) -> dict[str, Any]:
    """``settings`` with the run's system namespace unless one is given."""
    if "system_namespace" not in settings and "KOP_DEDUP_SYSTEM_NAMESPACE" not in os.environ:
        settings["system_namespace"] = RUN_SYSTEM_NAMESPACE
    return settings


def start_sidecar(args: argparse.Namespace, **settings: Any) -> SidecarProcess:
    """A sidecar subprocess logging into the --out dir (kept), at the default log level
    (what a deployment pays), in the run's system namespace (:data:`RUN_SYSTEM_NAMESPACE`)."""
    sc = SidecarProcess(
        args.pulsar_service_url,
        args.pulsar_admin_url,
        log_dir=Path(args.out),
        log_level="INFO",
        **sidecar_settings(**settings),
    )
    with step("starting the sidecar"):
        sc.start()
    say(f"bench: sidecar at {sc.url}, log {sc.log_path}")
    return sc


@contextlib.contextmanager
def running_sidecars(args: argparse.Namespace, count: int = 1) -> Iterator[Sidecars]:
    """``count`` sidecar processes for the run, each stopped at the end."""
    started: list[SidecarProcess] = []
    try:
        started.extend(start_sidecar(args) for _ in range(count))  # kept as each starts
        yield Sidecars(started)
    finally:
        for sc in started:
            sc.stop()


def turns(targets: Sequence[str], rep: int, *, alternate: bool = True) -> list[str]:
    """The order the targets run in repetition ``rep`` (from 1): as given in odd
    repetitions, reversed in even ones (unless not ``alternate``)."""
    return list(targets) if rep % 2 or not alternate else list(targets)[::-1]


def new_topic(args: argparse.Namespace, partitions: int = 1, stem: str = "bench") -> str:
    """A fresh topic (its short name) for one cell."""
    topic = f"{stem}-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic, partitions=partitions)
    return topic


def full_topic(topic: str) -> str:
    return f"persistent://public/kafka/{topic}"


def random_values(n: int, size: int) -> list[bytes]:
    return [os.urandom(size // 2).hex().encode()[:size] for _ in range(n)]
