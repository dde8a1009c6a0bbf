"""Owners across the nodes of a cluster: an admin's release of a transactional id sent to
any node is run by the id's coordinator, and every node sees it within
``auth_owners_ttl_ms`` (each authorizes its own clients' Kafka requests from its own
reading of the owners table).

Two real sidecars in sidecar mode (each Kafka listener answers as a one-node cluster and
forwards what the other coordinates), real HTTP and Kafka wire clients, a real broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka.protocol.producer import InitProducerIdRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from tests.helpers import delete_namespace, uniq, wait_until
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

OPS = "kop-test-cluster-owners-ops"
ROLES = f"alice:tok-alice\nbob:tok-bob\nroot:tok-root\n{OPS}:tok-ops\n"
OWNERS_TTL_MS = 500
RETRIABLE = frozenset({7, 14, 15, 16, 51})


def _admins(admin: httpx.Client, change: Any) -> None:
    tenant = admin.get("/admin/v2/tenants/public").json()
    roles = change(list(tenant.get("adminRoles") or []))
    admin.post("/admin/v2/tenants/public", json={**tenant, "adminRoles": roles}).raise_for_status()


@pytest.fixture
def pair(pulsar: Any, tmp_path: Path) -> Iterator[tuple[ThreadSidecar, ThreadSidecar]]:
    roles = tmp_path / "roles"
    roles.write_text(ROLES)
    namespace = uniq("cown")
    common: dict[str, Any] = {
        "namespace": namespace,
        "auth_roles_file": roles,
        "auth_tokens": ["tok-nodes"],
        "superuser_roles": "root",
        "auth_permissions_ttl_ms": 1_000,
        "auth_owners_ttl_ms": OWNERS_TTL_MS,
        "cluster_mode": "sidecar",
        "cluster_refresh_ms": 300,
    }
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        _admins(admin, lambda r: [*r, OPS] if OPS not in r else r)
        try:
            with ThreadSidecar(pulsar, system_namespace=uniq("sys"), node_id=1, **common) as one:
                with ThreadSidecar(pulsar, cluster_of=one, node_id=2, **common) as two:
                    for node in (one, two):
                        wait_until(
                            "two members", lambda n=node: len(n.runtime.cluster.members) == 2
                        )
                    yield one, two
        finally:
            _admins(admin, lambda r: [x for x in r if x != OPS])
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


def _init(node: ThreadSidecar, token: str, tid: str) -> int:
    """InitProducerId over ``node``'s Kafka listener as ``token``'s role: its code, once
    not a retriable one (the nodes settle who coordinates what)."""
    with WireClient(node.kafka_bootstrap) as c:
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0u\0" + token.encode()), 1)
        assert auth.error_code == 0
        request = InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000)
        code = c.call(request, 1).error_code
        return int(code)


def _settled(node: ThreadSidecar, token: str, tid: str) -> int:
    return wait_until(
        "a settled answer",
        lambda: (code := _init(node, token, tid)) not in RETRIABLE and (code,),
        timeout=30,
    )[0]


def test_an_admins_release_through_another_node_frees_the_id_on_every_node(pair):
    one, two = pair
    cluster = one.runtime.cluster
    tid = uniq("crel")
    while not cluster.is_me(cluster.txn_coordinator(tid)):
        tid = uniq("crel")  # coordinated by node 1: node 2 forwards
    assert _settled(two, "tok-bob", tid) == 0  # bob squats it (claimed by node 2)
    assert _settled(two, "tok-alice", tid) == 53  # node 2 has read bob's claim
    assert _settled(one, "tok-alice", tid) == 53
    with httpx.Client(
        base_url=two.url, headers={"Authorization": "Bearer tok-ops"}, timeout=30
    ) as ops:
        r = wait_until(
            "the release, forwarded to the coordinator",
            lambda: (
                (x := ops.delete(f"/v1/transactions/{tid}/owner")).status_code not in {409, 503}
                and x
            ),
            timeout=30,
        )
    assert r.status_code == 200, r.text
    assert r.json()["releasedFrom"] == "bob", r.text
    # node 2 read bob's claim before the release: it reads again after the owners' TTL
    wait_until(
        "node 2 to see the release",
        lambda: _init(two, "tok-alice", tid) == 0,
        timeout=OWNERS_TTL_MS / 1000 + 10,
    )
    assert _settled(one, "tok-bob", tid) == 53  # alice's now, on every node
