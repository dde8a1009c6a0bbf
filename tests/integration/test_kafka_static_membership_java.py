"""Static membership (KIP-345) with the Java client: two Kafka ``VerifiableConsumer``s
with ``group.instance.id`` on a 2-partition topic; one is SIGKILLed (no LeaveGroup) and
started again with the same instance id within its session. On the reference Kafka
broker and on the sidecar alike, the other member prints no revocation and no new
assignment, and the restarted one is assigned the partition its instance had."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_conformance import Target
from tests.kafka_tools import ToolProcess, parse_lines
from tests.kafka_verifiable import start_verifiable_consumer

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SESSION_MS = 20_000
QUIET_S = 4.0


class Member:
    """One VerifiableConsumer and the assignment events it printed so far."""

    def __init__(self, target: Target, topic: str, group: str, instance: str, tmp: Path) -> None:
        self.tool: ToolProcess = start_verifiable_consumer(
            target.bootstrap,
            topic,
            group,
            tmp,
            session_timeout_ms=SESSION_MS,
            config={"group.instance.id": instance, "heartbeat.interval.ms": 500},
        )

    def moves(self) -> list[tuple[str, tuple[int, ...]]]:
        text = self.tool.stdout_path.read_text(errors="replace")
        events, _ = parse_lines(text.splitlines())
        return [
            (str(e["name"]), tuple(sorted(int(p["partition"]) for p in e["partitions"])))
            for e in events
            if e.get("name") in ("partitions_assigned", "partitions_revoked")
        ]

    def assigned(self) -> tuple[int, ...] | None:
        moves = self.moves()
        if not moves or moves[-1][0] != "partitions_assigned":
            return None
        return moves[-1][1]


def _wait(check: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _split(a: Member, b: Member) -> bool:
    got = (a.assigned(), b.assigned())
    return got[0] is not None and got[1] is not None and sorted(got[0] + got[1]) == [0, 1]


def test_a_java_static_member_killed_and_restarted_rebalances_no_one(conformance, tmp_path):
    def scenario(target: Target) -> dict[str, Any]:
        topic = target.create_topic(partitions=2)
        group = target.unique("g")
        workdir = tmp_path / target.name
        a = Member(target, topic, group, "java-a", workdir)
        b = Member(target, topic, group, "java-b", workdir)
        members = [a, b]
        try:
            _wait(lambda: _split(a, b), "two static members to split the partitions")
            time.sleep(1.0)  # the first rounds' events all printed
            _wait(lambda: _split(a, b), "the split to hold")
            a_seen, b_had = len(a.moves()), b.assigned()
            b.tool.kill()  # SIGKILL: no LeaveGroup
            restarted = time.monotonic()
            b2 = Member(target, topic, group, "java-b", workdir)
            members.append(b2)
            _wait(lambda: b2.assigned() is not None, "the restarted member's assignment")
            rejoined_s = time.monotonic() - restarted
            time.sleep(QUIET_S)
            return {
                "a_moves_after_restart": a.moves()[a_seen:],
                "b2_same_partitions": b2.assigned() == b_had,
                "b2_moves": len(b2.moves()),
                "rejoined_within_session": rejoined_s < SESSION_MS / 1000,
            }
        finally:
            for m in members:
                m.tool.kill()

    kafka, sidecar = conformance
    on_kafka = scenario(kafka)
    on_sidecar = scenario(sidecar)
    print(f"\nkafka: {on_kafka}\nsidecar: {on_sidecar}")
    assert on_kafka["a_moves_after_restart"] == [], on_kafka  # the oracle agrees
    assert on_sidecar == on_kafka
