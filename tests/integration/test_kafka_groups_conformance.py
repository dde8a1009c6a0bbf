"""Kafka itself as the oracle for the classic group protocol's error codes: the same
JoinGroup, SyncGroup, Heartbeat and OffsetCommit edge cases, sent with a bare wire
client to the reference broker and to the sidecar, get the same codes."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest

from tests.kafka_conformance import Target
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SESSION_MS = 6000


_NOT_READY = (14, 15, 16)  # the coordinator loading, not available, not this broker
_READY: set[str] = set()


def _ready(c: WireClient, group: str) -> None:
    """Kafka creates its offsets topic at the first FindCoordinator: wait until the
    group's coordinator answers."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = c.call(FindCoordinatorRequest(key=group, key_type=0), 2)
        if answer.error_code == 0 and _join(c, group, "", retry=False).error_code not in _NOT_READY:
            return
        time.sleep(0.2)
    raise AssertionError(f"no coordinator for {group}")


def _join(
    c: WireClient,
    group: str,
    member: str,
    *,
    protocol: str = "range",
    ptype: str = "consumer",
    session_ms: int = SESSION_MS,
    retry: bool = True,
) -> Any:
    if retry and group not in _READY:
        _ready(c, group)
        _READY.add(group)
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name=protocol, metadata=b"\x00")]
    return c.call(
        JoinGroupRequest(
            group_id=group,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=session_ms,
            member_id=member,
            group_instance_id=None,
            protocol_type=ptype,
            protocols=protocols,
            reason=None,
        ),
        5,
    )


def _member(c: WireClient, group: str, **kw: Any) -> Any:
    first = _join(c, group, "", **kw)
    assert first.error_code == 79, first
    return _join(c, group, first.member_id, **kw)


def _sync(c: WireClient, group: str, member: str, generation: int, assign: bool = True) -> int:
    a = SyncGroupRequest.SyncGroupRequestAssignment
    return c.call(
        SyncGroupRequest(
            group_id=group,
            generation_id=generation,
            member_id=member,
            group_instance_id=None,
            assignments=[a(member_id=member, assignment=b"x")] if assign else [],
        ),
        3,
    ).error_code


def _beat(c: WireClient, group: str, member: str, generation: int) -> int:
    return c.call(
        HeartbeatRequest(
            group_id=group, generation_id=generation, member_id=member, group_instance_id=None
        ),
        3,
    ).error_code


def _commit(c: WireClient, group: str, topic: str, member: str, generation: int) -> int:
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    return (
        c.call(
            OffsetCommitRequest(
                group_id=group,
                generation_id_or_member_epoch=generation,
                member_id=member,
                group_instance_id=None,
                topics=[
                    t(
                        name=topic,
                        partitions=[
                            t.OffsetCommitRequestPartition(
                                partition_index=0,
                                committed_offset=1,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            )
                        ],
                    )
                ],
            ),
            8,
        )
        .topics[0]
        .partitions[0]
        .error_code
    )


def _codes(conformance: tuple[Target, Target], scenario: Any) -> None:
    kafka, sidecar = conformance
    assert scenario(kafka) == scenario(sidecar)


def test_join_group_edge_cases(conformance):
    def scenario(target: Target) -> list[int]:
        group = target.unique("g")
        with WireClient(target.bootstrap) as c:
            too_short = _join(c, group, "", session_ms=10).error_code
            unknown = _join(c, group, "nobody").error_code
            no_type = _join(c, target.unique("g"), "", ptype="").error_code
            leader = _member(c, group)
            other = _join(c, group, "", protocol="roundrobin")
            other_protocol = _join(c, group, other.member_id, protocol="roundrobin").error_code
        return [
            too_short,
            unknown,
            no_type,
            leader.error_code,
            leader.generation_id,
            other_protocol,
        ]

    _codes(conformance, scenario)


def test_sync_heartbeat_and_commit_of_stale_or_unknown_members(conformance):
    def scenario(target: Target) -> list[int]:
        group = target.unique("g")
        topic = target.create_topic(partitions=1)
        with WireClient(target.bootstrap) as c:
            me = _member(c, group)
            gen = me.generation_id
            codes = [
                _commit(c, group, topic, me.member_id, gen),  # CompletingRebalance: 27
                _beat(c, group, me.member_id, gen),
                _sync(c, group, "nobody", gen),
                _sync(c, group, me.member_id, gen + 1),
                _sync(c, group, me.member_id, gen),
                _beat(c, group, "nobody", gen),
                _beat(c, group, me.member_id, gen + 5),
                _beat(c, target.unique("none"), "nobody", 1),
                _commit(c, group, topic, me.member_id, gen),
                _commit(c, group, topic, me.member_id, gen + 1),
                _commit(c, group, topic, "nobody", gen),
                _commit(c, group, topic, "", -1),  # a simple commit into a group with members
            ]
            left = c.call(
                LeaveGroupRequest(
                    group_id=group,
                    members=[
                        LeaveGroupRequest.MemberIdentity(
                            member_id=me.member_id, group_instance_id=None, reason=None
                        ),
                        LeaveGroupRequest.MemberIdentity(
                            member_id="nobody", group_instance_id=None, reason=None
                        ),
                    ],
                ),
                5,
            )
            codes += [left.error_code, *(m.error_code for m in left.members)]
            codes.append(_commit(c, group, topic, "", -1))  # Empty now: simple commit
        return codes

    _codes(conformance, scenario)


def test_a_new_member_makes_the_others_heartbeat_rebalance_in_progress(conformance):
    def scenario(target: Target) -> list[int]:
        group = target.unique("g")
        with WireClient(target.bootstrap) as a, WireClient(target.bootstrap) as b:
            first = _member(a, group)
            assert _sync(a, group, first.member_id, first.generation_id) == 0
            second = _join(b, group, "")
            answers: list[Any] = []
            joining = threading.Thread(
                target=lambda: answers.append(_join(b, group, second.member_id))
            )
            joining.start()
            codes = []
            for _ in range(50):  # until the round has begun
                code = _beat(a, group, first.member_id, first.generation_id)
                if code != 0:
                    break
                threading.Event().wait(0.1)
            codes.append(code)
            again = _join(a, group, first.member_id)
            joining.join(30)
            codes += [again.error_code, again.generation_id, answers[0].error_code]
            codes.append(answers[0].generation_id)
            codes.append(int(again.leader == first.member_id))
            codes.append(len(again.members))
        return codes

    _codes(conformance, scenario)
