"""Per-role quotas (``ROLE_QUOTA_PERCENT``): one role filling its share of a global cap
(transactional ids, groups, Kafka connections) is throttled (89, HTTP 429) with a
message naming the quota and the setting; another role still gets its own share.

Caps of 4 at 50%: a role may hold 2 of each, so both roles fit under the global cap.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from kafka.protocol.admin import DescribeClientQuotasRequest as Describe
from kafka.protocol.producer import InitProducerIdRequest

from tests.helpers import uniq, wait_until
from tests.kafka_group_wire import join
from tests.kafka_wire import WireClient
from tests.roles import roles_sidecar, sasl_login
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

CAP, PERCENT = 4, 50
SHARE = CAP * PERCENT // 100


@pytest.fixture(scope="module")
def sc(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadSidecar]:
    with roles_sidecar(
        pulsar,
        tmp_path_factory,
        "quota",
        role_quota_percent=PERCENT,
        txn_log_partitions=1,
        offsets_partitions=1,
        max_transactional_ids_in_log=CAP,
        max_groups=CAP,
        kafka_max_connections=CAP + 2,  # room for root's connection beside both roles'
    ) as s:
        yield s


def _login(sc: ThreadSidecar, token: str) -> tuple[WireClient, int, str | None]:
    return sasl_login(sc.kafka_bootstrap, token)


def _init(c: WireClient, tid: str) -> tuple[int, str | None]:
    request = InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60000)
    answer = c.call(request, 1)
    return answer.error_code, getattr(answer, "error_message", None)


def test_a_role_past_its_share_of_transactional_ids_is_throttled_and_another_is_not(sc):
    alice, code, _ = _login(sc, "tok-alice")
    bob, bob_code, _ = _login(sc, "tok-bob")
    with alice, bob:
        assert code == 0
        assert bob_code == 0
        owned = [uniq("qtid") for _ in range(SHARE)]
        assert [_init(alice, t)[0] for t in owned] == [0] * SHARE
        assert _init(alice, uniq("qtid"))[0] == 89  # one past alice's share
        assert _init(alice, owned[0])[0] == 0  # what alice holds keeps working
        assert _init(bob, uniq("qtid"))[0] == 0  # bob has his own share
    with httpx.Client(
        base_url=sc.url, headers={"Authorization": "Bearer tok-alice"}, timeout=30
    ) as api:
        refused = api.post("/v1/init-producer-id", json={"transactionalId": uniq("qtid")})
        assert refused.status_code == 429, refused.text
        message = refused.json()["errorMessage"]
        assert "KOP_DEDUP_ROLE_QUOTA_PERCENT" in message
        assert "KOP_DEDUP_MAX_TRANSACTIONAL_IDS_IN_LOG" in message


def test_a_role_past_its_share_of_groups_is_429_and_another_is_not(sc):
    def put(token: str, group: str) -> httpx.Response:
        with httpx.Client(
            base_url=sc.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as api:
            return api.put(f"/v1/groups/{group}", json={"mode": "clustering"})

    for _ in range(SHARE):
        ok = put("tok-alice", uniq("qg"))
        assert ok.status_code == 200, ok.text
    refused = put("tok-alice", uniq("qg"))
    assert refused.status_code == 429, refused.text
    assert refused.json()["errorCode"] == 89
    assert "KOP_DEDUP_MAX_GROUPS" in refused.json()["errorMessage"]
    assert "KOP_DEDUP_ROLE_QUOTA_PERCENT" in refused.json()["errorMessage"]
    ok = put("tok-bob", uniq("qg"))
    assert ok.status_code == 200, ok.text
    alice, code, _ = _login(sc, "tok-alice")
    with alice:  # a Kafka group past alice's share too: JoinGroup answers 89
        assert code == 0
        assert join(alice, uniq("qg"), "", retry=False).error_code == 89
    ok = put("tok-root", uniq("qg"))  # a superuser is not counted
    assert ok.status_code == 200, ok.text


def _alice_connections(sc: ThreadSidecar) -> int:
    return int(sc.kafka._shared.role_connections.held.get("alice", 0))


def test_a_role_past_its_share_of_kafka_connections_is_refused_and_another_is_not(sc):
    wait_until("alice's earlier connections released", lambda: _alice_connections(sc) == 0)
    limit = (CAP + 2) * PERCENT // 100
    held = [_login(sc, "tok-alice") for _ in range(limit)]
    try:
        assert [code for _, code, _ in held] == [0] * limit
        extra, code, message = _login(sc, "tok-alice")
        with extra:
            assert code == 89, message
            assert message is not None
            assert "KOP_DEDUP_KAFKA_MAX_CONNECTIONS" in message
            assert "KOP_DEDUP_ROLE_QUOTA_PERCENT" in message
            assert extra.closed_by_peer()
        bob, code, message = _login(sc, "tok-bob")
        with bob:
            assert code == 0, message
    finally:
        for c, _, _ in held:
            c.close()
    # alice's connections closed: her share is free again (the listener releases it)
    wait_until("alice's connections released", lambda: _alice_connections(sc) == 0)
    again, code, message = _login(sc, "tok-alice")
    with again:
        assert code == 0, message


def _api(sc: ThreadSidecar, token: str) -> httpx.Client:
    return httpx.Client(base_url=sc.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_http_quotas_put_for_admins_and_get_shows_what_kafka_describes(sc):
    user = uniq("quser")
    with _api(sc, "tok-root") as root, _api(sc, "tok-alice") as alice, _api(sc, "tok-bob") as bob:
        body = {"user": user, "set": {"producer_byte_rate": 1048576}}
        refused = alice.put("/v1/quotas", json=body)
        assert refused.status_code == 403, refused.text
        assert refused.json()["errorCode"] == 31
        bad = root.put("/v1/quotas", json={"user": user, "set": {"bogus": 5}})
        assert bad.status_code == 400, bad.text
        assert bad.json()["errorCode"] == 42
        assert bad.json()["errorMessage"] == "Invalid configuration key bogus"
        checked = root.put("/v1/quotas", json={**body, "validateOnly": True})
        assert checked.status_code == 200, checked.text
        assert user not in {q["user"] for q in root.get("/v1/quotas").json()["quotas"]}
        done = root.put("/v1/quotas", json=body)
        assert done.json() == {
            "user": user,
            "quotas": {"producer_byte_rate": 1048576.0},
            "validateOnly": False,
        }
        listed = root.get("/v1/quotas").json()
        assert {"user": user, "quotas": {"producer_byte_rate": 1048576.0}} in listed["quotas"]
        assert listed["roleQuotaPercent"] == PERCENT
        assert listed["perRole"]["groups"] == SHARE
        assert listed["perRole"]["transactionalIds"] == SHARE
        assert user not in {q["user"] for q in bob.get("/v1/quotas").json()["quotas"]}
        assert alice.get("/v1/quotas").status_code == 200
    # the same table Kafka's DescribeClientQuotas reads, for admins only (31 otherwise)
    component = Describe.ComponentData(entity_type="user", match_type=0, match=user)
    c, code, _ = _login(sc, "tok-alice")
    with c:
        assert code == 0
        assert c.call(Describe(components=[component], strict=False), 1).error_code == 31
    c, code, _ = _login(sc, "tok-root")
    with c:
        assert code == 0
        answer = c.call(Describe(components=[component], strict=False), 1)
        assert [(v.key, v.value) for e in answer.entries for v in e.values] == [
            ("producer_byte_rate", 1048576.0)
        ]
