"""Who a token is (issue 30, item 1): the sidecar's tokens, the roles file, Pulsar JWTs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kop_dedup.security.identity import (
    ANONYMOUS,
    TOKENS_ROLE,
    Authenticator,
    Identity,
    read_key,
    roles_file,
)
from kop_dedup.settings import Settings

SECRET = b"k" * 32


def test_without_any_source_everyone_is_the_anonymous_superuser():
    auth = Authenticator.from_settings(Settings())
    assert not auth.enabled
    assert auth.authenticate("anything") == ANONYMOUS


def test_the_sidecar_tokens_are_a_superuser_role():
    auth = Authenticator.from_settings(Settings(auth_tokens=["t0"]))
    assert auth.authenticate("t0") == Identity(TOKENS_ROLE, superuser=True)
    assert auth.authenticate("t1") is None


def test_a_non_ascii_password_is_no_identity_not_an_error():
    auth = Authenticator.from_settings(Settings(auth_tokens=["t0"]))
    assert auth.authenticate("p\u00e4ss\udcff") is None


def _touch_later(path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_the_roles_file_names_roles_and_is_read_again_when_it_changes(tmp_path):
    roles = tmp_path / "roles"
    roles.write_text("# ops\nalice:ta\nroot:tr\nnot a line\n")
    auth = Authenticator.from_settings(Settings(auth_roles_file=roles, superuser_roles="root"))
    assert auth.authenticate("ta") == Identity("alice")
    assert auth.authenticate("tr") == Identity("root", superuser=True)
    roles.write_text("bob:ta\n")  # the same token, now bob's
    _touch_later(roles)
    assert auth.authenticate("ta") == Identity("bob")
    assert auth.authenticate("tr") is None
    roles.unlink()
    assert auth.authenticate("ta") is None


def test_a_token_removed_from_the_tokens_file_is_refused_without_a_restart(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("one\ntwo\n")
    auth = Authenticator.from_settings(Settings(auth_tokens_file=tokens))
    assert auth.authenticate("two") == Identity(TOKENS_ROLE, superuser=True)
    tokens.write_text("one\n")
    _touch_later(tokens)
    assert auth.authenticate("two") is None
    assert auth.authenticate("one") is not None


def test_roles_file_lines_split_at_the_first_colon():
    assert roles_file("a:b:c\n:x\ny:\n") == {"b:c": "a"}


@pytest.mark.parametrize("form", ["file", "data", "base64", "path"])
def test_a_pulsar_secret_key_is_read_in_every_form_pulsar_takes(tmp_path, form):
    path = tmp_path / "secret.key"
    path.write_bytes(SECRET)
    value = {
        "file": f"file://{path}",
        "data": "data:;base64," + base64.b64encode(SECRET).decode(),
        "base64": base64.b64encode(SECRET).decode(),
        "path": str(path),
    }[form]
    assert read_key(value) == SECRET


def test_an_hs256_jwt_authenticates_as_its_sub_claim_until_it_expires():
    auth = Authenticator.from_settings(
        Settings(auth_token_secret_key=base64.b64encode(SECRET).decode(), superuser_roles="admin")
    )
    assert auth.authenticate(jwt.encode({"sub": "alice"}, SECRET)) == Identity("alice")
    assert auth.authenticate(jwt.encode({"sub": "admin"}, SECRET)).superuser
    expired = jwt.encode({"sub": "alice", "exp": int(time.time()) - 10}, SECRET)
    assert auth.authenticate(expired) is None
    assert auth.authenticate(jwt.encode({"sub": "alice"}, b"x" * 32)) is None
    assert auth.authenticate(jwt.encode({"role": "alice"}, SECRET)) is None  # no sub


def test_an_rs256_jwt_verifies_with_pulsars_der_public_key_and_a_claim_setting(tmp_path):
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "public.key").write_bytes(der)
    auth = Authenticator.from_settings(
        Settings(auth_token_public_key=f"file://{tmp_path / 'public.key'}", auth_token_claim="role")
    )
    token = jwt.encode({"role": "alice"}, private, algorithm="RS256")
    assert auth.authenticate(token) == Identity("alice")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert auth.authenticate(jwt.encode({"role": "alice"}, other, algorithm="RS256")) is None
    # an HS256 token "signed" with the public key bytes is not accepted (alg confusion)
    assert auth.authenticate(_hs256({"role": "alice"}, der)) is None


def _hs256(claims: dict, key: bytes) -> str:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signed = part(b'{"alg":"HS256","typ":"JWT"}') + "." + part(json.dumps(claims).encode())
    return signed + "." + part(hmac.new(key, signed.encode(), hashlib.sha256).digest())


def test_a_login_from_the_roles_file_ends_when_its_line_goes_or_changes_role(tmp_path):
    roles = tmp_path / "roles"
    roles.write_text("alice:ta\nbob:tb\n")
    auth = Authenticator.from_settings(Settings(auth_roles_file=roles))
    alice, bob = auth.login("ta"), auth.login("tb")
    assert alice is not None
    assert bob is not None
    assert b"ta" not in repr(alice).encode()  # a digest is kept, never the token
    roles.write_text("# rewritten, alice's line kept\nalice:ta\nbob:tb\n")
    _touch_later(roles)
    assert auth.ended(alice) is None
    roles.write_text("bob:ta\n")  # alice's token is now bob's, bob's line is gone
    _touch_later(roles)
    assert auth.ended(alice) == "role alice's token is no longer in roles"
    assert auth.ended(bob) == "role bob's token is no longer in roles"
    now_bob = auth.login("ta")
    assert now_bob is not None
    assert auth.ended(now_bob) is None
    roles.unlink()
    assert auth.ended(now_bob) == "role bob's token is no longer in roles"


def test_a_jwt_login_ends_at_its_exp_and_a_static_token_never_ends():
    auth = Authenticator.from_settings(
        Settings(auth_tokens=["t0"], auth_token_secret_key=base64.b64encode(SECRET).decode())
    )
    exp = int(time.time()) + 60
    login = auth.login(jwt.encode({"sub": "carol", "exp": exp}, SECRET, algorithm="HS256"))
    assert login is not None
    assert login.expires_at == exp
    assert auth.ended(login, now=exp - 1) is None
    assert auth.ended(login, now=exp) is not None
    assert "carol's token expired" in (auth.ended(login, now=exp) or "")
    forever = auth.login(jwt.encode({"sub": "dave"}, SECRET, algorithm="HS256"))
    assert forever is not None
    assert auth.ended(forever, now=exp + 10**9) is None
    static = auth.login("t0")
    assert static is not None
    assert auth.ended(static, now=exp + 10**9) is None
