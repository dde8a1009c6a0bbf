"""Kafka itself as the oracle for the classic group protocol's error codes: the same
JoinGroup, SyncGroup, Heartbeat and OffsetCommit edge cases, sent with a bare wire
client to the reference broker and to the sidecar, get the same codes."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kafka.protocol.consumer import LeaveGroupRequest

from tests.kafka_conformance import Target
from tests.kafka_group_wire import beat, commit, join, member, sync
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _codes(conformance: tuple[Target, Target], scenario: Any) -> None:
    kafka, sidecar = conformance
    assert scenario(kafka) == scenario(sidecar)


def test_join_group_edge_cases(conformance):
    def scenario(target: Target) -> list[int]:
        group = target.unique("g")
        with WireClient(target.bootstrap) as c:
            too_short = join(c, group, "", session_ms=10).error_code
            unknown = join(c, group, "nobody").error_code
            no_type = join(c, target.unique("g"), "", ptype="").error_code
            leader = member(c, group)
            other = join(c, group, "", protocol="roundrobin")
            other_protocol = join(c, group, other.member_id, protocol="roundrobin").error_code
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
            me = member(c, group)
            gen = me.generation_id
            codes = [
                commit(c, group, topic, me.member_id, gen),  # CompletingRebalance: 27
                beat(c, group, me.member_id, gen),
                sync(c, group, "nobody", gen),
                sync(c, group, me.member_id, gen + 1),
                sync(c, group, me.member_id, gen),
                beat(c, group, "nobody", gen),
                beat(c, group, me.member_id, gen + 5),
                beat(c, target.unique("none"), "nobody", 1),
                commit(c, group, topic, me.member_id, gen),
                commit(c, group, topic, me.member_id, gen + 1),
                commit(c, group, topic, "nobody", gen),
                commit(c, group, topic, "", -1),  # a simple commit into a group with members
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
            codes.append(commit(c, group, topic, "", -1))  # Empty now: simple commit
        return codes

    _codes(conformance, scenario)


def test_a_new_member_makes_the_others_heartbeat_rebalance_in_progress(conformance):
    def scenario(target: Target) -> list[int]:
        group = target.unique("g")
        with WireClient(target.bootstrap) as a, WireClient(target.bootstrap) as b:
            first = member(a, group)
            assert sync(a, group, first.member_id, first.generation_id) == 0
            second = join(b, group, "")
            answers: list[Any] = []
            joining = threading.Thread(
                target=lambda: answers.append(join(b, group, second.member_id))
            )
            joining.start()
            codes = []
            for _ in range(50):  # until the round has begun
                code = beat(a, group, first.member_id, first.generation_id)
                if code != 0:
                    break
                threading.Event().wait(0.1)
            codes.append(code)
            again = join(a, group, first.member_id)
            joining.join(30)
            codes += [again.error_code, again.generation_id, answers[0].error_code]
            codes.append(answers[0].generation_id)
            codes.append(int(again.leader == first.member_id))
            codes.append(len(again.members))
        return codes

    _codes(conformance, scenario)
