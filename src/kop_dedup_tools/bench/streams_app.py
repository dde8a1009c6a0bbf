"""The Kafka Streams application of ``kop-dedup bench --streams-restart``
(``StreamsStore.java`` beside this module: the latest value of each input key in a
RocksDB store with its changelog, ``processing.guarantee=exactly_once_v2``), run as a
JVM in a session of its own, and what it says: its state changes, the records it
processed, each changelog partition's restore (from and to offsets, records, ms), and
the checkpoints it wrote.

>>> app = StoreApp(workdir, bootstrap, "store-1", "in", value_bytes=4096).start()
>>> app.wait_running(120)          # seconds from start to RUNNING
>>> app.stop()                     # SIGTERM: a last commit, the checkpoints written
>>> app.start(); app.wait_running(600); restore_of(app.lines())
>>> app.kill()                     # SIGKILL: no commit, no checkpoint

The same application as the tests' (``tests/kafka_streams.py``, ``tests/java/``):
compiled once into a directory named by the source's digest, the same Kafka jars, the
same 6 s session so a killed member leaves soon.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from kop_dedup_tools import kafka_jars

__all__ = ["Restore", "StoreApp", "checkpoints", "processed_of", "restore_of"]

_APP = Path(__file__).with_name("StreamsStore.java")
_MAIN = "StreamsStore"


@functools.cache
def compiled() -> Path:
    """The application's classes, compiled once (``javac`` from the JDK that runs Kafka)."""
    return kafka_jars.compiled_classes(_APP, "kop-dedup-streams-store")


@dataclass
class Restore:
    """What one start restored: per changelog partition the offsets it restored from and
    to and the records (from the restore listener), and the seconds from the first
    partition's start to the last one's end."""

    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    records: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.records.values())


def restore_of(lines: list[str]) -> Restore:
    """The restore a run's lines tell of (``restore-start <topic> <p> <from> <to>``,
    ``restore-end <topic> <p> <records> <ms>``, each stamped ``<ms since start>`` first
    by :class:`StoreApp`); partitions with no ``restore-end`` have restored nothing yet.
    A partition restored twice (a task moved and back) counts both."""
    out = Restore()
    first: float | None = None
    last: float | None = None
    for line in lines:
        stamp, _, text = line.partition(" ")
        words = text.split()
        if len(words) == 5 and words[0] == "restore-start":
            p = int(words[2])
            out.ranges[p] = (int(words[3]), int(words[4]))
            first = float(stamp) if first is None else first
        elif len(words) == 5 and words[0] == "restore-end":
            p = int(words[2])
            out.records[p] = out.records.get(p, 0) + int(words[3])
            last = float(stamp)
    if first is not None and last is not None:
        out.seconds = max(0.0, (last - first) / 1000)
    return out


def processed_of(lines: list[str]) -> int:
    """The last ``processed <n>`` a run said (0 before its first)."""
    for line in reversed(lines):
        words = line.split()
        if len(words) == 3 and words[1] == "processed":
            return int(words[2])
    return 0


def checkpoints(state: Path, changelog: str) -> dict[int, int]:
    """The changelog offsets Streams wrote in its tasks' checkpoint files (``<state
    dir>/<application id>/<task>/.checkpoint``: a version, a count, then one "topic
    partition offset" line each)."""
    found: dict[int, int] = {}
    for path in state.glob("*/.checkpoint"):
        for line in path.read_text().splitlines()[2:]:
            topic, partition, offset = line.split()
            if topic == changelog:
                found[int(partition)] = int(offset)
    return found


class StoreApp:
    """One instance of the application; ``start`` again after ``stop`` or ``kill`` keeps
    the application id and the state directory (a restart on the same machine)."""

    def __init__(
        self,
        workdir: Path,
        bootstrap: str,
        application_id: str,
        source: str,
        *,
        value_bytes: int,
        commit_interval_ms: int = 100,
    ) -> None:
        self.workdir, self.application_id = workdir, application_id
        self.state = workdir / "state"
        self.args = [
            bootstrap,
            application_id,
            source,
            str(self.state),
            str(value_bytes),
            str(commit_interval_ms),
        ]
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "streams.log"
        self.log_config = workdir / "log4j2.properties"
        self.log_config.write_text(kafka_jars.STREAMS_LOG4J.format(log=self.log))
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.started = 0.0
        self._out: Path | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def changelog(self) -> str:
        return f"{self.application_id}-store-changelog"

    def start(self, *, new_state: bool = False) -> Self:
        """Start (again) with the same state directory, or with ``new_state`` an empty
        one (as on another machine: every store restored from its changelog's start)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if new_state:
            self.state = self.workdir / f"state-{self.runs + 1}"
            self.args[3] = str(self.state)
        cmd = kafka_jars.java_command(
            _MAIN,
            *self.args,
            heap="512m",
            jvm_options=("-XX:+UseSerialGC",),
            log_config=self.log_config,
            classes=compiled(),
        )
        self.runs += 1
        self._lines = []
        self._out = self.workdir / f"run-{self.runs}.out"
        self.started = time.monotonic()
        self.proc = subprocess.Popen(  # noqa: S603 - java on our own classes
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        """Each line the JVM prints, stamped with the ms since :meth:`start`, kept and
        written to ``run-<n>.out``."""
        assert proc.stdout is not None
        assert self._out is not None
        with self._out.open("a") as out:
            for raw in proc.stdout:
                ms = (time.monotonic() - self.started) * 1000
                line = f"{ms:.0f} {raw.decode(errors='replace').rstrip()}"
                self._lines.append(line)
                out.write(line + "\n")
                out.flush()

    def lines(self) -> list[str]:
        """This run's stamped lines (``<ms since start> <line>``) so far."""
        return list(self._lines)

    def running_after(self) -> float | None:
        """The seconds from this run's start to its first ``-> RUNNING`` (None: not yet)."""
        for line in self.lines():
            if line.endswith("-> RUNNING"):
                return float(line.split(" ", 1)[0]) / 1000
        return None

    def wait_running(self, timeout: float) -> float:
        """Until this run reached RUNNING (its tasks assigned, its stores restored); the
        seconds it took from the start. RuntimeError with the tail when it exited or
        timed out."""
        deadline = time.monotonic() + timeout
        while (seconds := self.running_after()) is None:
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"Streams not RUNNING in {timeout:.0f}s: {self.tail()}")
            time.sleep(0.2)
        return seconds

    def check(self) -> None:
        """RuntimeError with the tail when the application exited or failed."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"Streams exited {self.proc.returncode}: {self.tail()}")
        if any(" uncaught " in line or line.endswith("-> ERROR") for line in self.lines()):
            raise RuntimeError(f"Streams failed: {self.tail()}")

    def tail(self, lines: int = 30) -> str:
        parts = ["\n".join(self.lines()[-lines:])]
        with contextlib.suppress(OSError):
            parts.append("\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n---- log ----\n".join(parts)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group: no commit, no checkpoint, no leave."""
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        self._drained()

    def _drained(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=10)

    def stop(self, grace: float = 120.0) -> bool:
        """SIGTERM the JVM (close: a last commit, the checkpoints, the group left), SIGKILL
        after ``grace``; whether it closed within it."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
            return False
        self._drained()
        return True
