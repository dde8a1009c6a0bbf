"""The system namespace is not trusted blindly (issue 36, item 8): it must differ from
the data namespace, and only the sidecars' role (and superusers) may be granted on it."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from kop_dedup.runtime import Runtime
from kop_dedup.security.system_namespace import (
    SystemNamespaceExposed,
    foreign_grants,
    separation_refusal,
    token_role,
)
from kop_dedup.settings import Settings


def jwt_of(claims: dict) -> str:
    """A JWT's shape (the signature is not checked here)."""

    def part(doc: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'HS256'})}.{part(claims)}.c2ln"


def test_the_system_namespace_equal_to_the_data_namespace_is_refused_naming_both_settings():
    refused = separation_refusal(Settings(namespace="kafka", system_namespace="kafka"))
    assert refused is not None
    assert "KOP_DEDUP_SYSTEM_NAMESPACE" in refused
    assert "KOP_DEDUP_NAMESPACE" in refused
    assert "public/kafka" in refused
    assert separation_refusal(Settings(namespace="kafka", system_namespace="kafka-sys")) is None


def test_a_runtime_whose_system_namespace_is_the_data_namespace_does_not_start():
    """Refused before any call to the broker (none answers here)."""
    settings = Settings(
        namespace="apps",
        system_namespace="apps",
        pulsar_admin_url="http://127.0.0.1:1",
        pulsar_service_url="pulsar://127.0.0.1:1",
    )

    async def start() -> None:
        runtime = Runtime(settings)
        try:
            await runtime.start()
        finally:
            await runtime.close()

    with pytest.raises(SystemNamespaceExposed, match="KOP_DEDUP_SYSTEM_NAMESPACE"):
        asyncio.run(start())


def test_the_tokens_role_is_its_claim_and_an_opaque_token_has_none():
    assert token_role(jwt_of({"sub": "kop-sidecar"})) == "kop-sidecar"
    assert token_role(jwt_of({"role": "r1"}), "role") == "r1"
    assert token_role(jwt_of({"sub": 7})) is None
    assert token_role("opaque-token") is None
    assert token_role("a.!!!.c") is None


@pytest.mark.parametrize(
    ("grants", "own", "foreign"),
    [
        ({"kop": ["produce", "consume"]}, "kop", {}),
        ({"kop": ["produce"], "root": ["consume"]}, "kop", {}),
        (
            {"kop": ["produce"], "app": ["consume", "produce"]},
            "kop",
            {"app": ["consume", "produce"]},
        ),
        ({"kop": ["produce"]}, None, {"kop": ["produce"]}),
        ({}, "kop", {}),
    ],
)
def test_grants_to_roles_other_than_the_sidecars_and_superusers_are_foreign(grants, own, foreign):
    assert foreign_grants(grants, own=own, superusers={"root"}) == foreign
