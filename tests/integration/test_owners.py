"""Owners of transactional ids and groups: names checked before they are claimed, a way
back from squatting (an admin's release, deleting a group never stored), owners pruned
when their names expire, and a release made elsewhere seen within ``auth_owners_ttl_ms``.

alice and bob may produce and consume the data namespace; ``kop-test-owners-ops`` is an
admin role of the tenant; root is a superuser. One sidecar with roles (HTTP and Kafka).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pulsar as pulsar_client
import pytest
from kafka.protocol.admin import CreateAclsRequest
from kafka.protocol.producer import InitProducerIdRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kop_dedup.coordination.names import MAX_ID_LENGTH
from kop_dedup.security.owners import Owners
from tests.helpers import batch, delete_namespace, init_txn, read_all, uniq, wait_until
from tests.kafka_group_wire import delete_groups, join
from tests.kafka_wire import WireClient
from tests.pulsar_grants import Grants
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

OPS = "kop-test-owners-ops"
ROLES = f"alice:tok-alice\nbob:tok-bob\nroot:tok-root\n{OPS}:tok-ops\n"
OWNERS_TTL_MS = 500
RETENTION_MS = 1_000


class Env(Grants):
    def __init__(self, sc: ThreadSidecar, namespace: str, admin: httpx.Client) -> None:
        super().__init__(admin, namespace)
        self.sc = sc

    def api(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.sc.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def wire(self, token: str) -> WireClient:
        c = WireClient(self.sc.kafka_bootstrap)
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0u\0" + token.encode()), 1)
        assert auth.error_code == 0
        return c

    @property
    def owners_topic(self) -> str:
        return f"persistent://public/{self.sc.settings.system_namespace}/owners"


def _admins(admin: httpx.Client, change: Any) -> None:
    tenant = admin.get("/admin/v2/tenants/public").json()
    roles = change(list(tenant.get("adminRoles") or []))
    admin.post("/admin/v2/tenants/public", json={**tenant, "adminRoles": roles}).raise_for_status()


def _env(pulsar: Any, roles: Path, **settings: Any) -> Iterator[Env]:
    roles.write_text(ROLES)
    namespace = uniq("own")
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        _admins(admin, lambda r: [*r, OPS] if OPS not in r else r)
        try:
            with ThreadSidecar(
                pulsar,
                namespace=namespace,
                system_namespace=uniq("sys"),
                auth_roles_file=roles,
                superuser_roles="root",
                auth_permissions_ttl_ms=1_000,
                auth_owners_ttl_ms=OWNERS_TTL_MS,
                **settings,
            ) as sc:
                e = Env(sc, f"public/{namespace}", admin)
                e.grant("alice", ["produce", "consume"])
                e.grant("bob", ["produce", "consume"])
                yield e
        finally:
            _admins(admin, lambda r: [x for x in r if x != OPS])
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


@pytest.fixture(scope="module")
def env(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from _env(pulsar, tmp_path_factory.mktemp("owners") / "roles")


@pytest.fixture(scope="module")
def expiring(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Groups expire a second after their last use (the sweep runs every 100 ms)."""
    yield from _env(
        pulsar,
        tmp_path_factory.mktemp("expiring") / "roles",
        group_retention_ms=RETENTION_MS,
        group_retention_check_interval_ms=100,
    )


def _refused(r: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body["errorCode"] == code, r.text
    return body


def _topic(env: Env) -> str:
    topic = uniq("ot")
    with env.api("tok-root") as root:
        pid = root.post("/v1/init-producer-id", json={}).json()["producerId"]
        r = root.post("/v1/produce", json={"batches": [batch(topic, pid, 0)]})
        assert r.json()["results"][0]["errorCode"] == 0, r.text
    return topic


def _commit(api: httpx.Client, group: str, topic: str) -> httpx.Response:
    offsets = [{"topic": topic, "partition": 0, "offset": 1}]
    return api.post(f"/v1/groups/{group}/offsets", json={"offsets": offsets})


def _init_code(api: httpx.Client, tid: str) -> int:
    return int(api.post("/v1/init-producer-id", json={"transactionalId": tid}).json()["errorCode"])


def _claim_group(api: httpx.Client, group: str) -> None:
    """A use of the group that claims it and stores nothing (an unknown member's beat)."""
    r = api.post(f"/v1/groups/{group}/members/nobody/heartbeat")
    assert r.status_code != 403, r.text


def test_an_overlong_name_is_refused_before_anything_is_claimed(env):
    """A 30,006-character transactional id was claimed (stored in the owners table) and
    only then refused by the coordinator."""
    long_tid, long_group = "t" * (MAX_ID_LENGTH + 1), "g" * (MAX_ID_LENGTH + 1)
    with env.api("tok-alice") as alice:
        body = _refused(
            alice.post("/v1/init-producer-id", json={"transactionalId": long_tid}), 400, 42
        )
        assert str(MAX_ID_LENGTH) in body["errorMessage"], body
        r = alice.post(f"/v1/groups/{long_group}/members", json={"topics": [_topic(env)]})
        body = _refused(r, 400, 24)
        assert str(MAX_ID_LENGTH) in body["errorMessage"], body
        init_txn(alice, uniq("ok"))  # a name that is claimed: the table is read below
    with env.wire("tok-alice") as c:
        init = InitProducerIdRequest(transactional_id="w" * 30_006, transaction_timeout_ms=60_000)
        assert c.call(init, 1).error_code == 42  # INVALID_REQUEST
        assert join(c, "j" * (MAX_ID_LENGTH + 1), "", retry=False).error_code == 24
    client = pulsar_client.Client(env.sc.settings.pulsar_service_url)
    try:
        keys = [m.partition_key() for m in read_all(client, env.owners_topic)]
    finally:
        client.close()
    assert keys, "the owners table holds alice's claim"
    assert max(len(k) for k in keys) <= MAX_ID_LENGTH + len("group:"), "an overlong name claimed"


def test_an_acl_naming_an_overlong_group_or_transactional_id_claims_nothing(env):
    """CreateAcls gives a group or a transactional id to a role by claiming it: the name is
    checked as a first use's is (24 INVALID_GROUP_ID, 42 INVALID_REQUEST), per entry."""
    group, tid = "g" * (MAX_ID_LENGTH + 1), "x" * (MAX_ID_LENGTH + 1)
    fine = uniq("aclg")

    def creation(resource_type: int, name: str, operation: int) -> Any:
        return CreateAclsRequest.AclCreation(
            resource_type=resource_type,  # 3 GROUP, 5 TRANSACTIONAL_ID
            resource_name=name,
            resource_pattern_type=3,  # LITERAL
            principal="User:alice",
            host="*",
            operation=operation,  # 3 READ, 4 WRITE
            permission_type=3,  # ALLOW
        )

    creations = [creation(3, group, 3), creation(5, tid, 4), creation(3, fine, 3)]
    with env.wire("tok-root") as root:
        answer = root.call(CreateAclsRequest(creations=creations), 2)
    assert [r.error_code for r in answer.results] == [24, 42, 0]
    assert env.sc.call(env.sc.runtime.authorizer.owner("group", fine)) == "alice"
    for kind, name in (("group", group), ("txn", tid)):
        assert env.sc.call(env.sc.runtime.authorizer.owner(kind, name)) is None


def test_an_admin_releases_a_squatted_transactional_id(env):
    tid, topic = uniq("sq"), _topic(env)
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob, env.api("tok-ops") as ops:
        pid, epoch = init_txn(bob, tid)  # bob squats alice's id
        _refused(alice.post("/v1/init-producer-id", json={"transactionalId": tid}), 403, 53)
        _refused(alice.delete(f"/v1/transactions/{tid}/owner"), 403, 53)  # not an admin
        _refused(ops.delete(f"/v1/transactions/{uniq('none')}/owner"), 404, 105)
        r = bob.post(
            "/v1/produce",
            json={"transactionalId": tid, "batches": [batch(topic, pid, 0, epoch=epoch)]},
        )
        assert r.json()["results"][0]["errorCode"] == 0, r.text
        _refused(ops.delete(f"/v1/transactions/{tid}/owner"), 409, 51)  # open: not now
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": False}
        assert bob.post("/v1/end-txn", json=end).json()["errorCode"] == 0
        r = wait_until(  # 409 while the abort is being applied
            "the release",
            lambda: (x := ops.delete(f"/v1/transactions/{tid}/owner")).status_code != 409 and x,
        )
        assert r.status_code == 200, r.text
        assert r.json()["releasedFrom"] == "bob", r.text
        pid, epoch = init_txn(alice, tid)  # alice's now, its producer id too
        r = alice.post(
            "/v1/produce",
            json={"transactionalId": tid, "batches": [batch(topic, pid, 0, epoch=epoch)]},
        )
        assert r.json()["results"][0]["errorCode"] == 0, r.text
        _refused(bob.post("/v1/init-producer-id", json={"transactionalId": tid}), 403, 53)


def test_a_group_claimed_but_never_stored_is_deleted_by_its_owner(env):
    group, topic = uniq("sqg"), _topic(env)
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob:
        _claim_group(bob, group)
        _refused(_commit(alice, group, topic), 403, 30)
        _refused(alice.delete(f"/v1/groups/{group}"), 403, 30)  # not hers
        r = bob.delete(f"/v1/groups/{group}")
        assert r.status_code == 200, r.text
        assert r.json()["errorCode"] == 0, r.text
        r = _commit(alice, group, topic)  # the name is free: alice's first use claims it
        assert r.status_code == 200, r.text
        assert r.json()["errorCode"] == 0, r.text
        _refused(bob.delete(f"/v1/groups/{uniq('none')}"), 403, 30)  # nobody's: not bob's
    with env.api("tok-ops") as ops:
        _refused(ops.delete(f"/v1/groups/{uniq('none')}"), 404, 69)


def test_kafka_delete_groups_frees_a_group_never_stored_for_its_owner_or_an_admin(env):
    squatted, owned, nobodys = uniq("kg"), uniq("kg"), uniq("kg")
    with env.api("tok-bob") as bob:
        _claim_group(bob, squatted)
        _claim_group(bob, owned)

    def delete(token: str, group: str) -> int:
        with env.wire(token) as c:
            return delete_groups(c, group)[0]

    assert delete("tok-alice", squatted) == 30  # GROUP_AUTHORIZATION_FAILED: bob's
    assert delete("tok-ops", squatted) == 0  # the tenant's admin
    assert delete("tok-bob", owned) == 0  # its owner
    assert delete("tok-ops", nobodys) == 69  # GROUP_ID_NOT_FOUND: nothing, nobody's
    topic = _topic(env)
    with env.api("tok-alice") as alice:
        for group in (squatted, owned):
            assert _commit(alice, group, topic).json()["errorCode"] == 0


def test_an_expired_group_loses_its_owner(expiring):
    """Retention forgets a group with no members and nothing done for
    ``group_retention_ms``: its owner goes with it, as Kafka forgets an expired group."""
    env = expiring
    group, topic = uniq("exg"), _topic(env)
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob:
        assert _commit(bob, group, topic).json()["errorCode"] == 0
        _refused(_commit(alice, group, topic), 403, 30)
        wait_until(
            "the expired group to be free for alice",
            lambda: _commit(alice, group, topic).status_code == 200,
            timeout=RETENTION_MS / 1000 + 20,
        )


def test_an_expired_transactional_id_loses_its_owner_and_producer_id(env):
    """The coordinator's expiry (``transactional_id_expiry_seconds``, at least a minute:
    called here as the sweep calls it) forgets the id's owner and its producer id's."""
    tid = uniq("ext")
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob:
        old_pid, _ = init_txn(bob, tid)
        state = env.sc.runtime.transactions.state

        async def expire() -> None:
            await state.forget(state.partition_of(tid), tid, 0)

        time.sleep(0.01)  # the id's last change is over 0 ms old
        env.sc.call(expire())
        pid, _ = init_txn(alice, tid)  # a fresh id: alice's, with a new producer id
        assert pid != old_pid
        owner = env.sc.call(env.sc.runtime.authorizer.owner("pid", str(old_pid)))
        assert owner is None, owner


def test_a_release_through_another_node_takes_effect_within_the_owners_ttl(env):
    """Another node of the cluster releases the id (its own Owners on the same table):
    this node re-reads its owners after ``auth_owners_ttl_ms``; it kept them forever."""
    tid = uniq("ttl")
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob:
        init_txn(bob, tid)
        _refused(alice.post("/v1/init-producer-id", json={"transactionalId": tid}), 403, 53)

        async def release_elsewhere() -> None:
            other = Owners(env.sc.runtime.publisher.client, env.owners_topic)
            try:
                await other.release("txn", tid)
            finally:
                await other.close()

        env.sc.call(release_elsewhere())
        wait_until(
            "alice's init once the release is seen",
            lambda: _init_code(alice, tid) == 0,
            timeout=OWNERS_TTL_MS / 1000 + 10,
        )
        # the id's own producer id, once bob's, is alice's now (its owner was not released)
        pid, epoch = init_txn(alice, tid)
        r = alice.post(
            "/v1/produce",
            json={"transactionalId": tid, "batches": [batch(_topic(env), pid, 0, epoch=epoch)]},
        )
        assert r.status_code == 200, r.text  # 403/31 before: the producer id stayed bob's
        assert r.json()["results"][0]["errorCode"] == 0, r.text


def test_a_group_claimed_and_never_stored_loses_its_owner_after_the_retention(expiring):
    """A name claimed by a use that stored nothing (here an unknown member's heartbeat)
    is not in the store, so retention never saw it: its owner kept it forever."""
    env = expiring
    group, topic = uniq("unst"), _topic(env)
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob:
        _claim_group(bob, group)
        assert env.sc.call(env.sc.runtime.authorizer.owner("group", group)) == "bob"
        wait_until(
            "the never-stored group to be free for alice",
            lambda: _commit(alice, group, topic).status_code == 200,
            timeout=RETENTION_MS / 1000 + 20,
        )
