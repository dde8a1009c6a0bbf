"""The admin client follows a broker's redirect to the broker that owns a topic, with the
same method, body and token (Pulsar answers 307 for a topic another broker owns; httpx
alone would not follow it, and drops the token across hosts when told to)."""

from __future__ import annotations

import asyncio

import httpx

from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming


def test_a_redirect_to_the_owning_broker_is_followed_with_the_token_and_the_body():
    seen: list[tuple[str, str, str | None, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
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
