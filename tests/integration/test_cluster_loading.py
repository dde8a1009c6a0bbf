"""A node's wait for its state partitions follows the cluster's latest decision: a
partition handed to it and then moved on (the members changed while it loaded, as when
nodes start side by side) is not waited for.

Real broker: the partitions are a group store's, loaded and released through
:meth:`StatePartitions.assign` as the cluster does after every listing."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.coordination.groups.store import GroupStore
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming

pytestmark = pytest.mark.integration


def test_the_load_wait_ends_when_what_is_assigned_now_is_loaded(pulsar):
    """Assigned partitions 0 and 1, then (while they load) only 0: the wait that began
    under the first assignment ends once 0 is loaded. It waited for 1 until its timeout
    (30 s at every start of a node whose view changed while it loaded)."""
    topic = f"persistent://public/default/load-wait-{uuid.uuid4().hex[:8]}"

    async def scenario() -> float:
        client = pulsar_async.Client(
            pulsar.service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error)
        )
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        store = GroupStore(client, admin, topic, 2, handoff_wait_s=0)
        try:
            await store.start()
            store.parts.assign({0, 1})
            waited = asyncio.create_task(store.parts.loaded(20))
            await asyncio.sleep(0)  # the wait has begun, under {0, 1}
            began = time.monotonic()
            store.parts.assign({0})
            assert await waited, "the wait did not end"
            assert store.parts.owned(0)
            return time.monotonic() - began
        finally:
            await store.close()
            await admin.close()
            await client.close()

    seconds: Any = asyncio.run(scenario())
    assert seconds < 15, seconds
