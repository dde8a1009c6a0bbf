"""A Kafka Streams application with ``processing.guarantee=exactly_once_v2`` against any
Kafka target, for tests: ``tests/java/StreamsCount.java`` (compiled once against the
Kafka jars, ``kafka-streams`` among them) counts an input topic's records per value
through a repartition topic and a state store with its changelog, and writes each new
count to an output topic.

>>> app = StreamsApp(workdir, bootstrap, "counter-1", "in", "out").start()
>>> app.wait_running(60)
>>> app.kill()   # SIGKILL: an open transaction is left behind
>>> app.start()  # the same application id and state directory (new_state=True: a new one)
>>> app.stop()   # SIGTERM: a last commit, a clean leave

:func:`counts` turns what a read_committed reader got from the output into each
value's counts in the order written: exactly-once means ``[1, 2, ..., n]`` for a value
seen ``n`` times in the input (the record cache is off, so every input record makes
one output record).
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from kop_dedup_tools import kafka_jars
from kop_dedup_tools.processes import BrokerError
from tests.kafka_conformance import Partitions
from tests.process_groups import kill_group, stop_group

__all__ = ["StreamsApp", "counts", "expected_counts"]

_APP = Path(__file__).parent / "java" / "StreamsCount.java"


@functools.cache
def compiled() -> Path | None:
    """The application compiled once (:func:`kafka_jars.compiled_classes`); None where
    there is no ``javac`` (a JRE): then each start compiles."""
    try:
        return kafka_jars.compiled_classes(_APP, "kop-dedup-streams")
    except BrokerError:
        return None


class StreamsApp:
    """One instance of the counting application (``threads`` stream threads); ``start``
    may be called again after ``kill`` or ``stop``, with the same application id.
    Instances given the same application id share its tasks."""

    def __init__(
        self,
        workdir: Path,
        bootstrap: str,
        application_id: str,
        source: str,
        sink: str,
        *,
        sleep_ms: int = 0,
        threads: int = 1,
        instance: str = "",
    ) -> None:
        self.workdir = workdir
        self.application_id = application_id
        self.args = [bootstrap, application_id, source, sink, "", str(sleep_ms), str(threads)]
        if instance:  # group.instance.id: a static member, its session 30 s
            self.args.append(instance)
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "streams.log"
        self.out = workdir / "streams.out"
        self.log_config = workdir / "log4j2.properties"
        self.log_config.write_text(kafka_jars.STREAMS_LOG4J.format(log=self.log))
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self, *, new_state: bool = False) -> Self:
        """Start (again): with the previous run's state directory, as a process restarted
        on the same machine (the same process id, so the same transactional id), or with
        ``new_state`` a new one, as on another machine (a new process id: the killed
        run's transaction is left to its timeout)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if new_state or not self.args[4]:
            self.args[4] = str(self.workdir / f"state-{self.runs + 1}")
        classes = compiled()
        cmd = kafka_jars.java_command(
            "StreamsCount" if classes is not None else str(_APP),
            *self.args,
            heap="256m",
            jvm_options=("-XX:+UseSerialGC",),
            log_config=self.log_config,
            classes=classes,
        )
        self.runs += 1
        with self.out.open("ab") as out:
            out.write(f"==== run {self.runs}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def _this_run(self) -> list[str]:
        with contextlib.suppress(OSError):
            text = self.out.read_text(errors="replace")
            return text.rsplit(f"==== run {self.runs}\n", 1)[-1].splitlines()
        return []

    def lines(self) -> list[str]:
        """What this run printed so far (state changes, progress), line by line."""
        return self._this_run()

    def wait_running(self, timeout: float) -> None:
        """Until this run's application reached RUNNING (its tasks assigned, its state
        restored); AssertionError with the log's tail when it exited or timed out."""
        deadline = time.monotonic() + timeout
        while not any(line.endswith("-> RUNNING") for line in self._this_run()):
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"Streams exited {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"Streams not RUNNING in {timeout:.0f}s: {self.tail()}")
            time.sleep(0.2)

    def processed(self) -> int:
        """How many records this run's application said it has counted (committed or
        not; it says so every 10)."""
        said = [int(line.split()[1]) for line in self._this_run() if line.startswith("processed ")]
        return said[-1] if said else 0

    def wait_processed(self, at_least: int, timeout: float) -> int:
        """Until this run's application has counted ``at_least`` records; how many it
        said."""
        deadline = time.monotonic() + timeout
        while True:
            if (said := self.processed()) >= at_least:
                return said
            assert self.alive(), f"Streams exited: {self.tail()}"
            assert time.monotonic() < deadline, (
                f"{at_least} records not read in {timeout:.0f}s: {self.tail()}"
            )
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def clean(self) -> bool:
        """Whether this run's application died of no exception (a stream thread's
        uncaught exception ends it in ERROR)."""
        return not any(
            line.startswith("uncaught ") or line.endswith("-> ERROR") for line in self._this_run()
        )

    def tail(self, lines: int = 40) -> str:
        parts = ["\n".join(self._this_run()[-lines:])]
        with contextlib.suppress(OSError):
            parts.append("\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n---- log ----\n".join(parts)

    def kill(self) -> None:
        """SIGKILL: no commit, no leave; an open transaction stays open."""
        if self.proc is not None:
            kill_group(self.proc)

    def stop(self, grace: float = 45.0) -> int | None:
        """SIGTERM (close: a last commit, the group left), SIGKILL after ``grace``; the
        exit code."""
        return None if self.proc is None else stop_group(self.proc, grace)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def counts(output: Partitions) -> dict[str, list[int]]:
    """Each value's counts as the output holds them, in the order written (a value's
    counts all land in one partition)."""
    out: dict[str, list[int]] = {}
    for records in output.values():
        for record in records:
            assert record.key is not None, record
            assert record.value is not None, record
            out.setdefault(record.key.decode(), []).append(int(record.value))
    return out


def expected_counts(values: Mapping[str, int]) -> dict[str, list[int]]:
    """What exactly-once output holds for input ``values`` (value -> times seen)."""
    return {value: list(range(1, n + 1)) for value, n in values.items()}
