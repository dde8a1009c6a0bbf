"""The authorizer's decisions from grants (pure logic; the grants come from Pulsar in
the integration tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from kop_dedup import errors
from kop_dedup.coordination.names import MAX_ID_LENGTH
from kop_dedup.security.authorizer import CONSUME, DESCRIBE, OPEN, PRODUCE, Authorizer
from kop_dedup.security.identity import ANONYMOUS, Identity


class Grants:
    ttl_s = 10.0  # as pulsar.grants.Grants: how long an answer is reused

    def __init__(self, topics: dict[str, dict[str, frozenset[str]]], admins=frozenset()):
        self.table, self.admins, self.fail = topics, admins, False

    async def topics(self, topics: list[str]) -> dict[str, dict[str, frozenset[str]]]:
        if self.fail:
            raise httpx.ConnectError("refused")
        return {t: self.table.get(t, {}) for t in topics}

    async def tenant_admins(self) -> frozenset[str]:
        return self.admins


def run(coro: Any) -> Any:
    return asyncio.run(coro)


ALICE, BOB, OPS = Identity("alice"), Identity("bob"), Identity("ops")
GRANTS = Grants(
    {"orders": {"alice": frozenset({PRODUCE}), "bob": frozenset({CONSUME})}},
    admins=frozenset({"ops"}),
)
AUTH = Authorizer(GRANTS, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("who", "action", "allowed"),
    [
        (ALICE, PRODUCE, True),
        (ALICE, CONSUME, False),
        (ALICE, DESCRIBE, True),
        (BOB, PRODUCE, False),
        (BOB, CONSUME, True),
        (BOB, DESCRIBE, True),
        (Identity("carol"), DESCRIBE, False),
        (OPS, PRODUCE, True),  # the tenant's admin role
        (Identity("root", superuser=True), CONSUME, True),
    ],
)
def test_a_topic_action_needs_its_grant(who, action, allowed):
    assert run(AUTH.may(who, action, "orders")) is allowed


def test_require_names_the_role_the_action_and_the_topic():
    with pytest.raises(errors.TopicAuthorizationFailed, match=r"'bob'.*'produce'.*'orders'"):
        run(AUTH.require(BOB, PRODUCE, ["orders"]))


def test_administration_needs_the_tenants_admin_role():
    assert run(AUTH.is_admin(OPS))
    with pytest.raises(errors.GroupAuthorizationFailed):
        run(AUTH.require_admin(ALICE, "delete groups", errors.GroupAuthorizationFailed))


def test_with_authentication_off_nothing_is_asked():
    assert run(OPEN.may(ANONYMOUS, PRODUCE, "anything"))
    assert run(OPEN.owns(ANONYMOUS, "txn", "t"))
    assert run(OPEN.visible(ANONYMOUS, "txn", ["a", "b"])) == ["a", "b"]


def test_pulsar_away_is_a_retriable_error_not_a_refusal():
    failing = Grants({}, frozenset())
    failing.fail = True
    with pytest.raises(errors.KafkaError) as raised:
        run(Authorizer(failing, None).may(ALICE, PRODUCE, "orders"))  # type: ignore[arg-type]
    assert raised.value.retriable
    assert not isinstance(raised.value, errors.TopicAuthorizationFailed)


@pytest.mark.parametrize("name", ["..", "../../acme/pay/ledger", "a/b", "a%2Fb"])
def test_a_topic_name_kafka_refuses_never_reaches_the_admin_api(name):
    from kop_dedup.pulsar.grants import Grants as PulsarGrants

    class NoAdmin:
        async def get_json(self, path: str) -> Any:
            raise AssertionError(f"an admin call for {path}")

    grants = PulsarGrants(NoAdmin(), "public/kafka", ttl_s=10)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidTopic):
        run(Authorizer(grants, None).may(ALICE, PRODUCE, name))


class Owners:
    """The owners table as its readers see it once read to its end (what
    :meth:`kop_dedup.security.owners.Owners.owner` answers)."""

    def __init__(self) -> None:
        self.table: dict[str, str] = {}
        self.fail = False

    async def owner(self, kind: str, name: str) -> str | None:
        if self.fail:
            raise httpx.ConnectError("refused")
        return self.table.get(f"{kind}:{name}")

    async def claim(self, kind: str, name: str, role: str) -> bool:
        return self.table.setdefault(f"{kind}:{name}", role) == role

    async def release(self, kind: str, name: str) -> str | None:
        return self.table.pop(f"{kind}:{name}", None)


def _owned_by(**pids: str) -> tuple[Authorizer, Owners]:
    owners = Owners()
    owners.table.update({f"pid:{pid.removeprefix('p')}": role for pid, role in pids.items()})
    return Authorizer(GRANTS, owners), owners  # type: ignore[arg-type]


def test_a_role_writes_only_as_producer_ids_it_was_given():
    auth, _ = _owned_by(p7="alice", p8="bob")
    run(auth.require_producers(ALICE, [7, 7, -1]))  # its own; -1: no producer id
    with pytest.raises(errors.ClusterAuthorizationFailed, match="producer id 8"):
        run(auth.require_producers(ALICE, [7, 8]))
    with pytest.raises(
        errors.UnknownProducerId, match=r"producer id 9 .*'alice'.*init-producer-id"
    ):
        run(auth.require_producers(ALICE, [9]))  # given to no role: not handed out yet
    run(auth.require_producers(Identity("root", superuser=True), [8, 9, 5_000]))


def _refusal(auth: Authorizer, who: Identity, pid: int) -> type[errors.KafkaError] | None:
    try:
        run(auth.require_producers(who, [pid]))
    except errors.KafkaError as exc:
        return type(exc)
    return None


def test_an_id_seen_without_an_owner_is_decided_afresh_once_it_is_given_out():
    """Ids are handed out in order: the one nobody has yet is the next caller's. Seen
    unowned a moment ago says nothing once it is handed out (no cache of unowned ids)."""
    auth, owners = _owned_by(p7="bob")
    before = _refusal(auth, BOB, 8)
    assert run(owners.claim("pid", "8", "alice"))  # init-producer-id gives 8 to alice
    after = _refusal(auth, BOB, 8)
    assert (before, after) == (errors.UnknownProducerId, errors.ClusterAuthorizationFailed)


def test_owners_out_of_reach_is_a_retriable_error_not_a_refusal():
    auth, owners = _owned_by(p7="alice")
    owners.fail = True
    with pytest.raises(errors.KafkaError) as raised:
        run(auth.require_producers(ALICE, [7]))
    assert raised.value.retriable


@pytest.mark.parametrize(
    ("kind", "error"),
    [("txn", errors.InvalidRequest), ("group", errors.InvalidGroupId)],
)
def test_a_name_one_past_the_bound_is_refused_before_any_claim(kind, error):
    auth, owners = _owned_by()
    assert run(auth.owns(ALICE, kind, "n" * MAX_ID_LENGTH))  # at the bound: claimed
    with pytest.raises(error, match=f"at most {MAX_ID_LENGTH}"):
        run(auth.owns(ALICE, kind, "n" * (MAX_ID_LENGTH + 1)))
    assert list(owners.table) == [f"{kind}:{'n' * MAX_ID_LENGTH}"]


def test_a_group_is_deleted_by_its_owner_or_an_admin_and_nobody_elses_by_no_one_else():
    auth, owners = _owned_by()
    owners.table["group:bobs"] = "bob"
    run(auth.may_delete_group(BOB, "bobs"))
    run(auth.may_delete_group(OPS, "bobs"))  # the tenant's admin role
    run(auth.may_delete_group(OPS, "nobodys"))
    for group in ("bobs", "nobodys"):  # a name nobody owns is not alice's either
        with pytest.raises(errors.GroupAuthorizationFailed):
            run(auth.may_delete_group(ALICE, group))


def test_a_producer_id_handed_to_the_new_owner_of_its_transactional_id_is_taken_over():
    auth, owners = _owned_by(p7="bob")
    run(auth.claim_producer(ALICE, 7))  # init-producer-id answered alice producer id 7
    assert owners.table["pid:7"] == "alice"
    run(auth.require_producers(ALICE, [7]))
