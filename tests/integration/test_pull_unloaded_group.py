"""An HTTP pull is checked against the topics it reads even when the group is not
loaded where it lands (issue 36, item 9).

The route looked the member's topics up in the node's view before the coordinator
loaded the group: where the view did not hold the group (a partition to be read again
from its start, as after a write of ours that failed; a node taking the partition over)
it found no member, checked no topic, and the coordinator then loaded the group and
served the records. Now the coordinator asks, once the group is loaded, about the
topics it is about to read.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kop_dedup.security.authorizer import CONSUME
from kop_dedup.security.identity import Identity
from tests.helpers import batch, delete_namespace, uniq, wait_until
from tests.pulsar_grants import Grants
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


@pytest.fixture
def sc(pulsar, tmp_path: Path) -> Iterator[ThreadSidecar]:
    roles = tmp_path / "roles"
    roles.write_text("frank:tok-frank\nroot:tok-root\n")
    namespace = uniq("pu")
    with ThreadSidecar(
        pulsar,
        namespace=namespace,
        system_namespace=uniq("sys"),
        auth_roles_file=roles,
        superuser_roles="root",
        auth_permissions_ttl_ms=500,
        kafka_listener="",
    ) as sidecar:
        yield sidecar
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


def _api(sc: ThreadSidecar, token: str) -> httpx.Client:
    return httpx.Client(base_url=sc.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


async def _read_again(sc: ThreadSidecar, group: str) -> None:
    """What the store does after a write of its own failed and another node owns the
    partition: drop its view of the group's partition, to be read again from its start
    at the next use."""
    store = sc.runtime.groups.store
    p = store.partition_of(group)
    async with store.parts.lock(p):
        await store.parts.restart(p, functools.partial(store._view.clear, p))


def test_a_pull_where_the_group_is_not_loaded_checks_the_topics_it_reads(pulsar, sc):
    topic, group = uniq("pull"), uniq("pg")
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        grants = Grants(admin, f"public/{sc.settings.namespace}")
        grants.grant("frank", ["consume"])
        with _api(sc, "tok-root") as root:
            pid = root.post("/v1/init-producer-id", json={}).json()["producerId"]
            r = root.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 3)]})
            assert r.json()["results"][0]["errorCode"] == 0, r.text
        with _api(sc, "tok-frank") as frank:
            r = frank.put(f"/v1/groups/{group}", json={"autoOffsetReset": "earliest"})
            assert r.status_code == 200, r.text
            r = frank.post(f"/v1/groups/{group}/members", json={"topics": [topic]})
            assert r.status_code == 200, r.text
            member = r.json()["memberId"]
            grants.revoke("frank")
            may = sc.runtime.authorizer.may
            wait_until(
                "the revocation seen",
                lambda: not sc.call(may(Identity("frank"), CONSUME, topic)),
            )
            sc.call(_read_again(sc, group))
            assert sc.runtime.groups.group(group) is None  # not loaded here now
            pull = f"/v1/groups/{group}/members/{member}/pull"

            def answered() -> httpx.Response | None:
                r = frank.post(pull, json={"maxRecords": 10, "waitMs": 1000})
                return None if r.status_code == 503 else r  # 14 while it loads: retry

            r = wait_until("a pull answered", answered)
            assert r.status_code == 403, r.text  # the build before: 200, 3 records
            assert r.json()["errorCode"] == 29, r.text
            assert sc.runtime.groups.group(group) is not None  # loaded by the pull


def test_a_groups_offsets_leave_out_the_topics_the_role_may_no_longer_consume(pulsar, sc):
    """HTTP's OffsetFetch of every topic (GET .../offsets) listed them all; as Kafka's
    (and the listener's) it now lists only the topics the caller may consume."""
    kept, revoked, group = uniq("kept"), uniq("gone"), uniq("og")
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        grants = Grants(admin, f"public/{sc.settings.namespace}")
        for topic in (kept, revoked):
            path = f"/admin/v2/persistent/{grants.namespace}/{topic}/partitions"
            admin.put(path, json=1).raise_for_status()
            grants.grant("frank", ["consume"], topic=topic)
        with _api(sc, "tok-frank") as frank:
            offsets = [{"topic": t, "partition": 0, "offset": 5} for t in (kept, revoked)]
            r = frank.post(f"/v1/groups/{group}/offsets", json={"offsets": offsets})
            assert r.status_code == 200, r.text
            path = f"/admin/v2/persistent/{grants.namespace}/{revoked}/permissions/frank"
            admin.delete(path).raise_for_status()
            may = sc.runtime.authorizer.may
            wait_until(
                "the revocation seen",
                lambda: not sc.call(may(Identity("frank"), CONSUME, revoked)),
            )
            r = frank.get(f"/v1/groups/{group}/offsets")
            assert r.status_code == 200, r.text
            assert [(o["topic"], o["offset"]) for o in r.json()["offsets"]] == [(kept, 5)]
        with _api(sc, "tok-root") as root:  # a superuser sees every topic's
            r = root.get(f"/v1/groups/{group}/offsets")
            assert {o["topic"] for o in r.json()["offsets"]} == {kept, revoked}, r.text
