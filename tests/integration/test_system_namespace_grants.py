"""Who may write the system namespace, checked at start against the real broker's grants
(issue 36, item 8): grants to roles other than the sidecars' own and the superusers are
an ERROR naming the roles, or a refusal with KOP_DEDUP_SYSTEM_NAMESPACE_CHECK=refuse."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kop_dedup.runtime import Runtime
from kop_dedup.security.system_namespace import SystemNamespaceExposed, check_system_namespace
from kop_dedup.settings import Settings
from tests.helpers import delete_namespace, uniq
from tests.pulsar_grants import Grants
from tests.unit.test_system_namespace import jwt_of

pytestmark = pytest.mark.integration


@pytest.fixture
def system_ns(pulsar: Any) -> Iterator[tuple[str, Grants, httpx.Client]]:
    ns = uniq("sys")
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        admin.put(f"/admin/v2/namespaces/public/{ns}").raise_for_status()
        yield ns, Grants(admin, f"public/{ns}"), admin
    delete_namespace(pulsar.admin_url, f"public/{ns}")


def _check(pulsar: Any, ns: str, **extra: Any) -> None:
    settings = Settings(
        pulsar_service_url=pulsar.service_url,
        pulsar_admin_url=pulsar.admin_url,
        system_namespace=ns,
        pulsar_auth_token=jwt_of({"sub": "kop-nodes"}),
        superuser_roles="root",
        **extra,
    )

    async def check() -> None:
        runtime = Runtime(settings)
        try:
            await check_system_namespace(settings, runtime.admin)
        finally:
            await runtime.close()

    asyncio.run(check())


def test_a_grant_to_another_role_on_the_system_namespace_is_an_error_naming_it(
    pulsar: Any, system_ns: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ns, grants, _ = system_ns
    grants.grant("kop-nodes", ["produce", "consume"])
    grants.grant("root", ["consume"])
    with caplog.at_level(logging.ERROR):
        _check(pulsar, ns)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # only ours

    grants.grant("intruder", ["produce", "consume"])
    with caplog.at_level(logging.ERROR):
        _check(pulsar, ns)
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    message = error.getMessage()
    assert '"intruder": ["consume", "produce"]' in message, message
    assert '"root"' not in message
    assert f"revoke-permission public/{ns}" in message

    with pytest.raises(SystemNamespaceExposed, match="intruder"):
        _check(pulsar, ns, system_namespace_check="refuse")

    grants.revoke("intruder")
    _check(pulsar, ns, system_namespace_check="refuse")


def test_without_a_pulsar_token_the_grants_are_not_asked(pulsar: Any, system_ns: Any) -> None:
    """A broker without authentication lets anyone write anyway: nothing to check."""
    ns, grants, _ = system_ns
    grants.grant("intruder", ["produce"])
    settings = Settings(
        pulsar_service_url=pulsar.service_url,
        pulsar_admin_url=pulsar.admin_url,
        system_namespace=ns,
        system_namespace_check="refuse",
    )

    async def check() -> None:
        runtime = Runtime(settings)
        try:
            await check_system_namespace(settings, runtime.admin)
        finally:
            await runtime.close()

    asyncio.run(check())
