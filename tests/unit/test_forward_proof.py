"""A forwarded request is served as one only when a node of the cluster proves it sent it
(issue 36, item 9: ``x-kop-forwarded-by`` was trusted from any client)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kop_dedup import errors
from kop_dedup.cluster.peers import FORWARDED, Peers
from kop_dedup.cluster.proof import PROOF, WINDOW_S, prove, proved
from kop_dedup.security.identity import Authenticator
from kop_dedup.settings import Settings
from kop_dedup.transports.http.routing import forwarded
from tests.unit.asgi import unjoined_cluster

KEY = b"tok-nodes"
AUTH = "Bearer tok-alice"


def test_a_proof_holds_for_its_node_method_and_caller_only():
    value = prove(KEY, "1", "POST", AUTH, at_s=1_000)
    assert proved(KEY, "1", "post", AUTH, value, now_s=1_000)
    assert not proved(KEY, "2", "POST", AUTH, value, now_s=1_000)
    assert not proved(KEY, "1", "GET", AUTH, value, now_s=1_000)
    assert not proved(KEY, "1", "POST", "Bearer tok-bob", value, now_s=1_000)
    assert not proved(b"another key", "1", "POST", AUTH, value, now_s=1_000)


def test_a_proof_is_good_for_the_window_and_not_one_second_past_it():
    value = prove(KEY, "1", "POST", AUTH, at_s=10_000)
    assert proved(KEY, "1", "POST", AUTH, value, now_s=10_000 + WINDOW_S)
    assert proved(KEY, "1", "POST", AUTH, value, now_s=10_000 - WINDOW_S)
    assert not proved(KEY, "1", "POST", AUTH, value, now_s=10_000 + WINDOW_S + 1)
    assert not proved(KEY, "1", "POST", AUTH, value, now_s=10_000 - WINDOW_S - 1)


@pytest.mark.parametrize("value", ["", "x", "1000", "1000.", "-5.ab", "9" * 40 + ".ab", "1000.zz"])
def test_a_malformed_proof_proves_nothing(value):
    assert not proved(KEY, "1", "POST", AUTH, value, now_s=1_000)


def _peers(**kwargs: object) -> Peers:
    return Peers(me=1, token="tok-nodes", timeout_s=5, **kwargs)  # type: ignore[arg-type]


def test_a_node_that_authenticates_refuses_a_header_without_its_proof():
    peers = _peers(secret=KEY, authenticating=True)
    for proof in (None, "", prove(b"guess", "1", "POST", AUTH, 0)):
        with pytest.raises(errors.ClusterAuthorizationFailed, match=FORWARDED):
            peers.vouched("1", "POST", AUTH, proof)
    asyncio.run(peers.close())


def test_what_one_node_sends_another_of_its_cluster_vouches_for():
    sender, receiver = _peers(secret=KEY), _peers(secret=KEY, authenticating=True)
    headers = sender._forwarding("POST", AUTH)
    assert headers[FORWARDED] == "1"
    assert receiver.vouched(headers[FORWARDED], "POST", AUTH, headers[PROOF])
    with pytest.raises(errors.ClusterAuthorizationFailed):  # replayed for another caller
        receiver.vouched(headers[FORWARDED], "POST", "Bearer tok-mallory", headers[PROOF])
    for p in (sender, receiver):
        asyncio.run(p.close())


def test_without_authentication_the_header_is_taken_and_without_a_secret_ignored():
    assert _peers().vouched("1", "POST", "", None) is True
    assert _peers(authenticating=True).vouched("1", "POST", AUTH, None) is False


def _scope(*headers: tuple[bytes, bytes]) -> dict[str, object]:
    return {"type": "http", "method": "POST", "path": "/v1/end-txn", "headers": list(headers)}


def test_a_node_without_authentication_refuses_what_a_node_left_out_of_its_cluster_forwards():
    """A node of an earlier build with authentication forwards its clients unauthenticated
    and proves nothing; an open node of this build, which left it out of its cluster for
    authenticating differently, must not serve its forwards as its own clients'."""
    cluster = unjoined_cluster()
    runtime = SimpleNamespace(cluster=cluster, peers=_peers())  # authentication off
    assert forwarded(_scope((FORWARDED.encode(), b"2")), runtime) is True
    assert forwarded(_scope(), runtime) is False
    cluster.membership.excluded = frozenset({2})
    with pytest.raises(errors.ClusterAuthorizationFailed, match="node 2"):
        forwarded(_scope((FORWARDED.encode(), b"2")), runtime)
    assert forwarded(_scope((FORWARDED.encode(), b"3")), runtime) is True


def test_the_shared_secret_is_the_nodes_token_else_the_jwt_secret_key(tmp_path):
    def secret(**settings: object) -> bytes | None:
        s = Settings(**settings)
        return Authenticator.from_settings(s).cluster_secret(s)

    roles = tmp_path / "roles"
    roles.write_text("alice:tok-alice\nroot:tok-root\n")
    key = tmp_path / "secret.key"
    key.write_bytes(b"k" * 32)
    assert secret(auth_tokens=["b", "a"], auth_token_secret_key=f"file://{key}") == b"a"
    assert secret(auth_roles_file=roles, superuser_roles="root") == b"tok-root"
    assert secret(auth_roles_file=roles, auth_token_secret_key=f"file://{key}") == b"k" * 32
    assert secret(auth_roles_file=roles) is None
    assert secret() is None
