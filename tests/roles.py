"""A sidecar that authenticates its callers with a roles file, for the tests of roles,
permissions and quotas, and a Kafka connection logged in as one role::

    @pytest.fixture(scope="module")
    def sc(pulsar, tmp_path_factory):
        with roles_sidecar(pulsar, tmp_path_factory, "quota", max_groups=4) as s:
            yield s                       # alice, bob and root (the superuser) log in

    @pytest.fixture(scope="module")
    def env(pulsar, tmp_path_factory):
        with kafka_roles(pulsar, tmp_path_factory, "ksec") as e:
            e.grant("alice", ["produce", "consume"])   # Pulsar's permissions
            yield e                                    # e.conf("tok-alice"): librdkafka's

    client, code, message = sasl_login(sc.kafka_bootstrap, "tok-bob")   # 0, or why not
    alice = logged_in(sc.kafka_bootstrap, "tok-alice")                 # asserted 0

Each sidecar gets a data namespace of its own (``public/<prefix>-...``, deleted after)
and a system namespace of its own (no other sidecar of the session joins its cluster).
Pulsar's grants on the namespace are :mod:`tests.pulsar_grants`'.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from tests.helpers import delete_namespace, uniq
from tests.kafka_wire import WireClient
from tests.pulsar_grants import KafkaRoles
from tests.sidecar import ThreadSidecar

__all__ = ["ROLES", "kafka_roles", "logged_in", "roles_sidecar", "sasl_login"]

ROLES = "alice:tok-alice\nbob:tok-bob\nroot:tok-root\n"
"""The roles file (``role:token`` lines): alice, bob, and root, the superuser."""


@contextmanager
def roles_sidecar(
    pulsar: Any,
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    *,
    roles: str = ROLES,
    **settings: Any,
) -> Iterator[ThreadSidecar]:
    """A sidecar authenticating with ``roles`` (root its superuser) on a fresh data
    namespace named after ``prefix``, with ``settings`` besides; the namespace is
    deleted after it stops."""
    path = tmp_path_factory.mktemp(f"{prefix}-roles") / "roles"
    path.write_text(roles)
    namespace = uniq(prefix)
    with ThreadSidecar(
        pulsar,
        namespace=namespace,
        system_namespace=uniq("sys"),
        auth_roles_file=path,
        superuser_roles="root",
        **settings,
    ) as sc:
        yield sc
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


@contextmanager
def kafka_roles(
    pulsar: Any, tmp_path_factory: pytest.TempPathFactory, prefix: str, **settings: Any
) -> Iterator[KafkaRoles]:
    """:func:`roles_sidecar` (``settings`` as it takes them, ``roles`` included), with
    the grants of its data namespace and its Kafka clients' logins
    (:class:`tests.pulsar_grants.KafkaRoles`)."""
    with (
        httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin,
        roles_sidecar(pulsar, tmp_path_factory, prefix, **settings) as sc,
    ):
        yield KafkaRoles(sc, f"public/{sc.settings.namespace}", admin)


def sasl_login(bootstrap: str, token: str) -> tuple[WireClient, int, str | None]:
    """A Kafka connection that logged in with ``token`` (SASL/PLAIN, the token as the
    password): the connection, and SaslAuthenticate's error code and message."""
    c = WireClient(bootstrap)
    assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
    auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0u\0" + token.encode()), 1)
    return c, auth.error_code, auth.error_message


def logged_in(bootstrap: str, token: str) -> WireClient:
    """A Kafka connection logged in with ``token``; the login must succeed."""
    c, code, message = sasl_login(bootstrap, token)
    assert code == 0, message
    return c
