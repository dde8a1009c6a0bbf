"""Roles and Pulsar's permissions over HTTP: two roles (alice, bob) and a superuser (root).

Grants live in Pulsar (the data namespace's and a topic's permissions, set through the
admin API as ``pulsar-admin ... grant-permission`` does); a transactional id and a
group belong to the role that used them first. bob may consume the namespace and
produce only to one topic; alice may produce and consume the whole namespace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from tests.helpers import batch, delete_namespace, uniq, wait_until
from tests.pulsar_grants import Grants
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

TTL_MS = 1_000
ROLES = "alice:tok-alice\nbob:tok-bob\nroot:tok-root\n"
SECRET = b"0123456789abcdef0123456789abcdef"
ALLOWED = "http://127.0.0.1:9/allowed/"


class Env(Grants):
    def __init__(self, sc: ThreadSidecar, namespace: str, roles: Path, admin: httpx.Client):
        super().__init__(admin, namespace)
        self.sc, self.roles = sc, roles

    def api(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.sc.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )


@pytest.fixture(scope="module")
def env(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    d = tmp_path_factory.mktemp("roles")
    roles, secret = d / "roles", d / "secret.key"
    roles.write_text(ROLES)
    secret.write_bytes(SECRET)
    namespace = uniq("sec")
    with (
        httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin,
        ThreadSidecar(
            pulsar,
            namespace=namespace,
            system_namespace=uniq("sys"),
            auth_roles_file=roles,
            auth_token_secret_key=f"file://{secret}",
            superuser_roles="root",
            auth_permissions_ttl_ms=TTL_MS,
            check_back_urls=ALLOWED,
        ) as sc,
    ):
        e = Env(sc, f"public/{namespace}", roles, admin)
        e.grant("alice", ["produce", "consume"])
        e.grant("bob", ["consume"])
        e.grant("carol", ["produce", "consume"])
        yield e
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


def _forbidden(r: httpx.Response, code: int) -> None:
    assert r.status_code == 403, r.text
    assert r.json()["errorCode"] == code, r.text


def _produced(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["errorCode"] == 0, r.text


def _init(api: httpx.Client, tid: str) -> tuple[int, int]:
    r = api.post("/v1/init-producer-id", json={"transactionalId": tid})
    assert r.status_code == 200, r.text
    assert r.json()["errorCode"] == 0, r.text
    return r.json()["producerId"], r.json()["producerEpoch"]


def test_a_token_names_its_role_and_an_unknown_token_is_refused(env):
    with env.api("nobody") as api:
        assert api.get("/v1/transactions").status_code == 403
    with httpx.Client(base_url=env.sc.url) as api:
        assert api.get("/v1/transactions").status_code == 401
    with env.api("tok-alice") as api:
        assert api.get("/v1/transactions").status_code == 200


def test_a_pulsar_jwt_authenticates_as_its_sub_and_an_expired_one_is_refused(env):
    topic = uniq("jwt")
    good = jwt.encode({"sub": "carol"}, SECRET, algorithm="HS256")
    stale = jwt.encode({"sub": "carol", "exp": int(time.time()) - 60}, SECRET, algorithm="HS256")
    forged = jwt.encode({"sub": "root"}, b"another key" * 4, algorithm="HS256")
    with env.api(good) as api:
        r = api.post("/v1/produce", json={"batches": [batch(topic, _pid(api), 0)]})
        _produced(r)
    for token in (stale, forged):
        with env.api(token) as api:
            assert api.get("/v1/transactions").status_code == 403


def _pid(api: httpx.Client) -> int:
    r = api.post("/v1/init-producer-id", json={})
    assert r.status_code == 200, r.text
    return int(r.json()["producerId"])


def test_produce_needs_the_produce_permission_on_the_topic(env):
    mine, shared = uniq("own"), uniq("shared")
    with env.api("tok-root") as root:
        r = root.post("/v1/produce", json={"batches": [batch(shared, _pid(root), 0)]})
        assert r.json()["results"][0]["errorCode"] == 0
    env.grant("bob", ["produce"], topic=shared)
    with env.api("tok-bob") as bob:
        pid = _pid(bob)
        _forbidden(bob.post("/v1/produce", json={"batches": [batch(mine, pid, 0)]}), 29)
        r = bob.post("/v1/produce", json={"batches": [batch(shared, pid, 0)]})
        _produced(r)
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob:
        alices = _pid(alice)
        r = alice.post("/v1/produce", json={"batches": [batch(mine, alices, 0)]})
        _produced(r)
        # bob may produce to shared, but not as alice's producer (it would fence her)
        fence = batch(shared, alices, 0, epoch=32767)
        _forbidden(bob.post("/v1/produce", json={"batches": [fence]}), 31)


def _code(r: httpx.Response) -> int:
    """A produce answer's code: the whole request's when refused, else its batch's."""
    body = r.json()
    return int(body["errorCode"] if r.status_code != 200 else body["results"][0]["errorCode"])


def test_a_producer_id_not_yet_handed_out_is_refused_and_its_later_owner_starts_clean(env):
    """Producer ids are handed out in order: bob, given N, writes N+1 before anyone has
    it. alice, given N+1 next, would have her first 100 records answered 46 and dropped."""
    topic = uniq("forge")
    with env.api("tok-root") as root:  # a topic-level grant needs the topic
        _produced(root.post("/v1/produce", json={"batches": [batch(topic, _pid(root), 0)]}))
    env.grant("bob", ["produce"], topic=topic)
    with env.api("tok-bob") as bob, env.api("tok-alice") as alice:
        forged = _pid(bob) + 1
        by_bob = bob.post("/v1/produce", json={"batches": [batch(topic, forged, 0, 100)]})
        assert _pid(alice) == forged  # the id bob wrote is alice's now
        by_alice = alice.post("/v1/produce", json={"batches": [batch(topic, forged, 0, 100)]})
    assert (by_bob.status_code, _code(by_bob), _code(by_alice)) == (400, 59, 0), (
        by_bob.text,
        by_alice.text,
    )


def test_a_producer_id_above_those_handed_out_or_a_superusers_is_refused_to_a_role(env):
    topic = uniq("forge")
    with env.api("tok-alice") as alice, env.api("tok-root") as root:
        far, roots = _pid(alice) + 5_000, _pid(root)
        answers = [
            alice.post("/v1/produce", json={"batches": [batch(topic, pid, 0)]})
            for pid in (far, roots)
        ]
        assert [(r.status_code, _code(r)) for r in answers] == [(400, 59)] * 2, [
            r.text for r in answers
        ]
        # the superuser itself may use either (it may do everything)
        _produced(root.post("/v1/produce", json={"batches": [batch(topic, roots, 0)]}))


def test_another_role_cannot_see_fence_stage_into_or_end_a_transaction(env):
    tid, topic, group = uniq("tx"), uniq("txt"), uniq("g")
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob, env.api("tok-root") as root:
        pid, epoch = _init(alice, tid)
        staged = {"transactionalId": tid, "batches": [batch(topic, pid, 0, epoch=epoch)]}
        r = alice.post("/v1/produce", json=staged)
        assert r.json()["results"][0]["errorCode"] == 0, r.text
        # bob: no listing, no describe, no fence (init), no staging, no offsets, no end
        assert tid not in {
            t["transactionalId"] for t in bob.get("/v1/transactions").json()["transactions"]
        }
        _forbidden(bob.get(f"/v1/transactions/{tid}"), 53)
        _forbidden(bob.post("/v1/init-producer-id", json={"transactionalId": tid}), 53)
        _forbidden(bob.post("/v1/produce", json=staged), 53)
        offsets = {
            "transactionalId": tid,
            "producerId": pid,
            "producerEpoch": epoch,
            "groupId": group,
            "offsets": [{"topic": topic, "partition": 0, "offset": 1}],
        }
        _forbidden(bob.post("/v1/txn-offset-commit", json=offsets), 53)
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True}
        _forbidden(bob.post("/v1/end-txn", json=end), 53)
        # alice and root see it; alice ends it
        for api in (alice, root):
            listed = api.get("/v1/transactions").json()["transactions"]
            assert tid in {t["transactionalId"] for t in listed}
        assert alice.get(f"/v1/transactions/{tid}").status_code == 200
        r = alice.post("/v1/txn-offset-commit", json=offsets)
        assert r.json()["errorCode"] == 0, r.text
        r = alice.post("/v1/end-txn", json=end)
        assert r.json()["errorCode"] == 0, r.text
        # the superuser may fence it
        assert root.post("/v1/init-producer-id", json={"transactionalId": tid}).json()[
            "errorCode"
        ] in (0, 51)


def test_another_role_cannot_join_reset_or_read_a_group(env):
    group, topic = uniq("g"), uniq("gt")
    with env.api("tok-root") as root:
        r = root.post("/v1/produce", json={"batches": [batch(topic, _pid(root), 0)]})
        assert r.json()["results"][0]["errorCode"] == 0
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob, env.api("tok-root") as root:
        r = alice.post(f"/v1/groups/{group}/members", json={"topics": [topic]})
        assert r.status_code == 200, r.text
        _forbidden(bob.post(f"/v1/groups/{group}/members", json={"topics": [topic]}), 30)
        reset = {"topic": topic, "to": "earliest"}
        _forbidden(bob.post(f"/v1/groups/{group}/reset", json=reset), 30)
        _forbidden(bob.get(f"/v1/groups/{group}/offsets"), 30)
        _forbidden(bob.get(f"/v1/groups/{group}"), 30)
        assert alice.post(f"/v1/groups/{group}/reset", json=reset).status_code == 200
        assert root.get(f"/v1/groups/{group}").status_code == 200
        # bob's own group: consume is enough
        r = bob.post(f"/v1/groups/{uniq('gb')}/members", json={"topics": [topic]})
        assert r.status_code == 200, r.text


def test_a_revoked_grant_takes_effect_within_the_stated_staleness(env):
    topic = uniq("rev")
    env.grant("dave", ["produce"])
    env.roles.write_text(ROLES + "dave:tok-dave\n")
    with env.api("tok-dave") as dave:
        pid = _pid(dave)

        def accepted() -> bool:  # a grant, too, counts within the staleness
            r = dave.post("/v1/produce", json={"batches": [batch(topic, pid, 0)]})
            return r.status_code == 200 and r.json()["results"][0]["errorCode"] == 0

        wait_until("the grant", accepted, timeout=TTL_MS / 1000 + 5)
        env.revoke("dave")
        revoked = time.monotonic()

        def refused() -> bool:
            r = dave.post("/v1/produce", json={"batches": [batch(topic, pid, 1)]})
            return r.status_code == 403

        wait_until("the revocation", refused, timeout=TTL_MS / 1000 + 5)
        assert time.monotonic() - revoked < TTL_MS / 1000 + 2
        # and a removed line of the roles file: refused at the next request
        env.roles.write_text(ROLES)
        r = dave.get("/v1/transactions")
        assert r.status_code == 403
        assert "token not accepted" in r.text


def test_the_internal_api_stats_and_metrics_are_for_superusers_only(env):
    with env.api("tok-alice") as alice, env.api("tok-root") as root:
        r = alice.post("/internal/v1/kafka", content=b"", headers={"x-kafka-api-key": "3"})
        assert r.status_code == 403
        for path in ("/v1/stats", "/metrics", "/v1/cluster"):
            assert alice.get(path).status_code == 403, path
            assert root.get(path).status_code == 200, path


def test_a_check_back_url_is_allowed_only_under_the_allow_list_and_shown_only_to_its_role(env):
    tid = uniq("cb")
    with env.api("tok-alice") as alice, env.api("tok-bob") as bob:
        for url in ("http://169.254.169.254/latest/", "http://127.0.0.1:9/elsewhere"):
            r = alice.post(
                "/v1/init-producer-id", json={"transactionalId": tid, "checkBackUrl": url}
            )
            assert r.status_code == 400, r.text
            assert "KOP_DEDUP_CHECK_BACK_URLS" in r.json()["errorMessage"]
        url = ALLOWED + "tx"
        r = alice.post("/v1/init-producer-id", json={"transactionalId": tid, "checkBackUrl": url})
        assert r.status_code == 200, r.text
        assert r.json()["errorCode"] == 0, r.text
        assert alice.get(f"/v1/transactions/{tid}").json()["checkBackUrl"] == url
        _forbidden(bob.get(f"/v1/transactions/{tid}"), 53)


def test_without_an_allow_list_a_check_back_url_is_refused(pulsar):
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url) as api,
    ):
        body = {"transactionalId": uniq("cb"), "checkBackUrl": "http://127.0.0.1:9/x"}
        r = api.post("/v1/init-producer-id", json=body)
    assert r.status_code == 400, r.text
    assert "KOP_DEDUP_CHECK_BACK_URLS" in r.json()["errorMessage"]


def test_looking_at_a_name_nobody_owns_does_not_take_it(env):
    tid, group = uniq("look"), uniq("look")
    with env.api("tok-bob") as bob, env.api("tok-alice") as alice:
        assert bob.get(f"/v1/transactions/{tid}").status_code == 404
        assert bob.get(f"/v1/groups/{group}").status_code == 404
        _init(alice, tid)
        r = alice.put(f"/v1/groups/{group}", json={"mode": "clustering"})
        assert r.status_code == 200, r.text
        _forbidden(bob.get(f"/v1/groups/{group}"), 30)


def test_a_revoked_consume_grant_stops_a_members_pulls_within_the_staleness(env):
    topic, group = uniq("pull"), uniq("pg")
    with env.api("tok-root") as root:
        _produced(root.post("/v1/produce", json={"batches": [batch(topic, _pid(root), 0)]}))
    env.grant("frank", ["consume"])
    with env.api(jwt.encode({"sub": "frank"}, SECRET, algorithm="HS256")) as frank:

        def joined() -> str | None:
            r = frank.post(f"/v1/groups/{group}/members", json={"topics": [topic]})
            return r.json()["memberId"] if r.status_code == 200 else None

        member = wait_until("frank's grant", joined, timeout=TTL_MS / 1000 + 5)
        pull = f"/v1/groups/{group}/members/{member}/pull"
        r = frank.post(pull, json={"maxRecords": 10, "waitMs": 2000})
        assert r.status_code == 200, r.text
        env.revoke("frank")
        wait_until(
            "the revocation",
            lambda: frank.post(pull, json={"maxRecords": 10}).status_code == 403,
            timeout=TTL_MS / 1000 + 5,
        )


def test_a_request_forwarded_to_the_owner_is_authorized_there_as_its_client(pulsar, env):
    """Two nodes: the nodes call each other with the AUTH_TOKENS token (a superuser);
    a client's request is forwarded with its own token, never the node's."""
    roles = env.roles.parent / "cluster-roles"
    roles.write_text(ROLES)
    common = {
        "namespace": env.namespace.split("/", 1)[1],
        "auth_roles_file": roles,
        "auth_tokens": ["tok-nodes"],
        "auth_permissions_ttl_ms": TTL_MS,
    }
    with ThreadSidecar(pulsar, system_namespace=uniq("sys"), **common) as a:
        with ThreadSidecar(pulsar, cluster_of=a, **common) as b:
            wait_until("two members", lambda: len(b.runtime.cluster.members) == 2)
            cluster = b.runtime.cluster
            group = uniq("fw")
            while cluster.is_me(cluster.group_coordinator(group)):
                group = uniq("fw")
            topic = uniq("fwt")
            with httpx.Client(
                base_url=b.url, headers={"Authorization": "Bearer tok-alice"}, timeout=30
            ) as alice:
                _produced(
                    alice.post("/v1/produce", json={"batches": [batch(topic, _pid(alice), 0)]})
                )
                r = alice.post(f"/v1/groups/{group}/members", json={"topics": [topic]})
                assert r.status_code == 200, r.text
            with httpx.Client(
                base_url=b.url, headers={"Authorization": "Bearer tok-bob"}, timeout=30
            ) as bob:
                forwarded = cluster.stats.forwarded
                _forbidden(bob.post(f"/v1/groups/{group}/members", json={"topics": [topic]}), 30)
                assert cluster.stats.forwarded == forwarded + 1  # decided by the owner


def test_a_topic_name_with_dots_and_slashes_is_refused_before_any_permission_is_read(env):
    with env.api("tok-alice") as alice:
        pid = _pid(alice)
        for name in ("..", "../../public/other/ledger"):
            r = alice.post("/v1/produce", json={"batches": [batch(name, pid, 0)]})
            assert r.status_code == 400, r.text
            assert r.json()["errorCode"] == 17, r.text
