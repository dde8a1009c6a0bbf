"""The soak's copiers as processes, and their supervisor.

Two pipelines copy the same input topic, each in its own consumer group into its own
output topic:

- ``java``: Kafka's own ``org.apache.kafka.tools.TransactionalMessageCopier`` (from the
  kafka-tools jar ``kop-dedup kafka fetch`` resolves) in group mode, with the consumer's
  group metadata and random aborts, as Kafka's ``transactions_test.py`` runs it. It
  prints JSON status lines (``stage``, ``totalProcessed``, ``remaining``) and exits 0
  once its assigned partitions are copied up to their end at assignment;
- ``librdkafka``: :mod:`kop_dedup_tools.soak_copier` (confluent-kafka).

:class:`Supervisor` (a thread) keeps every copier of a pipeline running until the
pipeline's group has committed the input's end on every partition and the soak has
stopped adding input, as a deployment restarts a copier that died: a copier that exited
(a fault made it fail, or a Java copier that had caught up before more input came) is
started again with the same transactional id (which fences what its last incarnation
left open), after a back-off. A copier that printed nothing for ``hang_s`` (both print
at least every 10 s while they run: the Java one before every poll, the librdkafka one
an ``idle`` line) is hung: it is SIGKILLed and started again, and the hang is noted.
Each restart is noted (:class:`Restart`). Once a pipeline is done its copiers get
SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup_tools import kafka_jars

__all__ = ["CopierProcess", "Pipeline", "Restart", "Supervisor", "java_copier", "rdkafka_copier"]

_JAVA_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")  # a small, quick JVM
_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)
_STEADY_S = 30.0  # a copier that ran this long before it exited starts the back-off anew


@dataclass(frozen=True, slots=True)
class Restart:
    at_s: float
    copier: str
    status: int | None
    reason: str


class CopierProcess:
    """One copier (by name and transactional id), started again as often as needed;
    its output appended to ``<dir>/<name>.out`` / ``.err`` across incarnations."""

    def __init__(
        self, name: str, argv: Callable[[int], list[str]], log_dir: Path, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self._argv = argv
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.err"
        self._env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnation = -1
        self.exited_at: float | None = None
        self.started_at = 0.0

    def start(self) -> None:
        self.incarnation += 1
        self.stdout_path.parent.mkdir(parents=True, exist_ok=True)
        with self.stdout_path.open("ab") as out, self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(  # noqa: S603 - our own copier or Kafka's tool
                self._argv(self.incarnation),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,
            )
        self.exited_at = None
        self.started_at = time.monotonic()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def silent_s(self) -> float:
        """Seconds since it last printed a line (or started)."""
        try:
            printed = self.stdout_path.stat().st_mtime
        except OSError:
            printed = 0.0
        return min(time.time() - printed, time.monotonic() - self.started_at)

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, SIGKILL after ``grace``."""
        if self.proc is None:
            return
        if self.running():
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        self.proc.wait()

    def kill(self) -> None:
        if self.running():
            self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines printed so far, every incarnation's."""
        out: list[dict[str, Any]] = []
        try:
            text = self.stdout_path.read_text(errors="replace")
        except OSError:
            return out
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    out.append(value)
        return out

    def last_line(self) -> str:
        events = self.events()
        return json.dumps(events[-1])[:300] if events else "(no output)"

    def last_words(self) -> str:
        """Why it ended, as far as its output says: the last exception line of stderr,
        else its last JSON line."""
        try:
            err = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError:
            err = []
        for line in reversed(err[-200:]):
            if "Exception" in line or "Error" in line:
                return line.strip()[:300]
        events = self.events()
        return json.dumps(events[-1])[:300] if events else "(no output)"


def java_copier(
    name: str,
    *,
    bootstrap: str,
    group: str,
    input_topic: str,
    output_topic: str,
    log_dir: Path,
    transaction_size: int,
    random_aborts: bool = True,
) -> CopierProcess:
    """Kafka's TransactionalMessageCopier in group mode (transactional id = ``name``)."""
    args = [
        *("--broker-list", bootstrap, "--transactional-id", name),
        *("--input-topic", input_topic, "--input-partition", "0"),
        *("--output-topic", output_topic, "--consumer-group", group),
        *("--max-messages", "-1", "--transaction-size", str(transaction_size)),
        *("--transaction-timeout", "60000", "--use-group-metadata", "--group-mode"),
        *(("--enable-random-aborts",) if random_aborts else ()),
    ]
    cmd = kafka_jars.java_command(
        kafka_jars.TRANSACTIONAL_MESSAGE_COPIER, *args, heap="192m", jvm_options=_JAVA_OPTIONS
    )
    return CopierProcess(name, lambda _incarnation: cmd, log_dir, os.environ)


def rdkafka_copier(
    name: str,
    *,
    bootstrap: str,
    group: str,
    input_topic: str,
    output_topic: str,
    log_dir: Path,
    transaction_size: int,
    batch_records: int,
    abort_rate: float,
    seed: int,
) -> CopierProcess:
    """:mod:`kop_dedup_tools.soak_copier` (transactional id = ``name``)."""

    def argv(incarnation: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "kop_dedup_tools.soak_copier",
            *("--bootstrap", bootstrap, "--group", group, "--transactional-id", name),
            *("--input", input_topic, "--output", output_topic),
            *("--incarnation", str(incarnation), "--seed", str(seed)),
            *("--transaction-size", str(transaction_size)),
            *("--batch-records", str(batch_records), "--abort-rate", str(abort_rate)),
        ]

    return CopierProcess(name, argv, log_dir, {**os.environ, "PYTHONUNBUFFERED": "1"})


@dataclass
class Pipeline:
    name: str
    group: str
    output_topic: str
    copiers: list[CopierProcess]
    committed: dict[int, int] = field(default_factory=dict)
    """The group's committed offsets of the input, as last asked."""
    done_at: float | None = None

    def committed_total(self) -> int:
        return sum(self.committed.values())


class Supervisor(threading.Thread):
    """Keeps the pipelines' copiers running until each is done (see the module
    docstring). ``committed(group)`` and ``input_end()`` ask the cluster (they may raise
    while it is down: the supervisor asks again later)."""

    def __init__(
        self,
        pipelines: Sequence[Pipeline],
        *,
        committed: Callable[[str], dict[int, int]],
        input_end: Callable[[], dict[int, int]],
        clock: Callable[[], float],
        poll_s: float = 0.5,
        ask_every_s: float = 2.0,
        hang_s: float = 90.0,
    ) -> None:
        super().__init__(name="soak-supervisor", daemon=True)
        self.pipelines = list(pipelines)
        self._committed, self._input_end, self._clock = committed, input_end, clock
        self._poll_s, self._ask_every_s, self._hang_s = poll_s, ask_every_s, hang_s
        self.restarts: list[Restart] = []
        self.hangs: list[Restart] = []
        self.input_done = threading.Event()
        """Set by the soak once no more input will be added."""
        self.end: dict[int, int] = {}
        self._halt = threading.Event()
        self._streak: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        self.errors: Counter[str] = Counter()
        """What asking the cluster failed with (while a fault lasts), by kind."""

    def start_copiers(self) -> None:
        for pipeline in self.pipelines:
            for copier in pipeline.copiers:
                copier.start()

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=30)

    def done(self) -> bool:
        return all(p.done_at is not None for p in self.pipelines)

    def run(self) -> None:
        asked = 0.0
        while not self._halt.is_set():
            now = time.monotonic()
            if now - asked >= self._ask_every_s:
                asked = now
                self._ask()
            for pipeline in self.pipelines:
                if pipeline.done_at is None:
                    self._keep_running(pipeline)
            self._halt.wait(self._poll_s)

    def _ask(self) -> None:
        try:
            self.end = self._input_end()
        except Exception as exc:  # the cluster may be down: ask again later
            self._error(f"input end: {type(exc).__name__}: {exc}")
            return
        for pipeline in self.pipelines:
            if pipeline.done_at is not None:
                continue
            try:
                pipeline.committed = self._committed(pipeline.group)
            except Exception as exc:
                self._error(f"{pipeline.name} committed offsets: {type(exc).__name__}: {exc}")
                continue
            caught_up = self.end and all(
                pipeline.committed.get(p, 0) >= end for p, end in self.end.items()
            )
            if caught_up and self.input_done.is_set():
                pipeline.done_at = self._clock()
                for copier in pipeline.copiers:
                    copier.stop()

    def _error(self, text: str) -> None:
        self.errors[text[:200]] += 1

    def _keep_running(self, pipeline: Pipeline) -> None:
        now = time.monotonic()
        for copier in pipeline.copiers:
            if copier.running() and copier.silent_s() > self._hang_s:
                hang = Restart(
                    round(self._clock(), 2),
                    copier.name,
                    None,
                    f"hung: printed nothing for {copier.silent_s():.0f}s after "
                    f"{copier.last_line()}",
                )
                self.hangs.append(hang)
                copier.kill()
            if copier.running():
                continue
            if copier.exited_at is None:
                copier.exited_at = now
                # a copier that ran a while before it ended starts again quickly
                ran = now - copier.started_at
                streak = 0 if ran > _STEADY_S else self._streak.get(copier.name, 0)
                self._next_try[copier.name] = now + _BACKOFF_S[min(streak, len(_BACKOFF_S) - 1)]
                self._streak[copier.name] = streak + 1
            if now < self._next_try.get(copier.name, 0.0):
                continue
            status = copier.returncode
            self.restarts.append(
                Restart(round(self._clock(), 2), copier.name, status, copier.last_words())
            )
            copier.start()

    def stop_all(self) -> None:
        for pipeline in self.pipelines:
            for copier in pipeline.copiers:
                copier.stop(grace=10.0)
