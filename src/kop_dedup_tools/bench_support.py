"""What every ``kop-dedup bench`` mode runs on: its failures that say what failed, its
sidecar processes, its progress lines and topics, and how a mode is registered.

>>> sc = start_sidecar(args)                   # logs into --out; says where
>>> with step("the transactions run", sc):     # a failure names the step and the log
...     cells = run(...)
>>> say(f"bench: {cell.records_per_s:,.0f} rec/s")

A mode of its own (``--groups``, ``--transactions``, ``--memory``; the default is the
matrix) is a :class:`BenchMode` in its module, registered in
:data:`kop_dedup_tools.bench._MODES` with its options added in
:func:`kop_dedup_tools.bench.add_cli`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = [
    "BenchError",
    "BenchMode",
    "Sidecars",
    "describe_failure",
    "full_topic",
    "new_topic",
    "running_sidecars",
    "say",
    "start_sidecar",
    "step",
]


class BenchError(RuntimeError):
    """A benchmark step failed; the message names the step, the exception's type and
    message, and (when a sidecar ran) where its log is, with the log's tail."""


@dataclass(frozen=True, slots=True)
class BenchMode:
    """One way ``kop-dedup bench`` runs besides the default matrix.

    It is chosen when every option in ``flags`` (argparse names: ``("kafka",
    "groups")`` for ``--kafka --groups``) is set; ``add_options`` adds them and the
    mode's own options to the command; ``run(args, out, broker)`` measures against the
    run's broker (its URLs in ``args``; ``broker`` describes it for the results file),
    writes its results under ``out`` and prints its report.
    """

    flags: tuple[str, ...]
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Path, dict[str, Any]], None]

    def chosen(self, args: argparse.Namespace) -> bool:
        return all(getattr(args, flag, False) for flag in self.flags)


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
        lines.extend(_sidecar_state(one))
    return "\n".join(lines)


def _sidecar_state(sc: SidecarProcess) -> list[str]:
    proc = sc.proc
    state = (
        "never started"
        if proc is None
        else "running"
        if proc.poll() is None
        else f"exited with {proc.returncode}"
    )
    return [f"sidecar {sc.url} {state}; log {sc.log_path}, last lines:", sc.log_tail(20)]


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


def start_sidecar(args: argparse.Namespace, **settings: Any) -> SidecarProcess:
    """A sidecar subprocess logging into the --out dir (kept), at the default log level
    (what a deployment pays)."""
    sc = SidecarProcess(
        args.pulsar_service_url,
        args.pulsar_admin_url,
        log_dir=Path(args.out),
        log_level="INFO",
        **settings,
    )
    with step("starting the sidecar"):
        sc.start()
    say(f"bench: sidecar at {sc.url}, log {sc.log_path}")
    return sc


@contextlib.contextmanager
def running_sidecars(args: argparse.Namespace) -> Iterator[Sidecars]:
    """``--sidecars`` processes for the run, each stopped at the end."""
    started: list[SidecarProcess] = []
    try:
        started.extend(start_sidecar(args) for _ in range(args.sidecars))  # kept as each starts
        yield Sidecars(started)
    finally:
        for sc in started:
            sc.stop()


def new_topic(args: argparse.Namespace) -> str:
    """A fresh one-partition topic (its short name) for one cell."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic)
    return topic


def full_topic(topic: str) -> str:
    return f"persistent://public/kafka/{topic}"
