"""Static membership under the consumer protocol (KIP-848 with ``group.instance.id``) as
pure rules, after Kafka 4.1's ``GroupMetadataManager``: a leave at -2 keeps the member
and its partitions for its session, a new member id with its instance id takes them
over without a new epoch, a live holder refuses the join (111), another member id is
fenced (82), an unknown instance id is 25, and the request checks (42)."""

from __future__ import annotations

import re

import pytest

from kop_dedup import errors
from kop_dedup.protocol.groups.consumer import MEMBER_STABLE, Beat, ConsumerGroup
from kop_dedup.protocol.groups.consumer_static import LEAVE_STATIC
from kop_dedup.transports.kafka.consumer_groups import _heartbeat_answer, _heartbeat_error

T4 = {"t": 4}


def _settled(static_b: bool = True) -> ConsumerGroup:
    """Members a (dynamic) and b (instance id "ib"), each with two partitions, stable."""
    g, _ = ConsumerGroup.new().heartbeat(Beat("a", 0, topics=("t",), owned=frozenset()), T4, 0)
    inst = "ib" if static_b else None
    g, _ = g.heartbeat(Beat("b", 0, instance_id=inst, topics=("t",), owned=frozenset()), T4, 0)
    for now in range(1, 6):
        for m in list(g.members.values()):
            g, _ = g.heartbeat(
                Beat(m.member_id, m.epoch, instance_id=m.instance_id, owned=m.assigned), T4, now
            )
    assert g.state == "Stable", g
    assert [len(m.assigned) for m in g.members.values()] == [2, 2]
    return g


def test_a_static_leave_keeps_the_member_and_its_partitions_at_epoch_minus_two() -> None:
    g = _settled()
    b = g.members["b"]
    after, left = g.heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    assert (left.member_id, left.epoch) == ("b", LEAVE_STATIC)
    assert after.members["b"].assigned == b.assigned
    assert after.members["b"].last_seen_ms == b.last_seen_ms  # its session runs on
    assert (after.epoch, after.target) == (g.epoch, g.target)
    assert after.state == "Reconciling"  # as Kafka's: a member not at the target epoch
    # the other member keeps what it has and gets nothing of b's
    a = g.members["a"]
    after, a2 = after.heartbeat(Beat("a", a.epoch, owned=a.assigned), T4, 11)
    assert (a2.epoch, a2.assigned) == (a.epoch, a.assigned)


def test_a_new_member_id_with_the_instance_id_takes_the_assignment_without_a_rebalance() -> None:
    g = _settled()
    b = g.members["b"]
    g, _ = g.heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    g2, c = g.heartbeat(Beat("c", 0, instance_id="ib", topics=("t",), owned=frozenset()), T4, 12)
    assert (c.member_id, c.epoch, c.state, c.assigned) == ("c", g.epoch, MEMBER_STABLE, b.assigned)
    assert sorted(g2.members) == ["a", "c"]
    assert g2.epoch == g.epoch
    assert g2.target == {"a": g.target["a"], "c": g.target["b"]}
    assert g2.state == "Stable"


def test_a_take_over_with_another_subscription_is_a_new_epoch() -> None:
    g = _settled()
    g, _ = g.heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    g2, c = g.heartbeat(
        Beat("c", 0, instance_id="ib", topics=("t", "u"), owned=frozenset()),
        {**T4, "u": 2},
        12,
    )
    assert g2.epoch == g.epoch + 1
    assert c.topics == ("t", "u")


def test_a_join_with_a_held_instance_id_is_unreleased() -> None:
    g = _settled()
    for member_id in ("c", "b"):  # another member id, or the holder's own
        with pytest.raises(errors.UnreleasedInstanceId) as refused:
            g.heartbeat(Beat(member_id, 0, instance_id="ib", topics=("t",)), T4, 10)
        assert refused.value.errno == 111
        assert str(refused.value) == (
            f"Static member {member_id} with instance id ib cannot join the group because "
            "the instance id is owned by b member."
        )


def test_heartbeats_and_leaves_of_another_member_id_are_fenced() -> None:
    g = _settled()
    epoch = g.members["b"].epoch
    for beat in (
        Beat("c", epoch, instance_id="ib"),
        Beat("c", -1, instance_id="ib"),
        Beat("c", LEAVE_STATIC, instance_id="ib"),
    ):
        with pytest.raises(errors.FencedInstanceId) as fenced:
            g.heartbeat(beat, T4, 10)
        assert str(fenced.value) == "Static member c with instance id ib was fenced by member b."
    with pytest.raises(errors.UnknownMemberId, match=re.escape("Instance id nobody is unknown.")):
        g.heartbeat(Beat("b", epoch, instance_id="nobody"), T4, 10)


def test_the_old_member_id_is_fenced_once_replaced() -> None:
    g = _settled()
    epoch = g.members["b"].epoch
    g, _ = g.heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    g, _ = g.heartbeat(Beat("c", 0, instance_id="ib", topics=("t",), owned=frozenset()), T4, 11)
    with pytest.raises(errors.FencedInstanceId):
        g.heartbeat(Beat("b", epoch, instance_id="ib"), T4, 12)
    with pytest.raises(errors.UnknownMemberId):
        g.heartbeat(Beat("b", epoch), T4, 12)


def test_a_member_at_minus_two_beating_again_is_fenced_by_epoch() -> None:
    g = _settled()
    epoch = g.members["b"].epoch
    g, _ = g.heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    with pytest.raises(errors.FencedMemberEpoch):
        g.heartbeat(Beat("b", epoch, instance_id="ib"), T4, 11)


def test_a_static_leave_at_minus_one_removes_the_member_at_once() -> None:
    g = _settled()
    after, left = g.heartbeat(Beat("b", -1, instance_id="ib"), T4, 10)
    assert left.epoch == -1
    assert sorted(after.members) == ["a"]
    assert after.epoch == g.epoch + 1


def test_the_member_left_at_minus_two_goes_when_its_session_ends() -> None:
    g = _settled()
    b = g.members["b"]
    g, _ = g.heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    a = g.members["a"]
    g, a = g.heartbeat(Beat("a", a.epoch, owned=a.assigned), T4, 40_000)
    assert g.expired(b.last_seen_ms + b.session_timeout_ms) == []
    assert g.expired(b.last_seen_ms + b.session_timeout_ms + 1) == ["b"]
    g = g.without(["b"], g.counts)
    g, a = g.heartbeat(Beat("a", a.epoch, owned=a.assigned), T4, 50_000)
    assert (a.epoch, len(a.assigned)) == (g.epoch, 4)


@pytest.mark.parametrize(
    ("beat", "message"),
    [
        (Beat("b", 0, instance_id="", topics=("t",)), "InstanceId can't be empty."),
        (Beat("b", LEAVE_STATIC), "InstanceId can't be null."),
        (Beat("b", -3, instance_id="ib"), "MemberEpoch is invalid."),
    ],
)
def test_requests_kafka_refuses_before_the_group(beat: Beat, message: str) -> None:
    with pytest.raises(errors.InvalidRequest, match=re.escape(message)):
        _settled().heartbeat(beat, T4, 10)


def test_the_member_at_minus_two_survives_the_groups_document() -> None:
    g, _ = _settled().heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    assert ConsumerGroup.from_doc(g.to_doc()) == g


def test_leave_answers_carry_no_interval_and_no_assignment_as_kafkas() -> None:
    g, left = _settled().heartbeat(Beat("b", LEAVE_STATIC, instance_id="ib"), T4, 10)
    answer = _heartbeat_answer(1, left, 5000)
    assert (answer.member_id, answer.member_epoch) == ("b", LEAVE_STATIC)
    assert (answer.heartbeat_interval_ms, answer.assignment) == (0, None)
    _, a = g.heartbeat(Beat("a", g.members["a"].epoch), T4, 11)
    assert _heartbeat_answer(1, a, 5000).heartbeat_interval_ms == 5000
    # an unchanged assignment is not sent again (Kafka: only to a join, a full request,
    # or when it changed)
    assert _heartbeat_answer(1, a, 5000, given=False).assignment is None
    assert len(_heartbeat_answer(1, a, 5000).assignment.topic_partitions[0].partitions) == 2


def test_a_topic_authorization_failure_answers_without_a_message_as_kafka() -> None:
    answer = _heartbeat_error(None, 1, errors.TopicAuthorizationFailed("not yours"))
    assert (answer.error_code, answer.error_message, answer.member_epoch) == (29, None, 0)
    other = _heartbeat_error(None, 1, errors.FencedInstanceId("fenced"))
    assert (other.error_code, other.error_message) == (82, "fenced")
