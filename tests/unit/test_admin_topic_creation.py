"""A partitioned topic another node is creating at the same moment: its count is waited
for, not read as 0. The broker answers the losers of the race 409 while the winner's
creation is under way and the topic has no count yet (seen against Pulsar 4.0.8: six
concurrent creators, one read 0 in about 1 round of 10; a node that starts with it
refuses to start: "transaction-log has 0 partitions but KOP_DEDUP_TXN_LOG_PARTITIONS is
8"). The broker's answers are played here by a transport, in the order Pulsar gave them."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming


@pytest.mark.parametrize("before", [httpx.Response(404), httpx.Response(200, json={})])
def test_a_creation_lost_to_a_concurrent_one_waits_for_the_topics_count(before):
    answers = iter([httpx.Response(404), httpx.Response(409), before, before])
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        return next(answers, httpx.Response(200, json={"partitions": 8}))

    async def scenario() -> int:
        admin = PulsarAdmin("http://broker:8080", Naming("public", "kafka", "kop"))
        await admin.close()
        admin._http = httpx.AsyncClient(
            base_url="http://broker:8080", transport=httpx.MockTransport(handler)
        )
        try:
            return await admin.ensure_partitioned_topic("persistent://public/sys/log", 8)
        finally:
            await admin.close()

    assert asyncio.run(scenario()) == 8
    assert seen == ["GET", "PUT", "GET", "GET", "GET"]
