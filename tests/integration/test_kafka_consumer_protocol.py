"""KIP-848, the consumer group protocol (``group.protocol=consumer``), with Kafka's own
Java consumer (VerifiableConsumer, Kafka 4.1) and ``kafka-consumer-groups`` as the
judges, the same scenario against the reference Kafka broker and the listener:

two members share a 4-partition topic (2 each, the second one's partitions given only
after the first revoked them, while a producer writes and the first reads), the records
produced then and while both run are consumed by one or the other,
``kafka-consumer-groups --describe`` lists the group and its members' partitions, one
member leaves, the other gets all 4 and consumes the rest: every record consumed exactly
once, and the group's offsets at the ends."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kop_dedup_tools import kafka_jars
from tests.helpers import uniq
from tests.integration.kafka_consume import create
from tests.kafka_cli import GROUPS, run_tools
from tests.kafka_tools import ToolProcess, parse_lines, start_tool
from tests.sidecar import ThreadSidecar

pytestmark = [pytest.mark.integration]

PARTITIONS = 4
PER_PHASE = 200
ALL = set(range(PARTITIONS))


class Member:
    """One VerifiableConsumer of the consumer protocol: what it holds, read, committed."""

    def __init__(self, bootstrap: str, topic: str, group: str, workdir: Path) -> None:
        props = workdir / f"kip848-{uuid.uuid4().hex[:8]}.properties"
        props.write_text("max.poll.records=20\n")
        args = [
            *("--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group),
            *("--reset-policy", "earliest", "--group-protocol", "consumer", "--verbose"),
            *("--consumer.config", str(props)),
        ]
        self.tool: ToolProcess = start_tool(kafka_jars.VERIFIABLE_CONSUMER, args, workdir)
        self.assigned: set[int] = set()
        self.records: list[tuple[int, int]] = []
        self.committed: dict[int, int] = {}
        self.events: list[dict[str, Any]] = []
        self._read = 0

    def poll(self) -> Member:
        with self.tool.stdout_path.open("rb") as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        for e in parse_lines(complete.decode(errors="replace").splitlines())[0]:
            self.events.append(e)
            name = e.get("name")
            parts = {int(p["partition"]) for p in e.get("partitions", ())}
            if name == "partitions_assigned":  # incremental under this protocol
                self.assigned |= parts
            elif name == "partitions_revoked":
                self.assigned -= parts
            elif name == "record_data":
                self.records.append((int(e["partition"]), int(e["offset"])))
            elif name == "offsets_committed" and e["success"]:
                for o in e["offsets"]:
                    p = int(o["partition"])
                    self.committed[p] = max(self.committed.get(p, 0), int(o["offset"]))
        return self


@dataclass
class Outcome:
    split: list[int]
    """Partitions each member held while both ran (sorted sizes)."""
    overlapped: bool
    """A partition was ever held by both at once."""
    after_leave: list[int]
    produced: int
    consumed: int
    duplicates: int
    missing: int
    committed_at_ends: bool
    describe_lines: list[str]
    state_lines: list[str]
    join_s: float = 0.0
    """From the second member's start to the two sharing the topic (its JVM start too)."""
    leave_s: float = 0.0
    """From the SIGTERM of the second member to the first holding all 4."""


def _wait(members: list[Member], check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for m in members:
            m.poll()
        if check():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(m.tool.stop(grace=1).stderr_tail(20) for m in members)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.2)


def _produce(bootstrap: str, topic: str, tag: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n in range(PER_PHASE):
        p.produce(topic, value=f"{tag}-{n}".encode(), partition=n % PARTITIONS)
    assert p.flush(60) == 0


class Live:
    """A producer writing to each partition in turn on its own thread while the second
    member joins (the first then revokes partitions it is reading); ``sent`` counts
    the records acknowledged per partition."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.topic, self.sent = topic, dict.fromkeys(ALL, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kip848-live")
        self._thread.start()

    def _acked(self, err: Any, msg: Any) -> None:
        if err is None:
            self.sent[msg.partition()] += 1

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self.producer.produce(
                self.topic,
                value=f"live-{n}".encode(),
                partition=n % PARTITIONS,
                on_delivery=self._acked,
            )
            self.producer.poll(0)
            n += 1
            time.sleep(0.01)

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join(timeout=30)
        assert self.producer.flush(60) == 0
        return dict(self.sent)


def scenario(bootstrap: str, workdir: Path) -> Outcome:
    topic = create(bootstrap, PARTITIONS, "kip848")
    group = f"kip848-{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True, exist_ok=True)
    a = Member(bootstrap, topic, group, workdir)
    b: Member | None = None
    try:
        _wait([a], lambda: a.assigned == ALL, "the first member to hold all 4", 120)
        live = Live(bootstrap, topic)
        time.sleep(1)  # the first member reads when the second joins
        started = time.monotonic()
        b = Member(bootstrap, topic, group, workdir)
        both = [a, b]
        overlapped = False

        def shared() -> bool:
            nonlocal overlapped
            overlapped = overlapped or bool(a.assigned & b.assigned)
            return bool(a.assigned) and bool(b.assigned) and a.assigned | b.assigned == ALL

        _wait(both, shared, "the two members to share the topic", 120)
        split = sorted([len(a.assigned), len(b.assigned)])
        join_s = time.monotonic() - started
        time.sleep(1)  # both read a while
        first = live.stop()
        _produce(bootstrap, topic, "one")
        ends = {p: first[p] + PER_PHASE // PARTITIONS for p in ALL}

        def at(ends: dict[int, int]) -> Callable[[], bool]:
            def check() -> bool:
                shared()
                last: dict[int, int] = {}
                for m in both:
                    for p, o in m.committed.items():
                        last[p] = max(last.get(p, 0), o)
                return last == ends

            return check

        _wait(both, at(ends), "commits at the ends of the first records", 120)
        tools = run_tools(
            [
                (GROUPS, ["--bootstrap-server", bootstrap, "--describe", "--group", group]),
                (
                    GROUPS,
                    ["--bootstrap-server", bootstrap, "--describe", "--group", group, "--state"],
                ),
            ],
            workdir,
        )
        assert [t.exit for t in tools] == [0, 0], [t.text for t in tools]
        started = time.monotonic()
        b.tool.stop()  # SIGTERM: it leaves the group
        _wait([a], lambda: a.assigned == ALL, "the remaining member to get all 4", 120)
        leave_s = time.monotonic() - started
        after_leave = [len(a.assigned)]
        _produce(bootstrap, topic, "two")
        ends = {p: ends[p] + PER_PHASE // PARTITIONS for p in ALL}
        _wait(both, at(ends), "commits at the ends of the later records", 120)
    finally:
        a.tool.stop()
        if b is not None:
            b.tool.stop()
    seen = Counter(r for m in both for r in m.poll().records)
    wanted = {(p, o) for p in ALL for o in range(ends[p])}
    return Outcome(
        split=split,
        overlapped=overlapped,
        after_leave=after_leave,
        produced=sum(ends.values()),
        consumed=sum(seen.values()),
        duplicates=sum(n - 1 for n in seen.values()),
        missing=len(wanted - set(seen)),
        committed_at_ends=True,
        describe_lines=list(tools[0].lines),
        state_lines=list(tools[1].lines),
        join_s=join_s,
        leave_s=leave_s,
    )


def _rows(lines: list[str], group: str = "kip848-") -> list[list[str]]:
    return [line.split() for line in lines if line.startswith(group)]


def _check(outcome: Outcome) -> None:
    assert outcome.split == [2, 2]
    assert not outcome.overlapped
    assert outcome.after_leave == [PARTITIONS]
    assert (outcome.consumed, outcome.duplicates, outcome.missing) == (outcome.produced, 0, 0)
    rows = _rows(outcome.describe_lines)
    assert sorted(int(r[2]) for r in rows) == sorted(ALL), outcome.describe_lines
    assert len({r[6] for r in rows}) == 2, outcome.describe_lines  # two consumer ids
    state = _rows(outcome.state_lines)
    assert len(state) == 1, outcome.state_lines


@pytest.fixture(scope="module")
def kip848_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(
        pulsar,
        kafka_consumer_heartbeat_interval_ms=500,
        kafka_consumer_session_timeout_ms=10_000,
        group_sweep_interval_ms=100,
        system_namespace=uniq("sys"),
    ) as sc:
        yield sc


def test_consumer_protocol_members_share_then_one_takes_all_each_record_once(
    kip848_sidecar: ThreadSidecar, tmp_path: Path
) -> None:
    outcome = scenario(kip848_sidecar.kafka_bootstrap, tmp_path / "listener")
    print(f"\nlistener: {outcome}")
    _check(outcome)


def test_consumer_protocol_scenario_matches_reference_kafka(
    kip848_sidecar: ThreadSidecar, kafka_reference: Any, tmp_path: Path
) -> None:
    ours = scenario(kip848_sidecar.kafka_bootstrap, tmp_path / "listener")
    theirs = scenario(kafka_reference.bootstrap, tmp_path / "kafka")
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    for name, o in (("listener", ours), ("kafka", theirs)):
        print(f"{name}: join {o.join_s:.1f}s, leave {o.leave_s:.1f}s, {o.produced} records")
    _check(theirs)
    _check(ours)
    # the describe columns both show: GROUP TOPIC PARTITION ... CONSUMER-ID HOST CLIENT-ID
    assert [len(r) for r in _rows(ours.describe_lines)] == [
        len(r) for r in _rows(theirs.describe_lines)
    ]
    # --state: GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS
    assert _rows(ours.state_lines)[0][-3:] == _rows(theirs.state_lines)[0][-3:]


def test_consumer_protocol_member_killed_its_partitions_move_after_the_session(
    kip848_sidecar: ThreadSidecar, tmp_path: Path
) -> None:
    """SIGKILL: no leave heartbeat; the sweep removes the member once its session
    (KOP_DEDUP_KAFKA_CONSUMER_SESSION_TIMEOUT_MS, 10 s here) passes, and the other member
    gets its partitions and reads on from its commits: nothing missing."""
    bootstrap = kip848_sidecar.kafka_bootstrap
    topic = create(bootstrap, PARTITIONS, "kip848k")
    group = f"kip848k-{uuid.uuid4().hex[:8]}"
    a = Member(bootstrap, topic, group, tmp_path)
    b = Member(bootstrap, topic, group, tmp_path)
    try:
        _wait(
            [a, b],
            lambda: bool(a.assigned) and bool(b.assigned) and a.assigned | b.assigned == ALL,
            "the two members to share the topic",
            120,
        )
        _produce(bootstrap, topic, "one")
        ends = dict.fromkeys(ALL, PER_PHASE // PARTITIONS)

        def committed_ends() -> bool:
            last: dict[int, int] = {}
            for m in (a, b):
                for p, o in m.committed.items():
                    last[p] = max(last.get(p, 0), o)
            return last == ends

        _wait([a, b], committed_ends, "commits at the ends", 120)
        b.tool.kill()
        killed = time.monotonic()
        _wait([a], lambda: a.assigned == ALL, "the survivor to get all 4", 60)
        waited = time.monotonic() - killed
        _produce(bootstrap, topic, "two")
        ends = dict.fromkeys(ALL, 2 * PER_PHASE // PARTITIONS)
        _wait([a, b], committed_ends, "commits at the later ends", 120)
    finally:
        a.tool.stop()
        b.tool.kill()
    seen = {r for m in (a, b) for r in m.poll().records}
    assert seen == {(p, o) for p in ALL for o in range(ends[p])}
    print(f"\nthe survivor held all 4 partitions {waited:.1f}s after the kill")
    assert waited >= 8  # not before the session (10 s, heartbeats every 0.5 s) was over
