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


def _member_rules(member: int, events: Sequence[Mapping[str, Any]], out: AtLeastOnce) -> None:
    """``ConsumerEventHandler`` of Kafka's service, one member's stream in its order."""
    assignment: set[tuple[str, int]] = set()
    position: dict[tuple[str, int], int] = {}
    for e in events:
        name = e.get("name")
        if name == "partitions_assigned":
            assignment = {_tp(p) for p in e["partitions"]}
            out.assignments += 1
        elif name == "partitions_revoked":
            position = {}
        elif name == "records_consumed":
            for p in e["partitions"]:
                tp, low = _tp(p), int(p["minOffset"])
                if tp not in assignment:
                    out.violations.append(f"member {member} consumed {tp}, not assigned: {e}")
                if tp in position and position[tp] != low:
                    out.violations.append(
                        f"member {member} consumed {tp} from {low}, expected {position[tp]}"
                    )
                position[tp] = int(p["maxOffset"]) + 1
        elif name == "offsets_committed":
            if not e["success"]:
                out.failed_commits += 1
                if not _REBALANCE.search(str(e.get("error"))):
                    out.violations.append(f"member {member}: a commit failed: {e.get('error')}")
                continue
            out.commits += 1
            for o in e["offsets"]:
                tp, offset = _tp(o), int(o["offset"])
                if tp not in assignment:
                    out.violations.append(f"member {member} committed {tp}, not assigned")
                elif position.get(tp, -1) < offset:
                    out.violations.append(
                        f"member {member} committed {offset} for {tp} past its position "
                        f"{position.get(tp)}"
                    )


def _merged(members: Sequence[Sequence[Mapping[str, Any]]]) -> list[tuple[int, Mapping[str, Any]]]:
    """Every member's events in timestamp order (a member's own order kept on ties)."""
    keyed = [
        (int(e["timestamp"]), m, i, e)
        for m, events in enumerate(members)
        for i, e in enumerate(events)
        if "timestamp" in e
    ]
    return [(m, e) for _, m, _, e in sorted(keyed, key=lambda k: k[:3])]


def _group_rules(
    members: Sequence[Sequence[Mapping[str, Any]]],
    ends: Mapping[tuple[str, int], int],
    out: AtLeastOnce,
) -> None:
    """Across members: commits never go backwards; a new owner starts at the last commit;
    the last commit of each partition is its end."""
    committed: dict[tuple[str, int], tuple[int, int]] = {}  # tp -> (offset, event timestamp)
    fresh: set[tuple[int, tuple[str, int]]] = set()  # (member, tp) assigned, not yet read
    for member, e in _merged(members):
        name, at = e.get("name"), int(e["timestamp"])
        if name == "partitions_assigned":
            fresh |= {(member, _tp(p)) for p in e["partitions"]}
        elif name == "records_consumed":
            for p in e["partitions"]:
                tp, low = _tp(p), int(p["minOffset"])
                if (member, tp) not in fresh:
                    continue
                fresh.discard((member, tp))
                last, when = committed.get(tp, (0, 0))
                if when < at and low < last:  # ties in the same millisecond prove nothing
                    out.violations.append(
                        f"member {member} was given {tp} and started at {low}, behind the "
                        f"offset {last} committed before"
                    )
        elif name == "offsets_committed" and e["success"]:
            for o in e["offsets"]:
                tp, offset = _tp(o), int(o["offset"])
                last, _ = committed.get(tp, (0, 0))
                if offset < last:
                    out.violations.append(
                        f"the committed offset of {tp} went back from {last} to {offset} "
                        f"(member {member})"
                    )
                committed[tp] = (max(offset, last), at)
    for tp, end in sorted(ends.items()):
        last = committed.get(tp, (0, 0))[0]
        if last != end:
            out.violations.append(f"the last offset committed for {tp} is {last}, not {end}")


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
        _member_rules(m, events, out)
    _group_rules(members, ends, out)
    if out.missing:
        lost = sorted(wanted - set(seen))
        out.violations.append(f"{out.missing} records never consumed, first {lost[:5]}")
    if set(seen) - wanted:
        out.violations.append(f"records nobody produced: {sorted(set(seen) - wanted)[:5]}")
    return out
