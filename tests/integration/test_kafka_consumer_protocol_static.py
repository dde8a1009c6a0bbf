"""Static membership under the consumer protocol (KIP-848 with ``group.instance.id``),
the same scenarios against the reference Kafka 4.1 broker and the listener:

- by hand, heartbeat by heartbeat, the answers compared field by field (member ids
  named by role, a positive heartbeat interval as such): a static member and a dynamic
  one settle on a 4-partition topic; a join under another member id with the held
  instance id (111), a heartbeat and a leave of another member id (82), an unknown
  instance id (25), the request checks (42); the static member leaves at -2 (kept with
  its partitions at epoch -2, the group epoch unmoved), its old id beating again (110);
  a new member id with its instance id takes its partitions at the same epoch, the
  other member's assignment and epoch untouched, the old id fenced (82); a leave at -1
  removes it (a new epoch);
- with Kafka's Java consumer (VerifiableConsumer, ``group.protocol=consumer``,
  ``group.instance.id``): a static member closed (its leave at -2) and started again
  within the session gets the partitions it had, at the same group epoch, and the other
  member sees no revocation or assignment."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from kop_dedup.transports.kafka.schemas import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
)
from kop_dedup_tools import kafka_jars
from tests.integration.kafka_consume import create
from tests.kafka_tools import ToolProcess, parse_lines, start_tool
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration]

PARTITIONS = 4
_TP = ConsumerGroupHeartbeatRequest.TopicPartitions


class Wire:
    """One member spoken for by hand: its id, instance id, epoch and partitions."""

    def __init__(self, c: WireClient, group: str, topic: str, tid: Any, instance: str | None):
        self.c, self.group, self.topic, self.tid = c, group, topic, tid
        self.member_id, self.instance = str(uuid.uuid4())[:22], instance
        self.epoch, self.assigned = 0, []

    def beat(self, epoch: int | None = None, member_id: str | None = None, **kw: Any) -> Any:
        return self.c.call(
            ConsumerGroupHeartbeatRequest(
                group_id=self.group,
                member_id=member_id or self.member_id,
                member_epoch=self.epoch if epoch is None else epoch,
                instance_id=kw.get("instance", self.instance),
                rack_id=None,
                rebalance_timeout_ms=kw.get("rebalance_timeout_ms", 30_000),
                subscribed_topic_names=kw.get("topics"),
                subscribed_topic_regex=None,
                server_assignor=None,
                topic_partitions=kw.get("owned", self.owned()),
            ),
            1,
        )

    def owned(self) -> list[Any]:
        return [_TP(topic_id=self.tid, partitions=self.assigned)] if self.assigned else []

    def step(self, **kw: Any) -> Any:
        """A heartbeat as a client sends it: its epoch and what it owns; the answer
        taken in."""
        answer = self.beat(**kw)
        assert answer.error_code == 0, answer
        self.take(answer)
        return answer

    def take(self, answer: Any) -> None:
        self.member_id, self.epoch = answer.member_id, answer.member_epoch
        if answer.assignment is not None:
            self.assigned = sorted(
                p for tp in answer.assignment.topic_partitions for p in tp.partitions
            )

    def join(self) -> Any:
        answer = None
        deadline = time.monotonic() + 60
        while answer is None or answer.error_code in (14, 15, 16):
            if answer is not None:
                assert time.monotonic() < deadline, answer
                time.sleep(0.3)
            answer = self.beat(0, topics=[self.topic], owned=[])
        assert answer.error_code == 0, answer
        self.take(answer)
        return answer


def _describe(c: WireClient, group: str) -> Any:
    request = ConsumerGroupDescribeRequest(group_ids=[group], include_authorized_operations=False)
    return c.call(request, 1).groups[0]


def _ready(c: WireClient, group: str) -> None:
    """Kafka creates its offsets topic at the first FindCoordinator: until then its
    heartbeats answer 16."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = c.call(FindCoordinatorRequest(key=group, key_type=0), 2).error_code == 0
        if found and _describe(c, group).error_code not in (14, 15, 16):
            return
        time.sleep(0.3)
    raise AssertionError(f"no coordinator for {group}")


def _topic_known(c: WireClient, group: str, topic: str, tid: Any) -> None:
    """Kafka's group coordinator sees a new topic once its metadata image has it, a
    moment after Metadata answers it: a member that joins before gets nothing, and its
    group takes one more epoch when the topic comes (the settled members were then at
    epoch 3 with the partitions the other way round, Kafka's timing alone). A member of
    another group is assigned the whole topic first, then leaves."""
    probe = Wire(c, f"{group}-probe", topic, tid, None)
    _ready(c, probe.group)
    probe.join()
    deadline = time.monotonic() + 60
    while len(probe.assigned) < PARTITIONS:
        assert time.monotonic() < deadline, probe.assigned
        time.sleep(0.2)
        probe.step()
    assert probe.beat(-1).error_code == 0


def _settle(c: WireClient, group: str, members: list[Wire]) -> Any:
    """Heartbeats until the group is Stable with every partition held, two each."""
    deadline = time.monotonic() + 60
    while True:
        for m in members:
            m.step()
        described = _describe(c, group)
        held = sorted(len(m.assigned) for m in members)
        settled = all(m.epoch == described.assignment_epoch for m in members)
        if described.group_state == "Stable" and held == [2, 2] and settled:
            return described
        assert time.monotonic() < deadline, (described, [m.assigned for m in members])
        time.sleep(0.2)


def _answer(answer: Any, names: dict[str, str]) -> tuple[Any, ...]:
    """An answer with member ids named by role and a positive interval as such."""
    message = answer.error_message
    for member_id, name in names.items():
        message = message.replace(member_id, name) if message else message
    assignment = None
    if answer.assignment is not None:
        assignment = sorted(p for tp in answer.assignment.topic_partitions for p in tp.partitions)
    interval = answer.heartbeat_interval_ms
    return (
        answer.error_code,
        message,
        names.get(answer.member_id, answer.member_id),
        answer.member_epoch,
        "positive" if interval > 0 else interval,
        assignment,
    )


def _members(described: Any, names: dict[str, str]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            names.get(m.member_id, m.member_id),
            m.instance_id,
            m.member_epoch,
            sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions),
        )
        for m in described.members
    )


def wire_scenario(bootstrap: str) -> dict[str, Any]:
    topic = create(bootstrap, PARTITIONS, "kip848s")
    group = f"kip848s-{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {}
    with WireClient(bootstrap) as c:
        asked = MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)
        tid = c.call(MetadataRequest(topics=[asked], allow_auto_topic_creation=False), 12)
        tid = tid.topics[0].topic_id
        a = Wire(c, group, topic, tid, "ia")
        b = Wire(c, group, topic, tid, None)
        newcomer = Wire(c, group, topic, tid, "ia")
        names = {a.member_id: "A", b.member_id: "B", newcomer.member_id: "C"}
        _ready(c, group)
        _topic_known(c, group, topic, tid)
        a.join()
        b.join()
        before = _settle(c, group, [a, b])
        epoch = before.group_epoch
        out["settled"] = (before.group_state, _members(before, names))
        out["unreleased"] = _answer(newcomer.beat(0, topics=[topic], owned=[]), names)
        out["unreleased_own_id"] = _answer(a.beat(0, topics=[topic], owned=[]), names)
        out["fenced"] = _answer(newcomer.beat(a.epoch, owned=a.owned()), names)
        out["fenced_leave"] = _answer(newcomer.beat(-2), names)
        out["unknown_instance"] = _answer(a.beat(instance="nobody"), names)
        out["empty_instance"] = _answer(newcomer.beat(0, instance="", topics=[topic]), names)
        out["minus_two_without_instance"] = _answer(b.beat(-2), names)
        out["minus_three"] = _answer(a.beat(-3), names)
        out["still_stable"] = _describe(c, group).group_epoch == epoch
        # the static member closes: kept at -2 with its partitions
        out["leave"] = _answer(a.beat(-2), names)
        away = _describe(c, group)
        out["away"] = (away.group_state, away.group_epoch == epoch, _members(away, names))
        out["away_beat"] = _answer(a.beat(), names)
        out["other_while_away"] = _answer(b.beat(), names)
        # a new incarnation takes its place
        out["take_over"] = _answer(newcomer.beat(0, topics=[topic], owned=[]), names)
        after = _describe(c, group)
        out["after"] = (after.group_state, after.group_epoch == epoch, _members(after, names))
        out["old_id"] = _answer(a.beat(), names)
        out["other_after"] = _answer(b.beat(), names)
        newcomer.epoch = a.epoch
        out["gone"] = _answer(newcomer.beat(-1), names)
        last = _describe(c, group)
        out["last"] = (last.group_epoch - epoch, [m[0] for m in _members(last, names)])
    return out


def test_static_members_of_the_consumer_protocol_answer_as_kafka(
    sidecar_kafka: str, kafka_reference: Any
) -> None:
    ours, theirs = wire_scenario(sidecar_kafka), wire_scenario(kafka_reference.bootstrap)
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    # what Kafka answers, as the brief and Kafka's code say
    assert theirs["unreleased"][0] == 111
    assert theirs["fenced"][0] == 82
    assert theirs["leave"][2:4] == ("A", -2)
    assert theirs["take_over"][2] == "C"
    assert theirs["after"][1] is True
    for k in theirs:
        assert ours[k] == theirs[k], k


# -- Kafka's Java consumer ---------------------------------------------------------------


class Member:
    """One VerifiableConsumer of the consumer protocol with an instance id: what it
    holds, and the rebalance events it printed."""

    def __init__(self, bootstrap: str, topic: str, group: str, instance: str, workdir: Path):
        args = [
            *("--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group),
            *("--reset-policy", "earliest", "--group-protocol", "consumer"),
            *("--group-instance-id", instance),
        ]
        self.tool: ToolProcess = start_tool(kafka_jars.VERIFIABLE_CONSUMER, args, workdir)
        self.assigned: set[int] = set()
        self.rebalances = 0
        self._read = 0

    def poll(self) -> Member:
        with self.tool.stdout_path.open("rb") as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        for e in parse_lines(complete.decode(errors="replace").splitlines())[0]:
            parts = {int(p["partition"]) for p in e.get("partitions", ())}
            if e.get("name") == "partitions_assigned":  # incremental under this protocol
                self.assigned |= parts
                self.rebalances += bool(parts)
            elif e.get("name") == "partitions_revoked":
                self.assigned -= parts
                self.rebalances += bool(parts)
        return self


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


def restart_scenario(bootstrap: str, workdir: Path) -> dict[str, Any]:
    topic = create(bootstrap, PARTITIONS, "kip848sj")
    group = f"kip848sj-{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True, exist_ok=True)
    a = Member(bootstrap, topic, group, "static-a", workdir)
    b = Member(bootstrap, topic, group, "static-b", workdir)
    members = [a, b]
    try:
        _wait(
            members,
            lambda: (
                sorted([len(a.assigned), len(b.assigned)]) == [2, 2]
                and a.assigned | b.assigned == set(range(PARTITIONS))
            ),
            "the two members to share the topic",
            180,
        )
        with WireClient(bootstrap) as c:
            deadline = time.monotonic() + 60
            while (before := _describe(c, group)).group_state != "Stable":
                assert time.monotonic() < deadline, before
                time.sleep(0.2)
            held, b_held, b_rebalances = set(a.assigned), set(b.assigned), b.poll().rebalances
            a_id = next(m.member_id for m in before.members if m.instance_id == "static-a")
            closed = time.monotonic()
            a.tool.stop()  # SIGTERM: the consumer closes, its leave at -2
            away = _describe(c, group)
            a2 = Member(bootstrap, topic, group, "static-a", workdir)
            members.append(a2)
            _wait(members, lambda: a2.assigned == held, "the restarted member's partitions", 120)
            back_s = time.monotonic() - closed
            time.sleep(2)  # a rebalance the restart caused would reach b by now
            after = _describe(c, group)
            b.poll()
        away_a = [m for m in away.members if m.instance_id == "static-a"]
        return {
            "away": [
                (m.member_epoch, len(m.assignment.topic_partitions[0].partitions)) for m in away_a
            ],
            "same_group_epoch": after.group_epoch == before.group_epoch,
            "state": after.group_state,
            "new_member_id": next(m.member_id for m in after.members if m.instance_id == "static-a")
            != a_id,
            "restarted_holds": sorted(a2.assigned) == sorted(held),
            "other_untouched": (b.assigned == b_held, b.rebalances - b_rebalances),
            "back_within_session": back_s < 45,
        }
    finally:
        for m in members:
            m.tool.stop(grace=5)


def test_a_static_java_consumer_restarted_within_its_session_keeps_its_partitions(
    sidecar_kafka: str, kafka_reference: Any, tmp_path: Path
) -> None:
    theirs = restart_scenario(kafka_reference.bootstrap, tmp_path / "kafka")
    ours = restart_scenario(sidecar_kafka, tmp_path / "sidecar")
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    assert theirs["away"] == [(-2, 2)]
    assert theirs["same_group_epoch"] is True
    assert theirs["other_untouched"] == (True, 0)
    assert ours == theirs


# -- librdkafka ---------------------------------------------------------------------------


class Rd:
    """A confluent-kafka consumer of the consumer protocol with an instance id, counting
    the rebalance callbacks that moved partitions."""

    def __init__(self, bootstrap: str, topic: str, group: str, instance: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "group.instance.id": instance,
                "auto.offset.reset": "earliest",
            }
        )
        self.moves = 0
        self.consumer.subscribe([topic], on_assign=self._moved, on_revoke=self._moved)

    def _moved(self, _consumer: Any, partitions: list[Any]) -> None:
        self.moves += bool(partitions)

    def held(self) -> set[int]:
        self.consumer.poll(0.1)
        return {tp.partition for tp in self.consumer.assignment()}


def _until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def rdkafka_scenario(bootstrap: str) -> dict[str, Any]:
    topic = create(bootstrap, PARTITIONS, "kip848sr")
    group = f"kip848sr-{uuid.uuid4().hex[:8]}"
    a, b = Rd(bootstrap, topic, group, "rd-a"), Rd(bootstrap, topic, group, "rd-b")
    opened, closed = [a, b], []
    try:
        _until(
            lambda: (
                sorted([len(a.held()), len(b.held())]) == [2, 2]
                and a.held() | b.held() == set(range(PARTITIONS))
            ),
            "the two consumers to share the topic",
            90,
        )
        with WireClient(bootstrap) as c:
            _until(lambda: _describe(c, group).group_state == "Stable", "a stable group", 60)
            before = _describe(c, group)
            held, b_held, b_moves = a.held(), b.held(), b.moves
            a.consumer.close()  # librdkafka's leave: -2 with an instance id
            closed.append(a)
            away = [m for m in _describe(c, group).members if m.instance_id == "rd-a"]
            a2 = Rd(bootstrap, topic, group, "rd-a")
            opened.append(a2)
            _until(lambda: a2.held() == held and bool(b.held()), "the restarted consumer", 60)
            for _ in range(20):  # a rebalance the restart caused would reach b by now
                b.held()
            after = _describe(c, group)
        return {
            "away": [m.member_epoch for m in away],
            "same_group_epoch": after.group_epoch == before.group_epoch,
            "restarted_holds": a2.held() == held,
            "other_untouched": (b.held() == b_held, b.moves - b_moves),
        }
    finally:
        for rd in opened:
            if rd not in closed:
                rd.consumer.close()


def test_a_static_librdkafka_consumer_restarted_within_its_session_keeps_its_partitions(
    sidecar_kafka: str, kafka_reference: Any
) -> None:
    theirs = rdkafka_scenario(kafka_reference.bootstrap)
    ours = rdkafka_scenario(sidecar_kafka)
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    assert theirs["same_group_epoch"] is True
    assert ours == theirs
