"""Kafka's own Java tools (from ``kafka-tools`` on Maven Central) as subprocesses against
a bootstrap address, with a deadline, their output parsed into typed results.

Each ``run_*`` starts the tool's JVM (``kop_dedup_tools.kafka_jars.java_command``: the
jars ``kop-dedup kafka fetch`` resolved, the tools' logging on stderr), waits until it
exits or ``timeout`` passes, and parses what it printed. On the deadline the tool is
SIGKILLed by its PID (its own process group) and :class:`ToolTimeout` says what it had
printed. ``start_*`` returns the running :class:`ToolProcess` instead (for a tool that
runs while a test kills a server, or that produces until stopped); ``stop()`` sends
SIGTERM, which runs the tool's shutdown hook (its summary line), then SIGKILL after a
grace period. stdout and stderr go to files in ``workdir``, kept for post-mortems.

What the tools print (4.1.2, one JSON object a line; other stdout lines are kept in
:attr:`ToolRun.other_lines`; ProducerPerformance and TransactionalMessageCopier are in
:mod:`tests.kafka_perf_copier`):

* VerifiableProducer: ``{"timestamp", "name": "startup_complete"}``; per acked record
  ``{"timestamp", "name": "producer_send_success", "key", "value", "topic", "partition",
  "offset"}``; per failed one ``{..., "name": "producer_send_error", "key", "value",
  "topic", "exception", "message"}``; at exit ``shutdown_complete`` then ``{"name":
  "tool_data", "sent", "acked", "target_throughput", "avg_throughput"}``. Values are
  ``0, 1, 2...`` (``<prefix>.<n>`` with ``--value-prefix``); keys null unless
  ``--repeating-keys``. It sets ``retries=0``: idempotence needs retries, so
  :func:`run_verifiable_producer` sets them in its config file.
* VerifiableConsumer: ``startup_complete``; ``partitions_assigned`` /
  ``partitions_revoked`` ``{"partitions": [{"topic", "partition"}]}``; per poll
  ``{"name": "records_consumed", "count", "partitions": [{"topic", "partition",
  "count", "minOffset", "maxOffset"}]}``; with ``--verbose`` per record ``{"name":
  "record_data", "key", "value", "topic", "partition", "offset"}``; per commit
  ``{"name": "offsets_committed", "offsets": [{"topic", "partition", "offset"}],
  "success", "error"?}``; ``shutdown_complete``. It subscribes in a group.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from kop_dedup_tools import kafka_jars
from tests.process_groups import kill_group

__all__ = [
    "ConsumedRecord",
    "ConsumerReport",
    "FailedSend",
    "ProducerReport",
    "SentRecord",
    "ToolProcess",
    "ToolRun",
    "ToolTimeout",
    "consumer_report",
    "parse_lines",
    "producer_report",
    "properties_file",
    "run_tool",
    "run_verifiable_consumer",
    "run_verifiable_producer",
    "start_tool",
    "start_verifiable_producer",
]

_TOOL_JVM = ("-XX:+UseSerialGC",)  # one small heap: fewer GC threads on a 2-core machine
_counter = itertools.count()


# -- running -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What one tool process did: its exit, its time, and what it printed."""

    tool: str
    argv: tuple[str, ...]
    returncode: int | None
    seconds: float
    events: tuple[dict[str, Any], ...]
    other_lines: tuple[str, ...]
    stdout_path: Path
    stderr_path: Path

    def stderr_tail(self, lines: int = 30) -> str:
        return _tail(self.stderr_path, lines)


class ToolTimeout(AssertionError):
    """A tool passed its deadline and was SIGKILLed; ``partial`` holds what it printed."""

    def __init__(self, message: str, partial: ToolRun) -> None:
        super().__init__(message)
        self.partial = partial


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(none)"


def parse_lines(lines: Iterable[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """JSON objects, and the other lines (tools may print plain text on stdout too)."""
    events: list[dict[str, Any]] = []
    other: list[str] = []
    for line in lines:
        text = line.strip()
        if not text:
            continue
        try:
            value = json.loads(text)
        except ValueError:
            other.append(text)
            continue
        if isinstance(value, dict):
            events.append(value)
        else:
            other.append(text)
    return events, other


class ToolProcess:
    """One running tool; a context manager that never leaves it running."""

    def __init__(self, main_class: str, args: list[str], workdir: Path, heap: str) -> None:
        self.tool = main_class.rsplit(".", 1)[-1]
        self.argv = tuple(args)
        stem = workdir / f"{self.tool}-{os.getpid()}-{next(_counter)}"
        self.stdout_path = stem.with_suffix(".out")
        self.stderr_path = stem.with_suffix(".err")
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = kafka_jars.java_command(main_class, *args, heap=heap, jvm_options=_TOOL_JVM)
        self.started = time.monotonic()
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines printed so far (a partial last line is left for later)."""
        text = self.stdout_path.read_text(errors="replace")
        complete = text if text.endswith("\n") else text.rpartition("\n")[0]
        return parse_lines(complete.splitlines())[0]

    def running(self) -> bool:
        return self.proc.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)  # the JVM leads its own group (start_new_session)

    def _result(self) -> ToolRun:
        end = self.ended if self.ended is not None else time.monotonic()
        events, other = parse_lines(self.stdout_path.read_text(errors="replace").splitlines())
        return ToolRun(
            tool=self.tool,
            argv=self.argv,
            returncode=self.proc.returncode,
            seconds=end - self.started,
            events=tuple(events),
            other_lines=tuple(other),
            stdout_path=self.stdout_path,
            stderr_path=self.stderr_path,
        )

    def kill(self) -> None:
        kill_group(self.proc)
        if self.ended is None:
            self.ended = time.monotonic()

    def wait(self, timeout: float) -> ToolRun:
        """Wait for the tool to exit; past ``timeout`` SIGKILL it and raise ToolTimeout."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            partial = self._result()
            raise ToolTimeout(
                f"{self.tool} (pid {self.pid}) still ran after {timeout:.0f}s and was killed; "
                f"{len(partial.events)} JSON lines; stdout tail:\n{_tail(self.stdout_path, 10)}"
                f"\nstderr tail:\n{partial.stderr_tail()}",
                partial,
            ) from None
        self.ended = time.monotonic()
        return self._result()

    def stop(self, grace: float = 20.0) -> ToolRun:
        """SIGTERM (the tool's shutdown hook prints its summary), SIGKILL after ``grace``."""
        if self.running():
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        self.ended = self.ended if self.ended is not None else time.monotonic()
        return self._result()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def start_tool(main_class: str, args: list[str], workdir: Path, heap: str = "256m") -> ToolProcess:
    return ToolProcess(main_class, args, workdir, heap)


def run_tool(main_class: str, args: list[str], workdir: Path, timeout: float) -> ToolRun:
    with start_tool(main_class, args, workdir) as tool:
        return tool.wait(timeout)


def properties_file(workdir: Path, name: str, props: Mapping[str, object]) -> Path:
    path = workdir / f"{name}-{os.getpid()}-{next(_counter)}.properties"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


# -- VerifiableProducer --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SentRecord:
    key: str | None
    value: str
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class FailedSend:
    key: str | None
    value: str
    topic: str
    exception: str
    message: str | None


@dataclass(frozen=True, slots=True)
class ProducerReport:
    acked: tuple[SentRecord, ...]
    failed: tuple[FailedSend, ...]
    sent: int | None
    """``tool_data``'s counts (None when the tool died before its shutdown hook)."""
    acked_count: int | None
    shutdown_complete: bool
    run: ToolRun | None = None


def producer_report(
    events: Iterable[Mapping[str, Any]], run: ToolRun | None = None
) -> ProducerReport:
    acked: list[SentRecord] = []
    failed: list[FailedSend] = []
    sent = acked_count = None
    shutdown = False
    for e in events:
        name = e.get("name")
        if name == "producer_send_success":
            acked.append(SentRecord(e["key"], e["value"], e["topic"], e["partition"], e["offset"]))
        elif name == "producer_send_error":
            failed.append(
                FailedSend(e["key"], e["value"], e["topic"], e["exception"], e.get("message"))
            )
        elif name == "tool_data":
            sent, acked_count = int(e["sent"]), int(e["acked"])
        elif name == "shutdown_complete":
            shutdown = True
    return ProducerReport(tuple(acked), tuple(failed), sent, acked_count, shutdown, run)


def _producer_args(
    bootstrap: str,
    topic: str,
    workdir: Path,
    *,
    max_messages: int,
    acks: int,
    idempotent: bool,
    throughput: int,
    value_prefix: int | None,
    repeating_keys: int | None,
    config: Mapping[str, object] | None,
) -> list[str]:
    props: dict[str, object] = (
        # VerifiableProducer sets retries=0, which idempotence refuses
        {"enable.idempotence": "true", "retries": 2147483647}
        if idempotent
        else {"enable.idempotence": "false"}
    )
    props |= dict(config or {})
    args = [
        *("--bootstrap-server", bootstrap, "--topic", topic),
        *("--max-messages", str(max_messages), "--acks", str(acks)),
        *("--throughput", str(throughput)),
        *("--producer.config", str(properties_file(workdir, "producer", props))),
    ]
    if value_prefix is not None:
        args += ["--value-prefix", str(value_prefix)]
    if repeating_keys is not None:
        args += ["--repeating-keys", str(repeating_keys)]
    return args


def start_verifiable_producer(
    bootstrap: str,
    topic: str,
    workdir: Path,
    *,
    max_messages: int = -1,
    acks: int = -1,
    idempotent: bool = True,
    throughput: int = -1,
    value_prefix: int | None = None,
    repeating_keys: int | None = None,
    config: Mapping[str, object] | None = None,
) -> ToolProcess:
    """A VerifiableProducer that runs until ``max_messages`` (-1: until stopped)."""
    args = _producer_args(
        bootstrap,
        topic,
        workdir,
        max_messages=max_messages,
        acks=acks,
        idempotent=idempotent,
        throughput=throughput,
        value_prefix=value_prefix,
        repeating_keys=repeating_keys,
        config=config,
    )
    return start_tool(kafka_jars.VERIFIABLE_PRODUCER, args, workdir)


def run_verifiable_producer(
    bootstrap: str,
    topic: str,
    workdir: Path,
    *,
    max_messages: int,
    acks: int = -1,
    idempotent: bool = True,
    throughput: int = -1,
    value_prefix: int | None = None,
    repeating_keys: int | None = None,
    config: Mapping[str, object] | None = None,
    timeout: float = 120.0,
) -> ProducerReport:
    """Produce ``max_messages`` values ``0..n-1`` (acks -1 = all, idempotent by default:
    ``enable.idempotence=true``, 5 in flight, retries) and report what was acked."""
    with start_verifiable_producer(
        bootstrap,
        topic,
        workdir,
        max_messages=max_messages,
        acks=acks,
        idempotent=idempotent,
        throughput=throughput,
        value_prefix=value_prefix,
        repeating_keys=repeating_keys,
        config=config,
    ) as tool:
        run = tool.wait(timeout)
    return producer_report(run.events, run)


# -- VerifiableConsumer --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    topic: str
    partition: int
    key: str | None
    value: str | None
    offset: int


@dataclass(frozen=True, slots=True)
class ConsumerReport:
    records: tuple[ConsumedRecord, ...]
    """Every record (``--verbose``), in the order consumed."""
    consumed: int
    """The sum of ``records_consumed`` counts (what it took, up to ``--max-messages``)."""
    commits: tuple[tuple[tuple[str, int, int], ...], ...]
    """Each successful commit: (topic, partition, next offset) triples."""
    failed_commits: tuple[str, ...]
    assigned: tuple[tuple[str, int], ...]
    """The last assignment."""
    shutdown_complete: bool
    run: ToolRun | None = None


def consumer_report(
    events: Iterable[Mapping[str, Any]], run: ToolRun | None = None
) -> ConsumerReport:
    records: list[ConsumedRecord] = []
    consumed = 0
    commits: list[tuple[tuple[str, int, int], ...]] = []
    failed: list[str] = []
    assigned: tuple[tuple[str, int], ...] = ()
    shutdown = False
    for e in events:
        name = e.get("name")
        if name == "record_data":
            records.append(
                ConsumedRecord(e["topic"], e["partition"], e["key"], e["value"], e["offset"])
            )
        elif name == "records_consumed":
            consumed += sum(int(p["count"]) for p in e["partitions"])
        elif name == "offsets_committed":
            if e["success"]:
                commits.append(
                    tuple((o["topic"], o["partition"], o["offset"]) for o in e["offsets"])
                )
            else:
                failed.append(str(e.get("error")))
        elif name == "partitions_assigned":
            assigned = tuple(sorted((p["topic"], p["partition"]) for p in e["partitions"]))
        elif name == "shutdown_complete":
            shutdown = True
    return ConsumerReport(
        tuple(records), consumed, tuple(commits), tuple(failed), assigned, shutdown, run
    )


def run_verifiable_consumer(
    bootstrap: str,
    topic: str,
    group: str,
    workdir: Path,
    *,
    max_messages: int,
    isolation: str = "read_committed",
    reset_policy: str = "earliest",
    group_protocol: str = "classic",
    config: Mapping[str, object] | None = None,
    timeout: float = 120.0,
) -> ConsumerReport:
    """Consume ``max_messages`` in ``group`` (verbose: every record reported), committing
    synchronously after each poll, then exit."""
    props = {"isolation.level": isolation, **(config or {})}
    args = [
        *("--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group),
        *("--max-messages", str(max_messages), "--reset-policy", reset_policy),
        *("--group-protocol", group_protocol, "--verbose"),
        *("--consumer.config", str(properties_file(workdir, "consumer", props))),
    ]
    run = run_tool(kafka_jars.VERIFIABLE_CONSUMER, args, workdir, timeout)
    return consumer_report(run.events, run)
