"""Pulsar's grants read once per namespace, not once per topic (issue 36, item 5).

A Metadata naming 200 topics asked the admin API for each topic's permissions; the
namespace's policies hold every topic's grants and the namespace's, so one call answers
for all of them within ``AUTH_PERMISSIONS_TTL_MS``. The calls are counted at the
sidecar's own admin client, which still talks to the real broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kop_dedup.pulsar.grants import Grants
from tests.helpers import delete_namespace, uniq
from tests.kafka_wire import WireClient
from tests.pulsar_grants import KafkaRoles
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

TTL_MS = 60_000  # one period covers the whole test


@pytest.fixture(scope="module")
def env(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaRoles]:
    roles: Path = tmp_path_factory.mktemp("grants") / "roles"
    roles.write_text("alice:tok-alice\nbob:tok-bob\n")
    namespace = uniq("gb")
    with (
        httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin,
        ThreadSidecar(
            pulsar,
            namespace=namespace,
            system_namespace=uniq("sys"),
            auth_roles_file=roles,
            auth_permissions_ttl_ms=TTL_MS,
        ) as sc,
    ):
        e = KafkaRoles(sc, f"public/{namespace}", admin)
        e.grant("bob", ["consume"])
        yield e
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


def _counted(sc: ThreadSidecar) -> list[str]:
    """The paths of the admin calls the sidecar makes from now on (made as before)."""
    admin, calls = sc.runtime.admin, []
    real = admin.request

    async def request(method: str, path: Any, **kwargs: Any) -> Any:
        calls.append(str(path))
        return await real(method, path, **kwargs)

    admin.request = request
    return calls


def _login(env: KafkaRoles, token: str) -> WireClient:
    c = WireClient(env.sc.kafka_bootstrap)
    assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
    assert c.call(SaslAuthenticateRequest(auth_bytes=b"\0u\0" + token.encode()), 1).error_code == 0
    return c


def test_a_metadata_naming_200_topics_reads_the_grants_in_one_admin_call(env):
    topics = [uniq("gm") for _ in range(200)]
    topic = uniq("own")
    path = f"/admin/v2/persistent/{env.namespace}/{topic}/partitions"
    env.admin.put(path, json=1).raise_for_status()
    env.grant("alice", ["produce"], topic=topic)  # a topic's own grant, beside the namespace's
    calls = _counted(env.sc)
    request = MetadataRequest[8](
        topics=[MetadataRequest[8].MetadataRequestTopic(name=n) for n in [*topics, topic]],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    with _login(env, "tok-bob") as bob, _login(env, "tok-alice") as alice:
        answer = bob.call(request, 8)
        seen = {t.name: t.error_code for t in answer.topics}
        assert seen.pop(topic) == 0, seen
        assert set(seen.values()) == {3}, seen  # describable (consume), not there
        answer = alice.call(request, 8)
        seen = {t.name: t.error_code for t in answer.topics}
        assert seen[topic] == 0, seen  # its own grant on that topic
        assert {seen[n] for n in topics} == {29}, seen  # nothing on the others
    policies = f"/admin/v2/namespaces/{env.namespace}"
    grants = [c for c in calls if c.endswith("/permissions") or c == policies or "/tenants/" in c]
    print(f"admin calls: {len(calls)} in all, {len(grants)} for grants: {grants}")
    assert len(grants) <= 3, grants


def test_a_full_grants_cache_keeps_its_recently_used_answers(pulsar, env):
    """The cache held 10,000 answers and was wiped whole at the next: every caller then
    asked the broker again at once. Now the least recently used answer goes."""

    async def run() -> list[str]:
        grants = Grants(env.sc.runtime.admin, env.namespace, ttl_s=60, max_cached=2)
        calls = _counted(env.sc)
        await grants.topic("a")  # the namespace's policies
        await grants.tenant_admins()
        await grants.topic("a")  # reused: now the most recent
        await grants.namespace()  # a third answer: tenant_admins', the least recent, goes
        before = len(calls)
        await grants.topic("a")
        assert len(calls) == before, calls  # kept
        await grants.tenant_admins()
        return calls[before:]

    again = env.sc.call(run())
    assert [c.rsplit("/", 2)[-2:] for c in again] == [["tenants", "public"]], again
