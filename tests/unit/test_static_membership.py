"""Static membership (KIP-345) of a Kafka classic group, as pure rules: a restart under
a known ``group.instance.id`` takes the old member's place without a rebalance, the old
member id is fenced (82), a static member that does not rejoin a round stays until its
session passes, LeaveGroup by instance id."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.protocol.groups import static
from kop_dedup.protocol.groups.classic import (
    COMPLETING,
    EMPTY,
    PREPARING,
    STABLE,
    ClassicGroup,
    JoinRequest,
)

SESSION = 6000
REBALANCE = 5000


def req(member: str, instance: str | None, *protocols: str, meta: bytes = b"") -> JoinRequest:
    names = protocols or ("range",)
    return JoinRequest(
        member,
        instance,
        "client",
        "/h",
        SESSION,
        REBALANCE,
        "consumer",
        tuple((n, meta or n.encode()) for n in names),
    )


def stable(*members: tuple[str, str | None]) -> ClassicGroup:
    """A Stable group of (member id, instance id), the first its leader, each member
    assigned its own id's bytes."""
    g = ClassicGroup.new()
    for i, (m, inst) in enumerate(members):
        g = static.join(g.add_pending(m, i, SESSION), req(m, inst), i, fresh=False)
        for other, other_inst in members[:i]:
            g = static.join(g, req(other, other_inst), i, fresh=False)
    g = g.sync(members[0][0], g.generation, {m: m.encode() for m, _ in members})
    assert g.state == STABLE
    return g


def test_restart_of_a_static_follower_keeps_assignment_and_generation():
    g = stable(("a", "ia"), ("b", "ib"))
    after = static.join(g, req("b2", "ib"), 100, fresh=True)
    assert (after.state, after.generation, after.leader) == (STABLE, g.generation, "a")
    assert list(after.members) == ["a", "b2"]
    assert after.member("b2").assignment == b"b"
    assert after.member("b2").last_seen_ms == 100
    assert not after.member("b2").awaiting_join
    assert after.member("a") == g.member("a")


def test_restart_of_the_static_leader_passes_leadership_without_a_rebalance():
    g = stable(("a", "ia"), ("b", "ib"))
    after = static.join(g, req("a2", "ia"), 100, fresh=True)
    assert (after.state, after.generation, after.leader) == (STABLE, g.generation, "a2")
    assert after.member("a2").assignment == b"a"


def test_replaced_member_id_is_fenced_for_heartbeat_sync_commit_and_join():
    g = static.join(stable(("a", "ia"), ("b", "ib")), req("b2", "ib"), 100, fresh=True)
    gen = g.generation
    for call in (
        lambda: static.check(g, "b", "ib", gen),
        lambda: static.validate_commit(g, "b", "ib", gen),
        lambda: static.join(g, req("b", "ib"), 200, fresh=False),
        lambda: static.leaver(g, "b", "ib"),
    ):
        with pytest.raises(errors.FencedInstanceId) as caught:
            call()
        assert caught.value.errno == 82
    static.check(g, "b2", "ib", gen)  # the new id is the member
    assert static.validate_commit(g, "b2", "ib", gen) is False


def test_the_old_member_id_without_its_instance_id_is_unknown():
    g = static.join(stable(("a", "ia"), ("b", "ib")), req("b2", "ib"), 100, fresh=True)
    with pytest.raises(errors.UnknownMemberId):
        static.check(g, "b", None, g.generation)


def test_an_instance_id_the_group_does_not_know_is_unknown_member():
    g = stable(("a", "ia"))
    with pytest.raises(errors.UnknownMemberId):
        static.check(g, "a", "nobody", g.generation)
    with pytest.raises(errors.UnknownMemberId):
        static.validate_commit(g, "a", "nobody", g.generation)


def test_a_commit_outside_group_management_on_an_empty_group_skips_the_instance_check():
    assert static.validate_commit(ClassicGroup.new(), "", "ia", -1) is True


def test_restart_that_changes_the_selected_protocol_rebalances():
    g = stable(("a", "ia"), ("b", "ib"))
    after = static.join(g, req("b2", "ib", "roundrobin", "range"), 100, fresh=True)
    assert after.state == STABLE  # one vote for roundrobin, one for range: still range
    g3 = stable(("a", "ia"))
    with pytest.raises(errors.InconsistentGroupProtocol):  # checked against the old member
        static.join(g3, req("a2", "ia", "roundrobin"), 100, fresh=True)
    changed = static.join(g3, req("a2", "ia", "roundrobin", "range"), 100, fresh=True)
    # the only member now prefers another protocol: a round, complete at once
    assert (changed.state, changed.generation, changed.protocol) == (
        COMPLETING,
        g3.generation + 1,
        "roundrobin",
    )


def test_restart_while_completing_starts_a_round_the_others_must_join():
    g = stable(("a", "ia"))
    g = static.join(g.add_pending("b", 10, SESSION), req("b", "ib"), 10, fresh=False)
    g = g.join(req("a", "ia"), 20)
    assert g.state == COMPLETING
    after = static.join(g, req("b2", "ib"), 30, fresh=True)
    assert (after.state, after.generation) == (PREPARING, g.generation)
    assert after.member("b2").awaiting_join
    assert not after.member("a").awaiting_join
    done = static.join(after, req("a", "ia"), 40, fresh=False)
    assert (done.state, done.generation) == (COMPLETING, g.generation + 1)
    assert set(done.members) == {"a", "b2"}


def test_restart_while_preparing_joins_the_round_in_the_old_members_place():
    g = stable(("a", "ia"), ("b", "ib"))
    g = static.join(g.add_pending("c", 10, SESSION), req("c", None), 10, fresh=False)
    assert g.state == PREPARING
    g = static.join(g, req("a", "ia"), 20, fresh=False)
    after = static.join(g, req("b2", "ib"), 30, fresh=True)
    assert (after.state, after.generation) == (COMPLETING, g.generation + 1)
    assert set(after.members) == {"a", "b2", "c"}


def test_a_static_member_that_does_not_rejoin_stays_until_its_session_passes():
    g = stable(("a", "ia"), ("b", "ib"))
    g = static.join(g.add_pending("c", 1000, SESSION), req("c", None), 1000, fresh=False)
    g = static.join(g, req("a", "ia"), 1000, fresh=False)
    deadline = g.deadline_ms
    done = g.expire(deadline)
    assert done is not None
    assert (done.state, done.generation, done.leader) == (COMPLETING, g.generation + 1, "a")
    assert set(done.members) == {"a", "b", "c"}  # b (static) kept, unjoined
    # its session runs from the round's completion: then it goes, and a round follows
    assert done.expire(deadline + SESSION) is None
    gone = done.expire(deadline + SESSION + 1)
    assert gone is not None
    assert "b" not in gone.members


def test_a_dynamic_member_that_does_not_rejoin_is_removed_at_the_deadline():
    g = stable(("a", "ia"), ("b", None))
    g = static.join(g.add_pending("c", 1000, SESSION), req("c", None), 1000, fresh=False)
    g = static.join(g, req("a", "ia"), 1000, fresh=False)
    done = g.expire(g.deadline_ms)
    assert done is not None
    assert set(done.members) == {"a", "c"}


def test_a_round_none_joined_waits_for_the_static_members_sessions():
    # a member leaves: a round only static members that are away could join
    g = stable(("a", "ia"), ("b", "ib"), ("c", None))
    g = g.leave("c", 1000)
    assert g.state == PREPARING
    later = g.expire(g.deadline_ms)
    assert later is not None
    assert (later.state, later.generation) == (PREPARING, g.generation)
    assert later.deadline_ms == g.deadline_ms + REBALANCE
    empty = later.expire(1000 + SESSION + 1)
    assert empty is not None
    assert (empty.state, set(empty.members)) == (EMPTY, set())


def test_a_static_member_that_closes_without_leaving_costs_no_rebalance_in_its_session():
    g = stable(("a", "ia"), ("b", "ib"))
    b_seen = g.member("b").last_seen_ms
    assert g.expire(b_seen + SESSION) is None  # b silent: nothing until its session passes
    after = static.join(g, req("b2", "ib"), b_seen + SESSION, fresh=True)
    assert (after.state, after.generation) == (STABLE, g.generation)


def test_leave_by_instance_id_alone_removes_that_static_member():
    g = stable(("a", "ia"), ("b", "ib"))
    assert static.leaver(g, "", "ib") == "b"
    assert static.leaver(g, "b", "ib") == "b"
    with pytest.raises(errors.UnknownMemberId):
        static.leaver(g, "", "nobody")
    with pytest.raises(errors.UnknownMemberId):
        static.leaver(g, "", None)
    left = g.leave(static.leaver(g, "", "ib"), 100)
    assert (left.state, set(left.members)) == (PREPARING, {"a"})


def test_a_new_static_member_joins_as_a_new_member():
    g = stable(("a", "ia"))
    assert not static.replaces(g, req("b", "ib"), fresh=True)
    assert static.replaces(g, req("a2", "ia"), fresh=True)
    assert not static.replaces(g, req("a2", "ia"), fresh=False)  # a stale id: 82, not a restart


def test_the_replacement_is_stored_and_read_back():
    g = static.join(stable(("a", "ia"), ("b", "ib")), req("b2", "ib"), 100, fresh=True)
    assert ClassicGroup.from_doc(g.to_doc()) == g


def test_a_transactional_commit_of_a_replaced_static_member_is_fenced():
    from kop_dedup.protocol.groups.fencing import check_txn_member

    g = static.join(stable(("a", "ia"), ("b", "ib")), req("b2", "ib"), 100, fresh=True)
    gen = g.generation
    with pytest.raises(errors.FencedInstanceId):
        check_txn_member("g", g, None, "b", gen, "ib")
    with pytest.raises(errors.UnknownMemberId):  # without its instance id: not a member
        check_txn_member("g", g, None, "b", gen)
    with pytest.raises(errors.UnknownMemberId):
        check_txn_member("g", g, None, "b2", gen, "nobody")
    check_txn_member("g", g, None, "b2", gen, "ib")
