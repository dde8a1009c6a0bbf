"""The Kafka classic group's transitions (pure): rounds, protocol selection, leader,
sync, leave, session expiry, commit validation, stored form."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.protocol.groups.classic import (
    COMPLETING,
    EMPTY,
    PREPARING,
    STABLE,
    ClassicGroup,
    JoinRequest,
)


def req(
    member: str, *protocols: str, ptype: str = "consumer", rebalance: int = 5000
) -> JoinRequest:
    names = protocols or ("range",)
    return JoinRequest(
        member, None, "client", "/h", 6000, rebalance, ptype, tuple((n, n.encode()) for n in names)
    )


def joined(group: ClassicGroup, member: str, now: int, *protocols: str) -> ClassicGroup:
    return group.add_pending(member, now, 6000).join(req(member, *protocols), now)


def stable(*members: str) -> ClassicGroup:
    g = ClassicGroup.new()
    for i, m in enumerate(members):
        g = joined(g, m, i)
        for other in members[:i]:
            g = g.join(req(other), i)
    g = g.sync(members[0], g.generation, {m: m.encode() for m in members})
    assert g.state == STABLE
    return g


def test_first_member_completes_its_round_at_once_and_leads():
    g = joined(ClassicGroup.new(), "a", 0)
    assert (g.state, g.generation, g.leader, g.protocol) == (COMPLETING, 1, "a", "range")


def test_a_new_member_starts_a_round_that_completes_when_every_member_joined():
    g = stable("a")
    g = joined(g, "b", 100)
    assert (g.state, g.generation) == (PREPARING, 1)
    assert g.deadline_ms == 100 + 5000
    g = g.join(req("a"), 200)
    assert (g.state, g.generation, g.leader) == (COMPLETING, 2, "a")
    assert all(m.assignment == b"" for m in g.members.values())


def test_a_member_that_does_not_join_by_the_deadline_is_removed():
    g = joined(stable("a"), "b", 100)
    assert g.expire(100 + 4999) is None
    g = g.expire(100 + 5000)
    assert g is not None
    assert (g.state, g.generation, list(g.members), g.leader) == (COMPLETING, 2, ["b"], "b")


def test_unknown_member_id_is_25_and_a_pending_one_joins():
    with pytest.raises(errors.UnknownMemberId):
        ClassicGroup.new().join(req("x"), 0)
    assert joined(ClassicGroup.new(), "x", 0).has("x")


def test_protocols_shared_by_no_member_are_inconsistent():
    g = stable("a")
    with pytest.raises(errors.InconsistentGroupProtocol):
        joined(g, "b", 10, "other")
    with pytest.raises(errors.InconsistentGroupProtocol):
        g.add_pending("c", 0, 6000).join(req("c", ptype="connect"), 10)
    with pytest.raises(errors.InconsistentGroupProtocol):
        ClassicGroup.new().add_pending("d", 0, 6000).join(req("d", ptype=""), 0)


def test_the_protocol_most_members_prefer_among_the_common_ones_wins():
    g = joined(ClassicGroup.new(), "a", 0, "x", "y")
    g = g.sync("a", 1, {})
    g = joined(g, "b", 1, "y", "x")
    g = joined(g, "c", 2, "y", "z", "x")
    g = g.join(req("a", "x", "y"), 3)
    assert (g.state, g.protocol) == (COMPLETING, "y")


def test_follower_rejoining_unchanged_in_stable_gets_the_current_generation():
    g = stable("a", "b")
    again = g.join(req("b"), 50)
    assert (again.state, again.generation) == (STABLE, g.generation)
    assert not again.member("b").awaiting_join
    assert again.join(req("a"), 60).state == PREPARING  # the leader's rejoin rebalances


def test_sync_checks_member_then_generation():
    g = stable("a")
    with pytest.raises(errors.UnknownMemberId):
        g.sync("z", 1, {})
    with pytest.raises(errors.IllegalGeneration):
        g.sync("a", 7, {})
    assert g.member("a").assignment == b"a"


def test_leaving_rebalances_and_the_last_leaving_empties_the_group():
    g = stable("a", "b")
    g = g.leave("a", 10)
    assert g.state == PREPARING
    g = g.join(req("b"), 20)
    assert (g.state, g.leader, list(g.members)) == (COMPLETING, "b", ["b"])
    g = g.leave("b", 30)
    assert (g.state, g.members) == (EMPTY, {})
    with pytest.raises(errors.UnknownMemberId):
        g.leave("b", 40)


def test_a_member_past_its_session_is_removed_and_the_others_rejoin():
    g = stable("a", "b")
    seen = g.seen("a", 5000)
    assert seen is not None
    g = seen.expire(7000)  # b last seen at 1-2 ms: past 6000
    assert g is not None
    assert list(g.members) == ["a"]
    assert g.state in (PREPARING, COMPLETING)


def test_commit_validation_follows_kafka():
    g = stable("a")
    assert g.validate_commit("a", None, g.generation) is False
    with pytest.raises(errors.IllegalGeneration):
        g.validate_commit("a", None, g.generation + 1)
    with pytest.raises(errors.UnknownMemberId):
        g.validate_commit("z", None, g.generation)
    with pytest.raises(errors.UnknownMemberId):
        g.validate_commit("", None, -1)
    empty = g.leave("a", 1)
    assert empty.state == EMPTY
    assert empty.validate_commit("", None, -1) is True
    completing = joined(ClassicGroup.new(), "a", 0)
    with pytest.raises(errors.RebalanceInProgress):
        completing.validate_commit("a", None, 1)


def test_stored_form_round_trips():
    g = joined(stable("a", "b"), "c", 99).add_pending("p", 99, 6000)
    assert ClassicGroup.from_doc(g.to_doc()) == g


def test_a_reset_fences_the_generation_it_interrupts_until_the_round_completes():
    before = stable("a", "b")
    gen = before.generation
    g = before.fenced(1000)
    assert (g.state, g.generation, g.min_generation) == (PREPARING, gen, gen + 1)
    for call in (
        lambda: g.check("a", gen),  # heartbeat, SyncGroup
        lambda: g.validate_commit("a", None, gen),  # a commit of the pre-reset position
    ):
        with pytest.raises(errors.IllegalGeneration, match="fenced by a reset"):
            call()
    assert not g.current(gen)
    g = g.join(req("a"), 1100).join(req("b"), 1200)
    assert (g.state, g.generation) == (COMPLETING, gen + 1)
    assert g.current(gen + 1)
    g = g.sync("a", gen + 1, {"a": b"a", "b": b"b"})
    assert g.validate_commit("b", None, gen + 1) is False  # the new generation commits
    assert ClassicGroup.from_doc(g.fenced(1300).to_doc()) == g.fenced(1300)


def test_a_reset_during_a_round_keeps_it_and_an_empty_group_is_unchanged():
    g = joined(stable("a"), "b", 100)
    fenced = g.fenced(200)
    assert (fenced.state, fenced.deadline_ms) == (PREPARING, g.deadline_ms)
    assert fenced.min_generation == g.generation + 1
    assert fenced.member("b").awaiting_join  # b joined this round before the reset: kept
    empty = stable("a").leave("a", 300)
    assert empty.state == EMPTY
    assert empty.fenced(400) is empty
    assert empty.validate_commit("", None, -1) is True
