"""PulsarAdmin.effective_deduplication: precedence, caching, coalescing.

The admin REST API is answered by an httpx MockTransport with the bodies
Pulsar 4.0.8 gives (checked by hand and by tests/integration/test_stats_api.py):
an unset policy is an empty 200, a topic that does not exist is a 404.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from kop_dedup import errors
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.naming import Naming

TOPIC_PATH = "/admin/v2/persistent/public/kafka/orders/deduplicationEnabled"
NS_PATH = "/admin/v2/namespaces/public/kafka/deduplication"
BROKER_PATH = "/admin/v2/brokers/configuration/runtime"
UNSET = object()


class FakeAdminApi:
    """Policies as the broker holds them; counts the requests it answers."""

    def __init__(self, topic: Any = UNSET, namespace: Any = UNSET, broker: str = "true") -> None:
        self.topic, self.namespace, self.broker = topic, namespace, broker
        self.topic_exists = True
        self.calls: dict[str, int] = {}
        self.delay = 0.0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls[path] = self.calls.get(path, 0) + 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if path.startswith("/admin/v2/persistent/") and path.endswith("/deduplicationEnabled"):
            if not self.topic_exists:
                return httpx.Response(404, json={"reason": "Topic not found"})
            return self.policy(self.topic)
        if path == NS_PATH:
            return self.policy(self.namespace)
        if path == BROKER_PATH:
            return httpx.Response(200, json={"brokerDeduplicationEnabled": self.broker})
        return httpx.Response(500, json={"reason": f"unexpected {path}"})

    @staticmethod
    def policy(value: Any) -> httpx.Response:
        if value is UNSET:
            return httpx.Response(200, content=b"")
        if isinstance(value, int) and not isinstance(value, bool):
            return httpx.Response(value, json={"reason": "refused"})
        return httpx.Response(200, content=json.dumps(value).encode())


async def admin_on(api: FakeAdminApi, ttl: float = 60.0) -> PulsarAdmin:
    admin = PulsarAdmin("http://admin", Naming("public", "kafka", "kop"), dedup_ttl_s=ttl)
    await admin._http.aclose()  # its own client, replaced by one on the fake
    admin._http = httpx.AsyncClient(base_url="http://admin", transport=httpx.MockTransport(api))
    return admin


def effective(api: FakeAdminApi, topic: str = "orders", ttl: float = 60.0) -> tuple[bool, str]:
    async def main() -> tuple[bool, str]:
        admin = await admin_on(api, ttl)
        try:
            return await admin.effective_deduplication(topic)
        finally:
            await admin.close()

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("topic", "namespace", "broker", "expected"),
    [
        (False, True, "true", (False, "topic")),
        (True, False, "false", (True, "topic")),
        (UNSET, True, "false", (True, "namespace")),
        (UNSET, False, "true", (False, "namespace")),
        (UNSET, UNSET, "true", (True, "broker")),
        (UNSET, UNSET, "false", (False, "broker")),
    ],
)
def test_topic_policy_wins_over_namespace_over_broker(topic, namespace, broker, expected):
    assert effective(FakeAdminApi(topic, namespace, broker)) == expected


def test_a_topic_that_does_not_exist_yet_has_the_namespace_setting():
    api = FakeAdminApi(namespace=True)
    api.topic_exists = False
    assert effective(api) == (True, "namespace")


def test_topic_level_policies_disabled_on_the_broker_read_as_no_topic_policy():
    assert effective(FakeAdminApi(topic=405, namespace=False)) == (False, "namespace")


def test_other_admin_failures_are_raised_not_guessed():
    with pytest.raises(AdminError) as info:
        effective(FakeAdminApi(topic=403))
    assert info.value.status == 403


def test_an_invalid_topic_name_is_refused_before_any_request():
    api = FakeAdminApi()
    with pytest.raises(errors.InvalidTopic):
        effective(api, topic="../../namespaces/x")
    assert api.calls == {}


def test_answers_are_cached_for_the_ttl_and_concurrent_lookups_share_one_round():
    api = FakeAdminApi(namespace=True)
    api.delay = 0.05

    async def main() -> list[tuple[bool, str]]:
        admin = await admin_on(api, ttl=60.0)
        try:
            first = await asyncio.gather(
                *(admin.effective_deduplication("orders") for _ in range(20))
            )
            again = await admin.effective_deduplication("orders")
            other = await admin.effective_deduplication("payments")  # namespace answer reused
            return [*first, again, other]
        finally:
            await admin.close()

    answers = asyncio.run(main())
    assert set(answers) == {(True, "namespace")}
    assert api.calls[TOPIC_PATH] == 1
    assert api.calls[NS_PATH] == 1
    assert api.calls["/admin/v2/persistent/public/kafka/payments/deduplicationEnabled"] == 1


def test_an_override_set_later_is_seen_once_the_ttl_has_passed():
    api = FakeAdminApi(namespace=True)

    async def main() -> list[tuple[bool, str]]:
        admin = await admin_on(api, ttl=0.05)
        try:
            before = await admin.effective_deduplication("orders")
            api.topic = False
            cached = await admin.effective_deduplication("orders")
            deadline = asyncio.get_running_loop().time() + 5
            after = cached
            while after == cached and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
                after = await admin.effective_deduplication("orders")
            return [before, cached, after]
        finally:
            await admin.close()

    before, cached, after = asyncio.run(main())
    assert before == cached == (True, "namespace")
    assert after == (False, "topic")


def test_a_failed_lookup_is_not_cached():
    api = FakeAdminApi(topic=503, namespace=True)

    async def main() -> tuple[bool, str]:
        admin = await admin_on(api)
        try:
            with pytest.raises(AdminError):
                await admin.effective_deduplication("orders")
            api.topic = UNSET
            return await admin.effective_deduplication("orders")
        finally:
            await admin.close()

    assert asyncio.run(main()) == (True, "namespace")


def test_an_off_answer_is_asked_again_so_turning_dedup_back_on_counts_at_once():
    api = FakeAdminApi(topic=False, namespace=False)

    async def main() -> list[tuple[bool, str]]:
        admin = await admin_on(api, ttl=60.0)
        try:
            off = await admin.effective_deduplication("orders")
            api.topic = UNSET  # the override removed: the namespace's "off" shows
            ns_off = await admin.effective_deduplication("orders")
            api.namespace = True
            on = await admin.effective_deduplication("orders")
            cached = await admin.effective_deduplication("orders")
            return [off, ns_off, on, cached]
        finally:
            await admin.close()

    assert asyncio.run(main()) == [
        (False, "topic"),
        (False, "namespace"),
        (True, "namespace"),
        (True, "namespace"),
    ]
    assert api.calls[TOPIC_PATH] == 3  # the "on" answer was reused
    assert api.calls[NS_PATH] == 2
