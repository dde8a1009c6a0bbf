"""The consumer group protocol (KIP-848) as pure rules: the assignors, the member epochs,
revocation before assignment, leaving and expiry, commit checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.protocol.groups.assignors import range_assign, uniform
from kop_dedup.protocol.groups.consumer import (
    MEMBER_STABLE,
    UNRELEASED,
    UNREVOKED,
    Beat,
    ConsumerGroup,
    ConsumerMember,
    reconcile,
)
from kop_dedup.protocol.topic_ids import by_id, topic_id

T4 = {"t": 4}


def _all(t: str, n: int) -> frozenset[tuple[str, int]]:
    return frozenset((t, p) for p in range(n))


def _join(g: ConsumerGroup, member: str, now: int = 0, counts=T4, **kw):  # type: ignore[no-untyped-def]
    return g.heartbeat(Beat(member, 0, topics=("t",), owned=frozenset(), **kw), counts, now)


# -- assignors ---------------------------------------------------------------------------


def test_uniform_balances_and_covers_every_partition() -> None:
    got = uniform({"a": ("t",), "b": ("t",), "c": ("t",)}, {"t": 7}, {})
    sizes = sorted(len(a) for a in got.values())
    assert sizes == [2, 2, 3]
    assert frozenset().union(*got.values()) == _all("t", 7)


def test_uniform_is_sticky_when_a_member_joins() -> None:
    before = uniform({"a": ("t",)}, T4, {})
    after = uniform({"a": ("t",), "b": ("t",)}, T4, before)
    assert after["a"] <= before["a"]
    assert len(after["a"]) == len(after["b"]) == 2


def test_uniform_gives_a_topic_only_to_its_subscribers() -> None:
    got = uniform({"a": ("t",), "b": ("u",)}, {"t": 2, "u": 2}, {})
    assert got == {"a": _all("t", 2), "b": _all("u", 2)}


def test_range_gives_contiguous_ranges_the_first_members_one_more() -> None:
    got = range_assign({"b": ("t", "u"), "a": ("t", "u")}, {"t": 5, "u": 5}, {})
    assert sorted(got["a"]) == [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1), ("u", 2)]
    assert sorted(got["b"]) == [("t", 3), ("t", 4), ("u", 3), ("u", 4)]


def _range_line(got: dict[str, frozenset[tuple[str, int]]]) -> str:
    """As tests/java/RangeJudge.java prints a step."""
    return ";".join(
        f"{m}=" + ",".join(f"{t}-{p}" for t, p in sorted(a)) for m, a in sorted(got.items())
    )


# Kafka 4.1.2's RangeAssignor (tests/java/RangeJudge.java "t=4,u=3" and these steps):
# not sticky (m1 joining takes t-0,t-1 from m2), static members ranged first
RANGE_STEPS = [
    ({"m2": ("t", "u")}, {}, "m2=t-0,t-1,t-2,t-3,u-0,u-1,u-2"),
    ({"m2": ("t", "u"), "m1": ("t", "u")}, {}, "m1=t-0,t-1,u-0,u-1;m2=t-2,t-3,u-2"),
    (
        {"m2": ("t", "u"), "m1": ("t", "u"), "m3": ("t", "u")},
        {"m3": "i1"},
        "m1=t-2,u-1;m2=t-3,u-2;m3=t-0,t-1,u-0",
    ),
    ({"m1": ("t", "u"), "m3": ("t", "u")}, {"m3": "i1"}, "m1=t-2,t-3,u-2;m3=t-0,t-1,u-0,u-1"),
    (
        {"m1": ("t",), "m3": ("t", "u"), "m0": ("u",)},
        {"m3": "i1", "m0": "i0"},
        "m0=u-0,u-1;m1=t-2,t-3;m3=t-0,t-1,u-2",
    ),
]


def test_range_over_joins_and_leaves_is_kafkas() -> None:
    previous: dict[str, frozenset[tuple[str, int]]] = {}
    for subs, instances, kafka in RANGE_STEPS:
        previous = range_assign(subs, {"t": 4, "u": 3}, previous, instances)
        assert _range_line(previous) == kafka


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.sets(st.sampled_from("tuv"), min_size=1)),
    st.dictionaries(st.sampled_from("tuv"), st.integers(0, 9)),
)
def test_assignors_give_each_partition_to_one_subscriber(
    subs: dict[str, set[str]], counts: dict[str, int]
) -> None:
    subscriptions = {m: tuple(sorted(ts)) for m, ts in subs.items()}
    for assignor in (uniform, range_assign):
        got = assignor(subscriptions, counts, {})
        seen = [tp for a in got.values() for tp in a]
        assert len(seen) == len(set(seen))
        wanted = {(t, p) for ts in subs.values() for t in ts for p in range(counts.get(t, 0))}
        assert set(seen) == wanted
        for m, a in got.items():
            assert all(t in subs[m] for t, _ in a)


# -- reconciliation ----------------------------------------------------------------------


def test_first_member_gets_every_partition_at_epoch_one() -> None:
    g, a = _join(ConsumerGroup.new(), "a")
    assert (a.epoch, a.state, a.assigned) == (1, MEMBER_STABLE, _all("t", 4))
    assert g.state == "Stable"


def test_partition_moves_only_after_its_owner_revoked_it() -> None:
    g, _ = _join(ConsumerGroup.new(), "a")
    g, b = _join(g, "b", now=1)
    assert (b.epoch, b.state, b.assigned) == (2, UNRELEASED, frozenset())
    assert g.state == "Reconciling"
    # a's next heartbeat (owned partitions not listed): revoke first, epoch kept
    g, a = g.heartbeat(Beat("a", 1), T4, 2)
    assert (a.epoch, a.state) == (1, UNREVOKED)
    moving = a.revoking
    assert len(a.assigned) == len(moving) == 2
    # b still waits: a has not said it let them go
    g, b = g.heartbeat(Beat("b", 2), T4, 3)
    assert b.assigned == frozenset()
    assert b.state == UNRELEASED
    # a lists what it owns, still with the revoked partitions: nothing moves
    g, a = g.heartbeat(Beat("a", 1, owned=_all("t", 4)), T4, 4)
    assert a.state == UNREVOKED
    # a revoked: it moves to epoch 2, and b gets them at its next heartbeat
    g, a = g.heartbeat(Beat("a", 1, owned=a.assigned), T4, 5)
    assert (a.epoch, a.state) == (2, MEMBER_STABLE)
    g, b = g.heartbeat(Beat("b", 2, owned=frozenset()), T4, 6)
    assert (b.state, b.assigned) == (MEMBER_STABLE, moving)
    assert g.state == "Stable"


def test_leaving_member_frees_its_partitions_for_the_other() -> None:
    g, _ = _join(ConsumerGroup.new(), "a")
    g, _ = _join(g, "b")
    g, a = g.heartbeat(Beat("a", 1), T4, 1)
    g, a = g.heartbeat(Beat("a", 1, owned=a.assigned), T4, 2)
    g, b = g.heartbeat(Beat("b", 2, owned=frozenset()), T4, 3)
    g, left = g.heartbeat(Beat("a", -1), T4, 4)
    assert left.epoch == -1
    assert "a" not in g.members
    g, b = g.heartbeat(Beat("b", b.epoch, owned=b.assigned), T4, 5)
    assert (b.epoch, b.assigned) == (g.epoch, _all("t", 4))


def test_expired_member_is_removed_and_its_partitions_reassigned() -> None:
    g, _ = _join(ConsumerGroup.new(), "a", session_timeout_ms=1000)
    g, _ = _join(g, "b", now=900, session_timeout_ms=1000)
    assert g.expired(1500) == ["a"]
    g = g.without(g.expired(1500), g.counts)
    g, b = g.heartbeat(Beat("b", 2, owned=frozenset()), T4, 1600)
    assert b.assigned == _all("t", 4)


def test_member_that_does_not_revoke_in_time_is_fenced() -> None:
    g, _ = _join(ConsumerGroup.new(), "a", rebalance_timeout_ms=500)
    g, _ = _join(g, "b")
    g, a = g.heartbeat(Beat("a", 1), T4, 100)
    assert a.state == UNREVOKED
    assert a.revoke_by_ms == 600
    assert "a" in g.expired(601)
    assert "a" not in g.expired(599)


def test_epoch_checks() -> None:
    g, _ = _join(ConsumerGroup.new(), "a")
    g, _ = _join(g, "b")
    with pytest.raises(errors.UnknownMemberId):
        g.heartbeat(Beat("nobody", 3), T4, 1)
    with pytest.raises(errors.FencedMemberEpoch):
        g.heartbeat(Beat("b", 3), T4, 1)
    # b's answer at epoch 2 lost: at epoch 0 (its previous) with owned within its
    # assignment it is accepted; not listing what it owns, it is fenced
    with pytest.raises(errors.FencedMemberEpoch):
        g.heartbeat(Beat("b", 1), T4, 1)
    g.heartbeat(Beat("b", 0, owned=frozenset()), T4, 1)


def test_unknown_assignor_and_join_without_topics_are_refused() -> None:
    with pytest.raises(errors.UnsupportedAssignor):
        ConsumerGroup.new().heartbeat(Beat("a", 0, topics=("t",), assignor="sticky"), T4, 0)
    with pytest.raises(errors.InvalidRequest):
        ConsumerGroup.new().heartbeat(Beat("a", 0), T4, 0)


def test_range_assignor_chosen_by_members() -> None:
    g, a = ConsumerGroup.new().heartbeat(
        Beat("a", 0, topics=("t",), assignor="range", owned=frozenset()), {"t": 3}, 0
    )
    assert g.assignor == "range"
    assert a.assigned == _all("t", 3)


def test_new_partitions_bump_the_epoch() -> None:
    g, a = _join(ConsumerGroup.new(), "a")
    g, a = g.heartbeat(Beat("a", 1, owned=a.assigned), {"t": 6}, 1)
    assert (g.epoch, a.epoch, a.assigned) == (2, 2, _all("t", 6))


def test_reconcile_unsubscribed_topic_is_revoked() -> None:
    m = ConsumerMember("a", 1, topics=("u",), assigned=_all("t", 2))
    got = reconcile(m, 2, _all("t", 2), None, lambda _tp: False, 0)
    assert got.state == UNREVOKED
    assert got.revoking == _all("t", 2)


def test_commit_checks_member_epoch() -> None:
    g, _ = _join(ConsumerGroup.new(), "a")
    g.validate_commit("a", 1)
    with pytest.raises(errors.StaleMemberEpoch):
        g.validate_commit("a", 0)
    with pytest.raises(errors.StaleMemberEpoch):  # above too, as Kafka 4.1 answers
        g.validate_commit("a", 2)
    with pytest.raises(errors.UnknownMemberId):
        g.validate_commit("b", 1)
    with pytest.raises(errors.UnknownMemberId):
        g.validate_commit("", -1)  # an admin commit while it has members
    ConsumerGroup.new().validate_commit("", -1)


def test_group_survives_its_document() -> None:
    g, _ = _join(ConsumerGroup.new(), "a")
    g, _ = _join(g, "b")
    g, _ = g.heartbeat(Beat("a", 1), T4, 1)
    assert ConsumerGroup.from_doc(g.to_doc()) == g


def test_topic_ids_are_stable_and_invertible() -> None:
    assert topic_id("t") == topic_id("t") != topic_id("u")
    assert by_id(["t", "u"])[topic_id("u")] == "u"


def test_transactional_commit_for_a_consumer_protocol_member_checks_its_epoch() -> None:
    from kop_dedup.protocol.groups.fencing import check_txn_member

    g, _ = _join(ConsumerGroup.new(), "a")
    check_txn_member("g", None, None, "a", 1, consumer=g)
    with pytest.raises(errors.StaleMemberEpoch):
        check_txn_member("g", None, None, "a", 0, consumer=g)
    with pytest.raises(errors.UnknownMemberId):
        check_txn_member("g", None, None, "b", 1, consumer=g)
    # before the fix the member of a consumer group was unknown to the KIP-447 check
    check_txn_member("g", None, None, None, None, consumer=g)


@pytest.mark.parametrize("version", [0, 1])
def test_error_answers_encode_at_every_served_version(version: int) -> None:
    from kop_dedup.transports.kafka import consumer_groups as cg
    from kop_dedup.transports.kafka.schemas import (
        ConsumerGroupDescribeRequest,
        ConsumerGroupDescribeResponse,
        ConsumerGroupHeartbeatResponse,
    )

    (heartbeat, describe) = cg.APIS
    hb = heartbeat.error_answer(None, version, errors.NotCoordinator("moved"))
    back = ConsumerGroupHeartbeatResponse.decode(hb.encode(version=version), version=version)
    assert (back.error_code, back.error_message, back.assignment) == (16, "moved", None)
    asked = ConsumerGroupDescribeRequest(group_ids=["a", "b"], include_authorized_operations=False)
    d = describe.error_answer(asked, version, errors.GroupAuthorizationFailed("no"))
    back = ConsumerGroupDescribeResponse.decode(d.encode(version=version), version=version)
    assert [(g.group_id, g.error_code) for g in back.groups] == [("a", 30), ("b", 30)]


def test_a_slow_pulsar_is_a_coordinator_error_the_java_consumer_retries() -> None:
    from kop_dedup.transports.kafka.consumer_groups import _retried

    assert _retried(errors.RequestTimedOut("timed out waiting for Pulsar")).errno == 15
    assert _retried(errors.NotCoordinator("moved")).errno == 16
    assert _retried(errors.FencedMemberEpoch("rejoin")).errno == 110
