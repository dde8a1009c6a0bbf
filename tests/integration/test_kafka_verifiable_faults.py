"""At-least-once group consumption judged the way Kafka's own system tests judge it
(``consumer_test.py`` over ``verifiable_consumer.py``'s event handlers): two of Kafka's
VerifiableConsumers in one group, each through a different sidecar, committing after
every poll, while an idempotent producer writes (a seed, then on and on, as the system
tests' producer does, so that each fault lands mid-consumption). Two faults, one after
the other on the same members (one JVM start each, for CI's budget), each judged once
the group has committed every partition's end:

1. the sidecar member 0 talks to is SIGKILLed and restarted on the same port; member 0's
   session outlasts the restart, so it keeps its membership (its commit in flight waits
   for the sidecar, then goes through) unless the machine is slow enough to expire it,
   which the oracle allows for;
2. member 1 is SIGKILLed; after its (short) session member 0 takes both partitions.

The oracle is :func:`tests.kafka_verifiable.judge`; the counts of each fault are
printed."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.integration.kafka_consume import create
from tests.kafka_tools import ToolProcess, parse_lines
from tests.kafka_verifiable import AtLeastOnce, judge, start_verifiable_consumer
from tests.sidecar import ProcessSidecar, ThreadSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PARTITIONS = 2
SEED = 300  # per partition
GROUP_SETTINGS = {"kafka_group_min_session_timeout_ms": 1000, "group_sweep_interval_ms": 100}
LONG_SESSION_MS = 20_000  # member 0: outlasts a sidecar restart on a loaded machine
SHORT_SESSION_MS = 3_000  # member 1: its partition moves soon after it is killed


class LiveProducer:
    """An idempotent producer writing ``seed`` records to each partition at once, then
    about ``rate`` records a second in turn to each, on its own thread until
    :meth:`stop`; ``acked`` holds the values acknowledged (each unique: the oracle's
    identity of a record, as a produce answer may carry no offset)."""

    def __init__(self, bootstrap: str, topic: str, tag: str, seed: int = 0, rate=150.0) -> None:
        self.topic, self.tag, self.pause = topic, tag, 1.0 / rate
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        self.acked: list[str] = []
        self.failures: list[Any] = []
        self._n = 0
        for _ in range(seed * PARTITIONS):
            self._send()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="live-producer")
        self._thread.start()

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failures.append(err)
        else:
            self.acked.append(msg.value().decode())

    def _send(self) -> None:
        value = f"{self.tag}-{self._n}".encode()
        self.producer.produce(
            self.topic, value=value, partition=self._n % PARTITIONS, on_delivery=self._report
        )
        self.producer.poll(0)
        self._n += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._send()
            time.sleep(self.pause)

    def halt(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def stop(self) -> list[str]:
        """Stop, wait for every answer; the values acknowledged (all of them)."""
        self.halt()
        assert self.producer.flush(60) == 0
        assert self.failures == [], self.failures
        return self.acked


class Member:
    """One VerifiableConsumer and what it printed so far, read incrementally (the test
    polls often; re-reading thousands of lines each time would load a 2-core machine)."""

    def __init__(self, tool: ToolProcess) -> None:
        self.tool = tool
        self.events: list[dict[str, Any]] = []
        self.assigned: set[int] = set()
        self.consumed = 0
        self.committed: dict[int, int] = {}
        self._read = 0

    def poll(self) -> Member:
        with self.tool.stdout_path.open("rb") as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        for event in parse_lines(complete.decode(errors="replace").splitlines())[0]:
            self.events.append(event)
            name = event.get("name")
            if name == "partitions_assigned":
                self.assigned = {int(p["partition"]) for p in event["partitions"]}
            elif name == "partitions_revoked":
                self.assigned = set()
            elif name == "record_data":
                self.consumed += 1
            elif name == "offsets_committed" and event["success"]:
                for o in event["offsets"]:
                    p = int(o["partition"])
                    self.committed[p] = max(self.committed.get(p, 0), int(o["offset"]))
        return self


class Scenario:
    """A topic, the producer, and two members in one group: ``members[0]`` through the
    process sidecar ``a`` (long session), ``members[1]`` through ``b`` (short)."""

    def __init__(self, a: ProcessSidecar, b: ThreadSidecar, tmp: Path) -> None:
        self.a, self.b = a, b
        self.started = time.monotonic()
        self.phases: list[str] = []
        self.topic = create(b.kafka_bootstrap, PARTITIONS, "vcf")
        self.group = f"vcf-{uuid.uuid4().hex[:8]}"
        self.members = [
            Member(
                start_verifiable_consumer(
                    sc.kafka_bootstrap,
                    self.topic,
                    self.group,
                    tmp,
                    session_timeout_ms=session,
                    config={
                        "heartbeat.interval.ms": 500,
                        "max.poll.interval.ms": 30_000,  # the rebalance timeout
                        "max.poll.records": 50,  # several polls and commits per fetch
                    },
                )
            )
            for sc, session in ((a, LONG_SESSION_MS), (b, SHORT_SESSION_MS))
        ]
        # the seed goes in while the JVMs start; they read from the earliest offset
        self.producer = LiveProducer(b.kafka_bootstrap, self.topic, "fault1", seed=SEED)
        self.produced: list[str] = []
        self.verdicts: list[AtLeastOnce] = []

    def mark(self, what: str) -> None:
        self.phases.append(f"{time.monotonic() - self.started:.1f}s {what}")

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
        """Poll the members until ``check`` holds; on the deadline fail with their words."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"-- member {i} (pid {m.tool.pid}):\n{m.tool.stop(grace=1).stderr_tail(15)}"
                    for i, m in enumerate(self.members)
                )
                raise AssertionError(f"timed out waiting for {what}; {self.phases}\n{tails}")
            time.sleep(0.2)
            for m in self.members:
                m.poll()
        self.mark(what)

    def produced_more(self, n: int = 150) -> None:
        target = len(self.producer.acked) + n
        self.wait(lambda: len(self.producer.acked) >= target, f"{n} more records produced")

    def judged(self, fault: str, live: list[Member]) -> dict[str, Any]:
        """Stop producing, wait until the group has committed every partition's end, then
        judge every event so far; the counts of this fault (since the last verdict)."""
        self.produced += self.producer.stop()
        ends = offsets(self.b.kafka_bootstrap, self.topic, self.group)[1]

        def at_ends() -> bool:
            last: dict[int, int] = {}
            for m in live:
                for p, offset in m.committed.items():
                    last[p] = max(last.get(p, 0), offset)
            return last == ends

        self.wait(at_ends, f"commits to reach the ends {ends}")
        verdict = judge(
            [m.poll().events for m in self.members],
            self.produced,
            {(self.topic, p): end for p, end in ends.items()},
        )
        assert verdict.violations == [], verdict.violations
        before = self.verdicts[-1].counts() if self.verdicts else {}
        self.verdicts.append(verdict)
        counts = {k: v - before.get(k, 0) for k, v in verdict.counts().items()}
        print(f"\nVerifiableConsumer, {fault}: {counts}")
        assert offsets(self.b.kafka_bootstrap, self.topic, self.group)[0] == ends
        return counts

    def close(self) -> None:
        self.producer.halt()
        for m in self.members:
            m.tool.kill()


def offsets(bootstrap: str, topic: str, group: str) -> tuple[dict[int, int], dict[int, int]]:
    """(the group's committed offset, the end offset) per partition, as a client sees
    them. A retriable error is asked again by a new client, as Kafka's Java client
    would retry (librdkafka's ``committed()`` gives up at once): while the members of the group
    talk to two sidecars, each takes the group's state partition for its member's
    writes, and an OffsetFetch at the sidecar just fenced answers NOT_COORDINATOR."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    deadline = time.monotonic() + 30
    while True:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            ends = {tp.partition: c.get_watermark_offsets(tp, timeout=30)[1] for tp in tps}
            return {tp.partition: tp.offset for tp in c.committed(tps, timeout=30)}, ends
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_MOVED or time.monotonic() > deadline:
                raise
            NOT_COORDINATOR_ANSWERS.append(exc.args[0].str())
        finally:
            c.close()
        time.sleep(0.2)


_COORDINATOR_MOVED = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE}
NOT_COORDINATOR_ANSWERS: list[str] = []
"""What :func:`offsets` was answered and asked again (printed by the test)."""


@pytest.fixture
def sidecars(pulsar: Any, tmp_path: Path) -> Iterator[tuple[ProcessSidecar, ThreadSidecar]]:
    """``a`` a process (the fault SIGKILLs it), ``b`` a thread (the producer's)."""
    a = ProcessSidecar(pulsar, tmp_path, **GROUP_SETTINGS)
    with ThreadSidecar(pulsar, **GROUP_SETTINGS) as b:
        a.start()
        try:
            yield a, b
        finally:
            a.stop()


def test_verifiable_consumers_read_at_least_once_through_sidecar_and_member_sigkills(
    sidecars: tuple[ProcessSidecar, ThreadSidecar], tmp_path: Path
) -> None:
    a, b = sidecars
    s = Scenario(a, b, tmp_path)
    try:
        moved, victim = s.members
        s.wait(
            lambda: all(len(m.assigned) == 1 and m.consumed > 0 for m in s.members),
            "both members to hold a partition and read",
        )
        before = moved.consumed
        a.kill()
        s.mark("sidecar a SIGKILLed")
        a.start()
        s.mark("sidecar a restarted")
        s.wait(lambda: moved.consumed > before, "member 0 to read through the restarted sidecar")
        s.produced_more()
        s.judged("sidecar SIGKILL mid-consumption, restarted", s.members)

        s.producer = LiveProducer(b.kafka_bootstrap, s.topic, "fault2")
        s.produced_more()
        victim.tool.kill()
        s.mark("member 1 SIGKILLed")
        s.wait(lambda: moved.assigned == set(range(PARTITIONS)), "member 0 to take both")
        s.produced_more()
        s.judged("member SIGKILL mid-consumption", [moved])
        run = moved.tool.stop()  # leaves the group
        assert any(e.get("name") == "shutdown_complete" for e in run.events), run.stderr_tail()
        with httpx.Client(base_url=b.url, timeout=60) as http:
            lag = http.get(f"/v1/groups/{s.group}/lag")
        assert lag.status_code == 200, lag.text
        ends = offsets(b.kafka_bootstrap, s.topic, s.group)[1]
        rows = {r["partition"]: (r["committed"], r["lag"]) for r in lag.json()["partitions"]}
        assert rows == {p: (end, 0) for p, end in ends.items()}
        s.mark("member 0 left")
        print(f"phases: {s.phases}; OffsetFetch asked again: {len(NOT_COORDINATOR_ANSWERS)}")
    finally:
        s.close()
