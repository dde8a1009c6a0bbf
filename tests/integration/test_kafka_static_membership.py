"""Static membership (KIP-345, ``group.instance.id``) with Kafka itself as the oracle.

Two confluent-kafka consumers with instance ids share a 2-partition topic; one closes
without leaving (a static member never sends LeaveGroup) and a new consumer with the
same instance id starts within the session: the other sees no rebalance (no revocation,
no new assignment) and the restarted one gets the partitions its instance had. The
same scenario runs on the reference Kafka broker and on the sidecar, outcomes compared.
A bare wire client checks the codes of the old member id once replaced: 82 for its
Heartbeat, SyncGroup, OffsetCommit, TxnOffsetCommit, JoinGroup and LeaveGroup, 25
without its instance id, and LeaveGroup by instance id alone.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import Consumer
from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    SyncGroupRequest,
)

from tests.kafka_conformance import Target
from tests.kafka_group_wire import join
from tests.kafka_txn_wire import TxnWire
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SESSION_MS = 10_000
QUIET_S = 4.0
"""How long the other member is watched after the restart: several heartbeats (500 ms
apart), well inside the session (a rebalance would show as a revocation within it)."""


class StaticMember:
    """One confluent-kafka consumer with a ``group.instance.id`` polling on a thread;
    ``events`` holds ("assign" | "revoke", partitions) in the order they came."""

    def __init__(self, target: Target, topic: str, group: str, instance: str) -> None:
        self.events: list[tuple[str, tuple[int, ...]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._consumer = Consumer(
            target.config(
                **{
                    "group.id": group,
                    "group.instance.id": instance,
                    "session.timeout.ms": SESSION_MS,
                    "heartbeat.interval.ms": 500,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "partition.assignment.strategy": "range",
                }
            )
        )
        self._consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"static-{instance}")
        self._thread.start()

    def _assign(self, _c: Consumer, partitions: list[Any]) -> None:
        self.events.append(("assign", tuple(sorted(p.partition for p in partitions))))

    def _revoke(self, _c: Consumer, partitions: list[Any]) -> None:
        self.events.append(("revoke", tuple(sorted(p.partition for p in partitions))))

    def assigned(self) -> tuple[int, ...] | None:
        """The partitions of its last assignment (None before any, or after a revocation)."""
        if not self.events or self.events[-1][0] != "assign":
            return None
        return self.events[-1][1]

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                msg = self._consumer.poll(0.1)
                if msg is not None and msg.error() is not None:
                    self.errors.append(msg.error().name())
        finally:
            self._consumer.close()  # a static member does not leave the group

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _wait(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _described(target: Target, group: str) -> tuple[str, list[str | None]]:
    with WireClient(target.bootstrap) as c:
        answer = c.call(
            DescribeGroupsRequest(groups=[group], include_authorized_operations=False), 4
        )
    g = answer.groups[0]
    return g.group_state, sorted((m.group_instance_id for m in g.members), key=str)


def _split(a: StaticMember, b: StaticMember) -> bool:
    got = (a.assigned(), b.assigned())
    return None not in got and sorted(got[0] + got[1]) == [0, 1] and len(got[0]) == 1  # type: ignore[operator, arg-type]


def test_restart_of_a_static_member_keeps_its_partitions_and_rebalances_no_one(conformance):
    def scenario(target: Target) -> dict[str, Any]:
        topic = target.create_topic(partitions=2)
        group = target.unique("g")
        a = StaticMember(target, topic, group, "inst-a")
        b = StaticMember(target, topic, group, "inst-b")
        try:
            _wait(lambda: _split(a, b), "two static members to split the partitions")
            time.sleep(1.0)  # the first round's callbacks all in
            _wait(lambda: _split(a, b), "the split to hold")
            a_before, b_before = a.assigned(), b.assigned()
            a_events = len(a.events)
            b.close()  # no LeaveGroup: the group keeps inst-b's place for its session
            restarted = time.monotonic()
            b2 = StaticMember(target, topic, group, "inst-b")
            try:
                _wait(lambda: b2.assigned() is not None, "the restarted member's assignment")
                rejoined_s = time.monotonic() - restarted
                time.sleep(QUIET_S)
                state, instances = _described(target, group)
                return {
                    "a_events_after_restart": a.events[a_events:],
                    "a_kept": a.assigned() == a_before,
                    "b2_events": list(b2.events),
                    "b2_same_partitions": b2.assigned() == b_before,
                    "rejoined_within_session": rejoined_s < SESSION_MS / 1000,
                    "state": state,
                    "instances": instances,
                    "errors": a.errors + b2.errors,
                }
            finally:
                b2.close()
        finally:
            a.close()
            b.close()

    kafka, sidecar = conformance
    on_kafka = scenario(kafka)
    on_sidecar = scenario(sidecar)
    print(f"\nkafka: {on_kafka}\nsidecar: {on_sidecar}")
    assert on_kafka["a_events_after_restart"] == [], on_kafka  # the oracle agrees
    assert on_kafka["b2_same_partitions"], on_kafka
    for key in ("a_events_after_restart", "a_kept", "b2_same_partitions", "state", "instances"):
        assert on_sidecar[key] == on_kafka[key], key
    assert on_sidecar["rejoined_within_session"]
    assert len(on_sidecar["b2_events"]) == len(on_kafka["b2_events"]) == 1
    assert on_sidecar["instances"] == ["inst-a", "inst-b"]


def test_a_static_member_that_never_returns_is_removed_when_its_session_passes(conformance):
    """No restart: the other member keeps its one partition until the closed member's
    session passes (no LeaveGroup was sent), then a rebalance gives it both."""

    def scenario(target: Target) -> dict[str, Any]:
        topic = target.create_topic(partitions=2)
        group = target.unique("g")
        a = StaticMember(target, topic, group, "inst-a")
        b = StaticMember(target, topic, group, "inst-b")
        try:
            _wait(lambda: _split(a, b), "two static members to split the partitions")
            time.sleep(1.0)  # the first round's callbacks all in
            _wait(lambda: _split(a, b), "the split to hold")
            b.close()
            closed = time.monotonic()
            _wait(lambda: a.assigned() == (0, 1), "A to get both partitions", SESSION_MS / 100)
            waited = time.monotonic() - closed
            return {
                "a_has_both": a.assigned(),
                "waited_most_of_a_session": waited > 0.7 * SESSION_MS / 1000,
            }
        finally:
            a.close()
            b.close()

    kafka, sidecar = conformance
    on_kafka = scenario(kafka)
    on_sidecar = scenario(sidecar)
    print(f"\nkafka: {on_kafka}\nsidecar: {on_sidecar}")
    assert on_sidecar == on_kafka == {"a_has_both": (0, 1), "waited_most_of_a_session": True}


# -- the codes of a replaced member id, over the wire ----------------------------------------


def _beat(c: WireClient, group: str, member: str, gen: int, instance: str | None) -> int:
    request = HeartbeatRequest(
        group_id=group, generation_id=gen, member_id=member, group_instance_id=instance
    )
    return int(c.call(request, 3).error_code)


def _sync(c: WireClient, group: str, member: str, gen: int, instance: str | None) -> int:
    a = SyncGroupRequest.SyncGroupRequestAssignment
    request = SyncGroupRequest(
        group_id=group,
        generation_id=gen,
        member_id=member,
        group_instance_id=instance,
        assignments=[a(member_id=member, assignment=b"x")],
    )
    return int(c.call(request, 3).error_code)


def _commit(
    c: WireClient, group: str, topic: str, member: str, gen: int, instance: str | None
) -> int:
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    p = t.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata=""
    )
    request = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=gen,
        member_id=member,
        group_instance_id=instance,
        topics=[t(name=topic, partitions=[p])],
    )
    return int(c.call(request, 8).topics[0].partitions[0].error_code)


def _leave(c: WireClient, group: str, member: str, instance: str | None) -> tuple[int, int]:
    who = LeaveGroupRequest.MemberIdentity(
        member_id=member, group_instance_id=instance, reason=None
    )
    answer = c.call(LeaveGroupRequest(group_id=group, members=[who]), 3)
    return int(answer.error_code), int(answer.members[0].error_code)


def _txn_commits(
    target: Target, group: str, topic: str, who: list[tuple[str, str | None]], gen: int
) -> list[int]:
    """TxnOffsetCommit v3 of each (member id, instance id) in one transaction (aborted)."""
    with TxnWire(target.bootstrap, target.unique("tx")) as txn:
        assert txn.init() == 0
        assert txn.add_offsets(group) == 0
        codes = [
            txn.commit_offsets(group, {(topic, 0): 1}, member=m, generation=gen, instance=i)[
                (topic, 0)
            ]
            for m, i in who
        ]
        assert txn.end(commit=False) == 0
    return codes


def test_replaced_member_id_is_fenced_as_kafka_fences_it(conformance):
    def scenario(target: Target) -> list[Any]:
        group = target.unique("g")
        topic = target.create_topic(partitions=1)
        with WireClient(target.bootstrap) as c:
            first = join(c, group, "", instance="inst")  # static: no 79 round trip
            old, gen = first.member_id, first.generation_id
            codes: list[Any] = [first.error_code, first.leader == old]
            codes.append(_sync(c, group, old, gen, "inst"))
            again = join(c, group, "", instance="inst")  # a restart: Stable, no rebalance
            new = again.member_id
            codes += [again.error_code, again.generation_id == gen, new != old]
            # the leader as it was: a restarted leader must not assign in a Stable group
            codes += [again.leader == old, _sync(c, group, new, gen, "inst")]
            codes += [
                _beat(c, group, old, gen, "inst"),
                _beat(c, group, old, gen, None),
                _beat(c, group, new, gen, "inst"),
                _beat(c, group, new, gen, "other"),
                _sync(c, group, old, gen, "inst"),
                _commit(c, group, topic, old, gen, "inst"),
                _commit(c, group, topic, new, gen, "inst"),
                join(c, group, old, instance="inst").error_code,
                *_txn_commits(
                    target, group, topic, [(old, "inst"), (old, None), (new, "inst")], gen
                ),
                _leave(c, group, old, "inst"),
                _leave(c, group, "", "nobody"),
                _leave(c, group, "", "inst"),
                _beat(c, group, new, gen, "inst"),
            ]
        return codes

    kafka, sidecar = conformance
    on_kafka = scenario(kafka)
    assert on_kafka[:2] == [0, True], on_kafka
    on_sidecar = scenario(sidecar)
    print(f"\nkafka {on_kafka}\nsidecar {on_sidecar}")
    assert on_sidecar == on_kafka


def test_a_join_waiting_in_a_round_is_fenced_when_its_instance_restarts(conformance):
    """A static member's JoinGroup waiting for a round to complete is answered 82 when a
    restart of its instance takes its place; the round completes with the new id."""

    def scenario(target: Target) -> list[Any]:
        group = target.unique("g")

        def call(member: str, instance: str | None) -> Any:
            with WireClient(target.bootstrap) as own:
                return join(own, group, member, instance=instance)

        def state() -> str:
            return _described(target, group)[0]

        with ThreadPoolExecutor(4) as pool:
            a = call("", "ia")
            with WireClient(target.bootstrap) as c:
                assert _sync(c, group, a.member_id, a.generation_id, "ia") == 0
            b_first = pool.submit(call, "", "ib")  # a round that waits for A
            _wait(lambda: state() == "PreparingRebalance", "the round B starts")
            a_again = call(a.member_id, "ia")
            b = b_first.result(timeout=60)
            with WireClient(target.bootstrap) as c:
                leader = a_again if a_again.leader == a_again.member_id else b
                assert _sync(c, group, leader.member_id, leader.generation_id, None) == 0
            gen = a_again.generation_id
            _wait(lambda: state() == "Stable", "the group of A and B")
            with WireClient(target.bootstrap) as c:
                c_id = join(c, group, "").member_id  # C, dynamic: its id first (79)
            c_join = pool.submit(call, c_id, None)  # a round that waits for A and B
            _wait(lambda: state() == "PreparingRebalance", "the round C starts")
            a_old = pool.submit(call, a.member_id, "ia")
            time.sleep(0.5)  # A's join is in (nothing shows a waiting join)
            a_new = pool.submit(call, "", "ia")  # A restarts while its join waits
            time.sleep(0.5)
            b_join = pool.submit(call, b.member_id, "ib")  # the last to join
            old, new, bj, cj = (f.result(timeout=60) for f in (a_old, a_new, b_join, c_join))
        leaders = [x for x in (new, bj, cj) if x.leader == x.member_id]
        return [
            a.error_code,
            b.error_code,
            old.error_code,
            new.error_code,
            bj.error_code,
            cj.error_code,
            [x.generation_id - gen for x in (new, bj, cj)],
            new.member_id != a.member_id,
            [len(x.members) for x in leaders],
            sorted((m.group_instance_id for m in leaders[0].members), key=str),
        ]

    kafka, sidecar = conformance
    on_kafka = scenario(kafka)
    on_sidecar = scenario(sidecar)
    print(f"\nkafka {on_kafka}\nsidecar {on_sidecar}")
    assert on_kafka[2] == 82, on_kafka
    assert on_sidecar == on_kafka


def test_a_restarted_static_leader_is_told_to_skip_assignment_on_join_group_v9(conformance):
    """JoinGroup v9 (the Java client's): a restarted static leader in a Stable group gets
    the members and ``skip_assignment`` (KIP-814), as from Kafka."""

    def join_v9(c: WireClient, group: str, member: str) -> Any:
        protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00")
        request = JoinGroupRequest(
            group_id=group,
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=SESSION_MS,
            member_id=member,
            group_instance_id="lead",
            protocol_type="consumer",
            protocols=[protocol],
            reason=None,
        )
        return c.call(request, 9)

    def scenario(target: Target) -> list[Any]:
        group = target.unique("g")
        with WireClient(target.bootstrap) as c:
            first = join(c, group, "", instance="lead")  # the coordinator ready, the group led
            assert _sync(c, group, first.member_id, first.generation_id, "lead") == 0
            again = join_v9(c, group, "")
        return [
            again.error_code,
            again.generation_id == first.generation_id,
            again.leader == first.member_id,
            again.skip_assignment,
            [m.group_instance_id for m in again.members],
        ]

    kafka, sidecar = conformance
    on_kafka = scenario(kafka)
    on_sidecar = scenario(sidecar)
    print(f"\nkafka {on_kafka}\nsidecar {on_sidecar}")
    assert on_sidecar == on_kafka


def test_a_sync_waiting_for_the_leader_is_fenced_when_its_instance_restarts(conformance):
    """A static follower's SyncGroup waiting for the leader's assignment is answered 82
    when a restart of its instance joins meanwhile (a rebalance then: the leader may have
    assigned to the old id); the new round completes with the new id."""

    def scenario(target: Target) -> list[Any]:
        group = target.unique("g")

        def call(member: str, instance: str) -> Any:
            with WireClient(target.bootstrap) as own:
                return join(own, group, member, instance=instance)

        def sync_alone(member: str, gen: int) -> int:
            with WireClient(target.bootstrap) as own:
                return _sync(own, group, member, gen, "ib")

        def state() -> str:
            return _described(target, group)[0]

        with ThreadPoolExecutor(4) as pool:
            a = call("", "ia")
            with WireClient(target.bootstrap) as c:
                assert _sync(c, group, a.member_id, a.generation_id, "ia") == 0
            b_first = pool.submit(call, "", "ib")
            _wait(lambda: state() == "PreparingRebalance", "the round B starts")
            a_again = call(a.member_id, "ia")
            b = b_first.result(timeout=60)
            gen = b.generation_id
            b_sync = pool.submit(sync_alone, b.member_id, gen)  # waits: A does not sync
            time.sleep(0.5)  # B's SyncGroup is in (nothing shows a waiting sync)
            b_new = pool.submit(call, "", "ib")
            fenced = b_sync.result(timeout=60)
            _wait(lambda: state() == "PreparingRebalance", "the round B's restart starts")
            a_last = call(a_again.member_id, "ia")
            b2 = b_new.result(timeout=60)
        return [
            a_again.leader == a.member_id,
            fenced,
            b2.error_code,
            a_last.error_code,
            [x.generation_id - gen for x in (b2, a_last)],
            b2.member_id != b.member_id,
        ]

    kafka, sidecar = conformance
    on_kafka = scenario(kafka)
    on_sidecar = scenario(sidecar)
    print(f"\nkafka {on_kafka}\nsidecar {on_sidecar}")
    assert on_kafka[1] == 82, on_kafka
    assert on_sidecar == on_kafka
