"""Nodes of a cluster compare their authentication by fingerprint (issue 36): what
differs is named by its setting, the secret itself never appears."""

from __future__ import annotations

import base64

from kop_dedup.security.fingerprint import differences, fingerprint, parse
from kop_dedup.settings import Settings

KEY = b"0123456789abcdef0123456789abcdef"


def _fp(**settings: object) -> str:
    return fingerprint(Settings(**settings))


def test_nodes_with_the_same_settings_agree_whatever_the_order_of_their_tokens():
    a = _fp(auth_tokens=["one", "two"], superuser_roles="root, ops")
    b = _fp(auth_tokens=["two", "one"], superuser_roles="ops,root")
    assert a == b
    assert differences(a, b) == []


def test_a_node_without_authentication_differs_from_one_with_a_roles_file(tmp_path):
    roles = _fp(auth_roles_file=tmp_path / "roles")
    open_ = _fp()
    assert parse(open_) is not None
    assert parse(open_)["auth"] == "off"
    assert differences(roles, open_, "node 1") == [
        "authentication is on here and off on node 1",
        "KOP_DEDUP_AUTH_ROLES_FILE is set here, not on node 1",
    ]
    assert differences(open_, roles, "node 2") == [
        "authentication is off here and on on node 2",
        "KOP_DEDUP_AUTH_ROLES_FILE is not set here, but is on node 2",
    ]


def test_a_roles_file_at_another_path_is_the_same_setting(tmp_path):
    """Its content is re-read while a node runs, so only its presence is compared."""
    assert _fp(auth_roles_file=tmp_path / "a") == _fp(auth_roles_file="/etc/kop/roles")


def test_another_secret_key_or_token_is_named_and_never_shown():
    a = _fp(auth_token_secret_key=base64.b64encode(KEY).decode(), auth_tokens=["tok-nodes"])
    b = _fp(auth_token_secret_key=base64.b64encode(KEY[::-1]).decode(), auth_tokens=["tok-x"])
    assert differences(a, b, "node 3") == [
        "KOP_DEDUP_AUTH_TOKENS differs from node 3's",
        "KOP_DEDUP_AUTH_TOKEN_SECRET_KEY differs from node 3's",
    ]
    for secret in (KEY.decode(), KEY.hex(), base64.b64encode(KEY).decode(), "tok-nodes"):
        assert secret not in a


def test_a_node_of_an_older_build_advertises_none_and_differs():
    mine = _fp(auth_tokens=["t"])
    assert differences(mine, "", "node 4") == [
        "node 4 advertises no security fingerprint of this version (an older build?)"
    ]
    assert differences("", "") == []


def test_superuser_roles_and_the_claim_count():
    assert differences(_fp(superuser_roles="root"), _fp(superuser_roles="admin"), "n") == [
        "KOP_DEDUP_SUPERUSER_ROLES differs from n's"
    ]
    key = base64.b64encode(KEY).decode()
    a = _fp(auth_token_secret_key=key)
    b = _fp(auth_token_secret_key=key, auth_token_claim="role")
    assert differences(a, b, "n") == ["KOP_DEDUP_AUTH_TOKEN_CLAIM differs from n's"]
