"""Kafka's own command-line tools (``kafka-topics``, ``kafka-configs``,
``kafka-consumer-groups``, ``kafka-transactions``, ``kafka-delete-records``,
``kafka-get-offsets``) run from the Kafka jars, several in one JVM.

``run_tools([(TOPICS, [...]), (CONFIGS, [...])], workdir)`` starts one JVM running
``tests/java/ToolBatch.java`` (a source-file launch) that calls each tool's ``main`` in
turn, catching Kafka's ``Exit.exit``: one JVM start for the lot, not one per command.
Each command's result is its exit code and the lines it printed.

>>> done = run_tools([(TOPICS, ["--bootstrap-server", b, "--list"])], tmp_path)
>>> done[0].exit, done[0].lines
(0, ['orders'])
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kop_dedup_tools import kafka_jars

__all__ = [
    "ACLS",
    "CONFIGS",
    "DELETE_RECORDS",
    "GET_OFFSETS",
    "GROUPS",
    "LOG_DIRS",
    "TOPICS",
    "TRANSACTIONS",
    "ToolResult",
    "run_tools",
]

TOPICS = "org.apache.kafka.tools.TopicCommand"
CONFIGS = "kafka.admin.ConfigCommand"
GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
DELETE_RECORDS = "org.apache.kafka.tools.DeleteRecordsCommand"
GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell"
ACLS = "org.apache.kafka.tools.AclCommand"
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"

_RUNNER = Path(__file__).parent / "java" / "ToolBatch.java"
_BEGIN = re.compile(r"^==== begin (\d+)$")
_END = re.compile(r"^==== end (\d+) exit=(-?\d+) ms=\d+$")


@dataclass(frozen=True, slots=True)
class ToolResult:
    argv: tuple[str, ...]
    exit: int
    lines: tuple[str, ...]
    """What it printed on stdout."""
    errors: tuple[str, ...]
    """What it printed on stderr (the tools' logging: warnings and worse)."""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def error_text(self) -> str:
        return "\n".join(self.errors)


def _framed(lines: list[str]) -> dict[int, tuple[int, tuple[str, ...]]]:
    """Command index -> (exit code, the lines between its markers)."""
    out: dict[int, tuple[int, tuple[str, ...]]] = {}
    current: list[str] | None = None
    for line in lines:
        if _BEGIN.match(line):
            current = []
        elif (end := _END.match(line)) is not None and current is not None:
            out[int(end.group(1))] = (int(end.group(2)), tuple(current))
            current = None
        elif current is not None:
            current.append(line)
    return out


def run_tools(
    commands: list[tuple[str, list[str]]], workdir: Path, timeout: float = 180.0
) -> list[ToolResult]:
    """Run the commands in order in one JVM; their results (AssertionError with the
    JVM's output when it did not get through them all)."""
    workdir.mkdir(parents=True, exist_ok=True)
    stem = workdir / f"tools-{os.getpid()}-{len(list(workdir.glob('tools-*.cmds')))}"
    cmds = stem.with_suffix(".cmds")
    cmds.write_text("".join("\t".join([main, *args]) + "\n" for main, args in commands))
    cmd = kafka_jars.java_command(
        str(_RUNNER), str(cmds), heap="256m", jvm_options=("-XX:+UseSerialGC",)
    )
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    out = proc.stdout.decode(errors="replace").splitlines()
    err = proc.stderr.decode(errors="replace").splitlines()
    stem.with_suffix(".out").write_text("\n".join(out))
    stem.with_suffix(".err").write_text("\n".join(err))
    printed, logged = _framed(out), _framed(err)
    if len(printed) != len(commands):
        raise AssertionError(
            f"ran {len(printed)} of {len(commands)} tools (exit {proc.returncode}); stdout:\n"
            + "\n".join(out[-40:])
            + "\nstderr:\n"
            + "\n".join(err[-60:])
        )
    return [
        ToolResult(tuple(args), printed[n][0], printed[n][1], logged.get(n, (0, ()))[1])
        for n, (_main, args) in enumerate(commands)
    ]
