"""The group store against the real broker: writes travel while the next change runs
(not under the partition's lock), and a write that failed is never taken for stored."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.coordination.groups.store import GroupStore, key
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup_tools.registry_startup import delete_namespace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def namespace(pulsar: Any) -> Iterator[str]:
    ns = f"public/kop-dedup-group-store-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        r = admin.put(f"/admin/v2/namespaces/{ns}")
        assert r.status_code == 204, r.text
    yield ns
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        deadline = time.monotonic() + 30  # a topic whose last client just left may refuse
        while (topics := admin.get(f"/admin/v2/persistent/{ns}/partitioned").json()) and (
            time.monotonic() < deadline
        ):
            for topic in topics:
                path = topic.removeprefix("persistent://")
                admin.delete(f"/admin/v2/persistent/{path}/partitions", params={"force": "true"})
    asyncio.run(delete_namespace(pulsar.admin_url, ns))


async def _stores(pulsar: Any, topic: str, n: int) -> list[tuple[Any, PulsarAdmin, GroupStore]]:
    out = []
    for _ in range(n):
        client = pulsar_async.Client(
            pulsar.service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error)
        )
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        store = GroupStore(client, admin, topic, 1, adopt_interval_s=3600)
        if not out:  # creates the topic; the others adopt nothing behind the test's back
            await store.start()
        out.append((client, admin, store))
    return out


async def _close(stores: list[tuple[Any, PulsarAdmin, GroupStore]]) -> None:
    for client, admin, store in stores:
        await store.close()
        await admin.close()
        await client.close()


@pytest.mark.parametrize("failed_before_the_change_ends", [False, True])
def test_writes_fenced_after_the_view_had_them_are_read_again_from_the_log(
    pulsar, namespace, failed_before_the_change_ends
):
    """Sidecar A's change writes a key twice after sidecar B took the partition (and wrote
    the key once): A's writes fail (while the change runs, or after), and A's retry sees
    B's record, not its own versions that were never stored (they are newer than B's,
    so catching up alone keeps them)."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"
    k = key("o", "g", "t", 0)

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 3)
        (_, _, a), (_, _, b), (_, _, c) = stores
        try:
            await a.owned("g", lambda p: a.write(p, k, {"by": "a"}))
            runs = []

            async def change(p: int) -> Any:
                runs.append(a.view_doc(p, k))
                if len(runs) == 1:
                    await b.owned("g", lambda q: b.write(q, k, {"by": "b"}))
                    await a.write(p, k, {"by": "a-not-stored-1"})
                    await a.write(p, k, {"by": "a-not-stored-2"})
                    deadline = asyncio.get_running_loop().time() + 30
                    while failed_before_the_change_ends and a.parts.owned(p):
                        assert asyncio.get_running_loop().time() < deadline, "never fenced"
                        await asyncio.sleep(0.01)
                return a.view_doc(p, k)

            seen = await asyncio.wait_for(a.owned("g", change), 60)
            assert runs[0] == {"by": "a", "v": 1}
            assert seen == {"by": "b", "v": 2}, "the retry decided on writes never stored"
            assert len(runs) == 2
            await c.read("g")
            assert c.doc("g", "o", "t", 0) == {"by": "b", "v": 2}
            await a.owned("g", lambda p: a.write(p, k, {"by": "a-again"}))
            await c.read("g")
            assert c.doc("g", "o", "t", 0) == {"by": "a-again", "v": 3}
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_changes_of_one_partition_answer_once_their_writes_are_stored(pulsar, namespace):
    """Many concurrent changes (the members of one group): every one answered is stored,
    read back by another sidecar, with one version per write."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, _, b) = stores
        try:

            async def bump(m: int, i: int) -> None:
                await a.owned("g", lambda p: a.write(p, key("d", "g", f"m{m}", "t", 0), {"i": i}))

            for i in range(5):
                await asyncio.gather(*(bump(m, i) for m in range(8)))
            await b.read("g")
            for m in range(8):
                assert b.doc("g", "d", f"m{m}", "t", 0) == {"i": 4, "v": 5}
        finally:
            await _close(stores)

    asyncio.run(scenario())
