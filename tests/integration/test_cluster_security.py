"""Nodes of one cluster agree on security (issue 36): a node whose authentication differs
from the cluster's is refused at join, and a request claiming to come from another node
(``x-kop-forwarded-by``) is served as one only when a node of the cluster proves it.

Real broker, real sidecars (uvicorn on real sockets) and a real Runtime for the node
that is refused (a refused start is an exception, not a sidecar that never gets ready).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kop_dedup.cluster.members import SecurityMismatch
from kop_dedup.cluster.peers import FORWARDED
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from kop_dedup_tools.sidecar import SidecarError
from tests.helpers import batch, uniq, wait_until
from tests.sidecar import ProcessSidecar, ThreadSidecar

pytestmark = pytest.mark.integration

ROLES = "alice:tok-alice\nroot:tok-root\n"
OFFSETS = {"offsets": [{"topic": "t", "partition": 0, "offset": 1}]}


def _roles(tmp_path: Path) -> Path:
    roles = tmp_path / "roles"
    roles.write_text(ROLES)
    return roles


def test_a_node_with_a_roles_file_is_refused_by_a_cluster_whose_node_authenticates_nobody(
    pulsar: Any, tmp_path: Path
) -> None:
    """The confirmed case: an open sidecar already runs in the system namespace; a sidecar
    with a roles file starting there must not join (it would forward its clients' requests
    to a node that authenticates nobody)."""
    ns = uniq("sys")
    with ThreadSidecar(pulsar, system_namespace=ns, node_id=1, cluster_refresh_ms=300) as open_:
        settings = Settings(
            pulsar_service_url=pulsar.service_url,
            pulsar_admin_url=pulsar.admin_url,
            system_namespace=ns,
            node_id=2,
            auth_roles_file=_roles(tmp_path),
            superuser_roles="root",
        )

        async def join() -> None:
            runtime = Runtime(settings)
            try:
                await runtime.start()
                await runtime.join_cluster(None)
            finally:
                await runtime.close()

        with pytest.raises(SecurityMismatch) as refused:
            asyncio.run(join())
        message = str(refused.value)
        assert "authentication" in message, message
        assert "node 1" in message, message
        assert "tok-" not in message  # names the setting, never the secret
        assert open_.runtime.cluster.view.node_ids == (1,)


def test_a_sidecar_process_with_a_roles_file_exits_naming_the_setting_that_differs(
    pulsar: Any, tmp_path: Path
) -> None:
    """The same, as an operator sees it: ``kop-dedup serve`` exits and its log says why."""
    ns = uniq("sys")
    with ThreadSidecar(pulsar, system_namespace=ns, node_id=1, cluster_refresh_ms=300):
        refused = ProcessSidecar(
            pulsar,
            tmp_path,
            system_namespace=ns,
            node_id=2,
            auth_roles_file=_roles(tmp_path),
            allow_unauthenticated=False,
        )
        try:
            with pytest.raises(SidecarError):
                refused.start(timeout=60)
        finally:
            refused.stop()  # a build that lets it join leaves it running
        log = refused.log_path.read_text()
        assert "SecurityMismatch" in log, log[-2000:]
        assert "authentication is on here and off on node 1" in log, log[-2000:]


@pytest.fixture(scope="module")
def pair(pulsar: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ThreadSidecar]]:
    """Two nodes with the same roles file and node token (ids 1 and 2)."""
    roles = _roles(tmp_path_factory.mktemp("pair"))
    ns = uniq("sys")
    common = {
        "system_namespace": ns,
        "auth_roles_file": roles,
        "auth_tokens": ["tok-nodes"],
        "superuser_roles": "root",
        "cluster_refresh_ms": 300,
    }
    nodes = [ThreadSidecar(pulsar, node_id=i, **common).start() for i in (1, 2)]
    try:
        wait_until("two members", lambda: all(len(n.runtime.cluster.members) == 2 for n in nodes))
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _group_coordinated_by_the_other(node: ThreadSidecar) -> str:
    cluster = node.runtime.cluster
    group = uniq("fw")
    while cluster.is_me(cluster.group_coordinator(group)):
        group = uniq("fw")
    return group


def test_a_forged_forwarded_by_header_from_a_client_is_refused(pair: list[ThreadSidecar]) -> None:
    """A client that names itself a node is refused (31), not served as a forwarded
    request where it lands; without a token it is refused too (401 or 31)."""
    _, b = pair
    group = _group_coordinated_by_the_other(b)
    forged = {FORWARDED: "1"}
    with httpx.Client(base_url=b.url, timeout=30) as api:
        r = api.post(f"/v1/groups/{group}/offsets", json=OFFSETS, headers=forged)
        assert r.status_code in {401, 403}, r.text
        root = {"Authorization": "Bearer tok-root"}
        r = api.post(f"/v1/groups/{group}/offsets", json=OFFSETS, headers={**root, **forged})
        assert r.status_code == 403, r.text
        assert r.json()["errorCode"] == 31, r.text
        assert "x-kop-forwarded-by" in r.json()["errorMessage"], r.text
        r = api.post(
            "/v1/produce",
            json={"batches": [batch(uniq("forged"), 1, 0)]},
            headers={**root, **forged},
        )
        assert r.status_code == 403, r.text
        assert r.json()["errorCode"] == 31, r.text


def test_a_request_forwarded_by_a_node_of_the_cluster_is_still_served_by_the_owner(
    pair: list[ThreadSidecar],
) -> None:
    """The forwarding node proves the request is its own: the owner serves it."""
    _, b = pair
    group = _group_coordinated_by_the_other(b)
    forwarded = b.runtime.cluster.stats.forwarded

    def committed() -> bool:
        with httpx.Client(base_url=b.url, timeout=30) as api:
            r = api.post(
                f"/v1/groups/{group}/offsets",
                json=OFFSETS,
                headers={"Authorization": "Bearer tok-root"},
            )
        return r.status_code == 200 and r.json().get("errorCode", 0) == 0

    wait_until("the owner to take the forwarded commit", committed)
    assert b.runtime.cluster.stats.forwarded > forwarded


def test_a_kafka_request_a_node_forwards_is_proved_and_served_by_the_other(
    pair: list[ThreadSidecar],
) -> None:
    """``/internal/v1/kafka`` (the node token, and the proof of the forwarding node):
    an ApiVersions v0 request forwarded by node 2 is answered by node 1."""
    a, b = pair
    owner = b.runtime.cluster.view.member(1)
    answer = b.call(b.runtime.peers.kafka(owner, 18, 0, "forward-test", b""))
    assert answer[:2] == b"\x00\x00", answer[:16]  # error_code 0, then the api keys
    with httpx.Client(base_url=a.url, timeout=30) as api:  # the same call, forged
        r = api.post(
            "/internal/v1/kafka",
            headers={
                "Authorization": "Bearer tok-nodes",
                FORWARDED: "2",
                "x-kafka-api-key": "18",
                "x-kafka-api-version": "0",
            },
            content=b"",
        )
    assert r.status_code == 403, r.text
    assert r.json()["errorCode"] == 31, r.text
