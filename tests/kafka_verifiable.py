"""Kafka's VerifiableConsumer as a long-running group member, and the at-least-once
oracle of Kafka's consumer system tests over what the members printed.

:func:`start_verifiable_consumer` starts one member (classic protocol, ``--verbose``,
no auto-commit: it commits synchronously after each poll) that runs until stopped or
killed. :func:`judge` reads the events of every member of the group, as
``kafkatest/services/verifiable_consumer.py`` does while ``consumer_test.py`` runs, and
returns the counts with every rule broken:

* per member, in the order it printed: records are consumed only from assigned
  partitions, and contiguously from where the member last consumed (Kafka's
  ``verify_offsets``); a commit names only assigned partitions and never an offset past
  what the member consumed;
* across members, by event timestamp: the offsets committed for a partition never go
  backwards, and a member given a partition starts at or after the last offset
  committed for it before it started (no stale OffsetFetch);
* a commit fails only when answered during a rebalance (the client's
  CommitFailedException / RebalanceInProgressException, both of which say so);
* every record produced is consumed at least once, and the last offset committed for
  each partition is its end.

Comparing events of two processes by timestamp is sound for these rules: a commit's
event is printed as ``commitSync`` returns, before the member polls (and so before it
can rejoin), and a partition moves to another member only after a rejoin or after the
first member's session has expired; the other member's first record comes later still.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup_tools import kafka_jars
from tests.kafka_tools import ToolProcess, start_tool

__all__ = ["AtLeastOnce", "judge", "start_verifiable_consumer"]

_REBALANCE = re.compile(r"rebalanc", re.IGNORECASE)


def start_verifiable_consumer(
    bootstrap: str,
    topic: str,
    group: str,
    workdir: Path,
    *,
    session_timeout_ms: int,
    config: Mapping[str, object] | None = None,
) -> ToolProcess:
    """A member of ``group`` reading ``topic`` from the earliest offset until stopped
    (SIGTERM: it leaves the group and prints ``shutdown_complete``) or killed."""
    workdir.mkdir(parents=True, exist_ok=True)
    props = workdir / f"vc-{group}-{len(list(workdir.glob('vc-*.properties')))}.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in (config or {}).items()))
    args = [
        *("--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group),
        *("--session-timeout", str(session_timeout_ms), "--reset-policy", "earliest"),
        *("--group-protocol", "classic", "--verbose", "--consumer.config", str(props)),
    ]
    return start_tool(kafka_jars.VERIFIABLE_CONSUMER, args, workdir)


@dataclass(slots=True)
class AtLeastOnce:
    """What the members did, and the rules they (or the server) broke."""

    produced: int
    consumed: int
    """Records the members reported, re-reads included."""
    duplicates: int
    """Records reported more than once (consumed minus distinct)."""
    missing: int
    commits: int
    failed_commits: int
    """Commits answered during a rebalance (any other failure is a violation)."""
    assignments: int
    violations: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "produced": self.produced,
            "consumed": self.consumed,
            "duplicates": self.duplicates,
            "missing": self.missing,
            "commits": self.commits,
            "failed_commits": self.failed_commits,
            "assignments": self.assignments,
        }


def _tp(d: Mapping[str, Any]) -> tuple[str, int]:
    return str(d["topic"]), int(d["partition"])


class _Member:
    """Kafka's ``ConsumerEventHandler`` for one member: its stream, in its order."""

    def __init__(self, member: int, out: AtLeastOnce) -> None:
        self.member, self.out = member, out
        self.assignment: set[tuple[str, int]] = set()
        self.position: dict[tuple[str, int], int] = {}

    def fail(self, why: str) -> None:
        self.out.violations.append(f"member {self.member} {why}")

    def event(self, e: Mapping[str, Any]) -> None:
        name = e.get("name")
        if name == "partitions_assigned":
            self.assignment = {_tp(p) for p in e["partitions"]}
            self.out.assignments += 1
        elif name == "partitions_revoked":
            self.position = {}
        elif name == "records_consumed":
            self.consumed(e)
        elif name == "offsets_committed":
            self.committed(e)

    def consumed(self, e: Mapping[str, Any]) -> None:
        for p in e["partitions"]:
            tp, low = _tp(p), int(p["minOffset"])
            if tp not in self.assignment:
                self.fail(f"consumed {tp}, not assigned: {e}")
            if tp in self.position and self.position[tp] != low:
                self.fail(f"consumed {tp} from {low}, expected {self.position[tp]}")
            self.position[tp] = int(p["maxOffset"]) + 1

    def committed(self, e: Mapping[str, Any]) -> None:
        if not e["success"]:
            self.out.failed_commits += 1
            if not _REBALANCE.search(str(e.get("error"))):
                self.fail(f"saw a commit fail outside a rebalance: {e.get('error')}")
            return
        self.out.commits += 1
        for o in e["offsets"]:
            tp, offset = _tp(o), int(o["offset"])
            if tp not in self.assignment:
                self.fail(f"committed {tp}, not assigned")
            elif self.position.get(tp, -1) < offset:
                self.fail(f"committed {offset} for {tp} past its position {self.position.get(tp)}")


def _merged(members: Sequence[Sequence[Mapping[str, Any]]]) -> list[tuple[int, Mapping[str, Any]]]:
    """Every member's events in timestamp order (a member's own order kept on ties)."""
    keyed = [
        (int(e["timestamp"]), m, i, e)
        for m, events in enumerate(members)
        for i, e in enumerate(events)
        if "timestamp" in e
    ]
    return [(m, e) for _, m, _, e in sorted(keyed, key=lambda k: k[:3])]


class _Group:
    """Kafka's service-wide checks: every member's events by timestamp."""

    def __init__(self, out: AtLeastOnce) -> None:
        self.out = out
        self.committed: dict[tuple[str, int], tuple[int, int]] = {}  # tp -> (offset, when)
        self.fresh: set[tuple[int, tuple[str, int]]] = set()  # (member, tp) given, unread

    def event(self, member: int, e: Mapping[str, Any]) -> None:
        name = e.get("name")
        if name == "partitions_assigned":
            self.fresh |= {(member, _tp(p)) for p in e["partitions"]}
        elif name == "records_consumed":
            for p in e["partitions"]:
                if (member, _tp(p)) in self.fresh:
                    self.fresh.discard((member, _tp(p)))
                    self.started(member, _tp(p), int(p["minOffset"]), int(e["timestamp"]))
        elif name == "offsets_committed" and e["success"]:
            for o in e["offsets"]:
                self.commit(member, _tp(o), int(o["offset"]), int(e["timestamp"]))

    def started(self, member: int, tp: tuple[str, int], low: int, at: int) -> None:
        last, when = self.committed.get(tp, (0, 0))
        if when < at and low < last:  # a tie in the same millisecond proves nothing
            self.out.violations.append(
                f"member {member} was given {tp} and started at {low}, behind the offset "
                f"{last} committed before"
            )

    def commit(self, member: int, tp: tuple[str, int], offset: int, at: int) -> None:
        last, _ = self.committed.get(tp, (0, 0))
        if offset < last:
            self.out.violations.append(
                f"the committed offset of {tp} went back from {last} to {offset} (member {member})"
            )
        self.committed[tp] = (max(offset, last), at)

    def ended(self, ends: Mapping[tuple[str, int], int]) -> None:
        for tp, end in sorted(ends.items()):
            last = self.committed.get(tp, (0, 0))[0]
            if last != end:
                self.out.violations.append(
                    f"the last offset committed for {tp} is {last}, not {end}"
                )


def judge(
    members: Sequence[Sequence[Mapping[str, Any]]],
    produced: Iterable[str],
    ends: Mapping[tuple[str, int], int],
) -> AtLeastOnce:
    """The at-least-once verdict over each member's events (``--verbose``: one
    ``record_data`` per record). ``produced`` holds the value of every record acked to
    the producers, each unique (a record's identity: a produce answer need not carry
    its offset); ``ends`` the end offset of each partition once they stopped."""
    wanted = set(produced)
    seen = Counter(
        str(e["value"]) for events in members for e in events if e.get("name") == "record_data"
    )
    out = AtLeastOnce(
        produced=len(wanted),
        consumed=sum(seen.values()),
        duplicates=sum(n - 1 for n in seen.values()),
        missing=len(wanted - set(seen)),
        commits=0,
        failed_commits=0,
        assignments=0,
    )
    for m, events in enumerate(members):
        member = _Member(m, out)
        for e in events:
            member.event(e)
    group = _Group(out)
    for m, e in _merged(members):
        group.event(m, e)
    group.ended(ends)
    if out.missing:
        lost = sorted(wanted - set(seen))
        out.violations.append(f"{out.missing} records never consumed, first {lost[:5]}")
    if set(seen) - wanted:
        out.violations.append(f"records nobody produced: {sorted(set(seen) - wanted)[:5]}")
    return out
