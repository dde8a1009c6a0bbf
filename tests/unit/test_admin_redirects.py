"""The admin client follows a broker's redirect to the broker that owns a topic, with the
same method, body and token (Pulsar answers 307 for a topic another broker owns; httpx
alone would not follow it, and drops the token across hosts when told to), and only to
a broker of the cluster: a redirect elsewhere is not followed, the token stays."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.admin_entries import AdminError
from kop_dedup.pulsar.naming import Naming


def test_a_redirect_to_the_owning_broker_is_followed_with_the_token_and_the_body():
    seen: list[tuple[str, str, str | None, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        known = _cluster(request)  # broker-b is one of the cluster's brokers
        if known is not None:
            return known
        seen.append(
            (
                request.method,
                str(request.url),
                request.headers.get("authorization"),
                request.content,
            )
        )
        if request.url.host == "broker-a":
            return httpx.Response(
                307, headers={"location": "http://broker-b:8080" + request.url.path}
            )
        return httpx.Response(200, json={"ok": True})

    async def scenario() -> httpx.Response:
        admin = PulsarAdmin("http://broker-a:8080", Naming("public", "kafka", "kop"), token="t0k")
        await admin.close()
        admin._http = httpx.AsyncClient(
            base_url="http://broker-a:8080",
            headers={"Authorization": "Bearer t0k"},
            transport=httpx.MockTransport(handler),
        )
        try:
            return await admin.request("POST", "/admin/v2/persistent/t/p/x", json={"a": 1})
        finally:
            await admin.close()

    answer = asyncio.run(scenario())
    assert answer.json() == {"ok": True}
    assert [(m, u, a) for m, u, a, _ in seen] == [
        ("POST", "http://broker-a:8080/admin/v2/persistent/t/p/x", "Bearer t0k"),
        ("POST", "http://broker-b:8080/admin/v2/persistent/t/p/x", "Bearer t0k"),
    ]
    assert seen[0][3] == seen[1][3] == b'{"a":1}'


async def _admin_with(handler) -> PulsarAdmin:
    admin = PulsarAdmin("http://broker-a:8080", Naming("public", "kafka", "kop"), token="t0k")
    await admin.close()  # its own client, replaced by one on the mock transport
    admin._http = httpx.AsyncClient(
        base_url="http://broker-a:8080",
        headers={"Authorization": "Bearer t0k"},
        transport=httpx.MockTransport(handler),
    )
    return admin


def _cluster(request: httpx.Request) -> httpx.Response | None:
    """The cluster's answers about itself: one cluster, brokers a and b."""
    if request.url.path == "/admin/v2/clusters":
        return httpx.Response(200, json=["standalone"])
    if request.url.path == "/admin/v2/brokers/standalone":
        return httpx.Response(200, json=["broker-a:8080", "broker-b:8080"])
    return None


def test_a_redirect_to_a_host_outside_the_cluster_is_not_followed_and_gets_no_token():
    contacted: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        contacted.append((str(request.url.host), request.headers.get("authorization")))
        known = _cluster(request)
        if known is not None:
            return known
        if request.url.host == "broker-a":
            return httpx.Response(307, headers={"location": "http://evil.example:8080/x"})
        return httpx.Response(200, json={"stolen": True})

    async def scenario() -> None:
        admin = await _admin_with(handler)
        try:
            with pytest.raises(AdminError) as raised:
                await admin.request("GET", "/admin/v2/persistent/t/p/x/stats")
            assert "evil.example" in str(raised.value)
            assert "not a broker" in str(raised.value)
        finally:
            await admin.close()

    asyncio.run(scenario())
    assert "evil.example" not in [host for host, _ in contacted], contacted


def test_a_redirect_from_https_to_plain_http_is_not_followed_even_to_a_broker():
    contacted: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        contacted.append(str(request.url))
        known = _cluster(request)
        if known is not None:
            return known
        if request.url.scheme == "https":
            return httpx.Response(307, headers={"location": "http://broker-b:8080/x"})
        return httpx.Response(200, json={})

    async def scenario() -> None:
        admin = PulsarAdmin("https://broker-a:8443", Naming("public", "kafka", "kop"), token="t")
        await admin.close()
        admin._http = httpx.AsyncClient(
            base_url="https://broker-a:8443",
            headers={"Authorization": "Bearer t"},
            transport=httpx.MockTransport(handler),
        )
        try:
            with pytest.raises(AdminError):
                await admin.request("GET", "/admin/v2/persistent/t/p/x/stats")
        finally:
            await admin.close()

    asyncio.run(scenario())
    assert "http://broker-b:8080/x" not in contacted
