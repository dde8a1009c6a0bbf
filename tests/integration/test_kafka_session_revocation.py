"""An open Kafka session ends with its credential (issue 36, item 6).

A connection authenticated with a roles-file line or a JWT is checked again at each
request: once the line is removed (the file re-read on change) or the JWT's ``exp`` has
passed, the next request closes the connection unanswered, as Pulsar closes a connection
whose credential expired (``authenticationRefreshCheckSeconds``) and as Kafka closes a
session that outlived its lifetime (KIP-368). Reconnecting with the same password fails
authentication with a message.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from tests.helpers import uniq
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

SECRET = b"s" * 32


class Env:
    def __init__(self, sc: ThreadSidecar, roles: Path) -> None:
        self.sc, self.roles = sc, roles


@pytest.fixture(scope="module")
def env(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    d = tmp_path_factory.mktemp("revoke")
    roles, secret = d / "roles", d / "secret.key"
    roles.write_text("alice:tok-alice\nbob:tok-bob\n")
    secret.write_bytes(SECRET)
    with ThreadSidecar(
        pulsar,
        system_namespace=uniq("sys"),
        auth_roles_file=roles,
        auth_token_secret_key=f"file://{secret}",
    ) as sc:
        yield Env(sc, roles)


def _login(env: Env, password: str) -> tuple[WireClient, int, str | None]:
    c = WireClient(env.sc.kafka_bootstrap, timeout=10)
    assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
    auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0u\0" + password.encode()), 1)
    return c, auth.error_code, auth.error_message


def _metadata(c: WireClient) -> None:
    answer = c.call(MetadataRequest[1](topics=[]), 1)
    assert answer.brokers, answer


def _rewrite(path: Path, text: str) -> None:
    st = path.stat()
    path.write_text(text)
    # a later modification time even on a coarse clock: the file is seen to change
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_session_whose_roles_line_is_removed_is_closed_at_its_next_request(env):
    alice, code, _ = _login(env, "tok-alice")
    bob, bob_code, _ = _login(env, "tok-bob")
    with alice, bob:
        assert (code, bob_code) == (0, 0)
        _metadata(alice)
        _rewrite(env.roles, "bob:tok-bob\n")
        try:
            alice.send(MetadataRequest[1](topics=[]), 1)
            assert alice.closed_by_peer(5), "alice's request was answered after revocation"
            _metadata(bob)  # bob's line stayed: his session goes on
        finally:
            _rewrite(env.roles, "alice:tok-alice\nbob:tok-bob\n")
    _rewrite(env.roles, "bob:tok-bob\n")
    try:
        again, code, message = _login(env, "tok-alice")
        with again:
            assert code == 58, (code, message)  # SASL_AUTHENTICATION_FAILED
    finally:
        _rewrite(env.roles, "alice:tok-alice\nbob:tok-bob\n")


def test_a_session_is_closed_at_its_first_request_after_the_jwt_expires(env):
    expires = int(time.time()) + 3
    token = jwt.encode({"sub": "carol", "exp": expires}, SECRET, algorithm="HS256")
    lasting = jwt.encode({"sub": "dave", "exp": expires + 3600}, SECRET, algorithm="HS256")
    carol, code, message = _login(env, token)
    dave, dave_code, _ = _login(env, lasting)
    with carol, dave:
        assert (code, dave_code) == (0, 0), message
        _metadata(carol)
        while time.time() < expires + 1:  # the JWT's exp is whole seconds
            time.sleep(0.2)
        carol.send(MetadataRequest[1](topics=[]), 1)
        assert carol.closed_by_peer(5), "a request was answered after the JWT expired"
        _metadata(dave)
