"""What a node's authentication is, in a form its peers can compare without seeing it.

Every node of a cluster advertises its fingerprint in its membership record
(:mod:`kop_dedup.cluster.members`); a node whose fingerprint differs from another
member's is refused at join, and a running node leaves such a member out of placement,
so that no node ever forwards a client's request to one that would authenticate it
differently (a node without authentication serves anyone as a superuser).

The fingerprint names each setting that decides who a token is, one field each:

- ``auth``: ``on`` or ``off`` (any source configured);
- ``tokens``, ``secretKey``, ``publicKey``: a digest of the material (PBKDF2 over a
  fixed salt for the secrets, so that a weak token cannot be looked up from the
  digest, which anyone who may read the system namespace's stats can read);
- ``tokensFile``, ``rolesFile``: ``set`` or ``-``. Their content is re-read while the
  node runs (a removed line is refused at the next request), so it is not compared:
  keep the files the same on every node (one mounted Secret);
- ``claim``, ``superusers``: a digest of the setting.

``-`` is a setting left unset. The secret itself never appears.

>>> mine = fingerprint(Settings(auth_roles_file="/etc/roles"))
>>> differences(mine, fingerprint(Settings()), "node 1")
['authentication is on here and off on node 1',
 'KOP_DEDUP_AUTH_ROLES_FILE is set here, not on node 1']
"""

from __future__ import annotations

import hashlib

from kop_dedup.security.identity import read_key
from kop_dedup.settings import Settings

__all__ = ["UNSET", "differences", "fingerprint", "parse"]

UNSET = "-"
_VERSION = "v1"
_SALT = b"kop-dedup security fingerprint v1"
_ROUNDS = 100_000
_SETTINGS = {
    "tokens": "KOP_DEDUP_AUTH_TOKENS",
    "tokensFile": "KOP_DEDUP_AUTH_TOKENS_FILE",
    "rolesFile": "KOP_DEDUP_AUTH_ROLES_FILE",
    "secretKey": "KOP_DEDUP_AUTH_TOKEN_SECRET_KEY",
    "publicKey": "KOP_DEDUP_AUTH_TOKEN_PUBLIC_KEY (or _PUBLIC_ALG)",
    "claim": "KOP_DEDUP_AUTH_TOKEN_CLAIM",
    "superusers": "KOP_DEDUP_SUPERUSER_ROLES",
}


def _secret(material: bytes | None) -> str:
    if material is None:
        return UNSET
    return hashlib.pbkdf2_hmac("sha256", material, _SALT, _ROUNDS)[:8].hex()


def _plain(value: str | None) -> str:
    if value is None:
        return UNSET
    return hashlib.blake2b(value.encode(), digest_size=8, person=b"kop-dedup-fp").hexdigest()


def fingerprint(settings: Settings) -> str:
    """This node's fingerprint (see the module): ``v1;auth=on;tokens=...;...``."""
    tokens = sorted(t.get_secret_value() for t in settings.auth_tokens)
    secret = settings.auth_token_secret_key
    public = settings.auth_token_public_key
    keys = secret is not None or bool(public)
    fields = {
        "auth": "on"
        if tokens or settings.auth_tokens_file or settings.auth_roles_file or keys
        else "off",
        "tokens": _secret("\n".join(tokens).encode()) if tokens else UNSET,
        "tokensFile": "set" if settings.auth_tokens_file is not None else UNSET,
        "rolesFile": "set" if settings.auth_roles_file is not None else UNSET,
        "secretKey": _secret(read_key(secret.get_secret_value())) if secret else UNSET,
        "publicKey": (
            _secret(settings.auth_token_public_alg.encode() + b"\0" + read_key(public))
            if public
            else UNSET
        ),
        "claim": _plain(settings.auth_token_claim) if keys else UNSET,
        "superusers": _plain(
            ",".join(sorted({r.strip() for r in settings.superuser_roles.split(",") if r.strip()}))
            or None
        ),
    }
    return ";".join([_VERSION, *(f"{k}={v}" for k, v in fields.items())])


def parse(text: str) -> dict[str, str] | None:
    """The fields of a fingerprint; None for one of another version (or none at all)."""
    version, _, rest = text.partition(";")
    if version != _VERSION:
        return None
    fields = dict(part.partition("=")[::2] for part in rest.split(";") if part)
    return fields if "auth" in fields else None


def differences(mine: str, theirs: str, there: str = "the other node") -> list[str]:
    """What differs between two fingerprints, one line per setting, naming the setting
    (never its value); empty when they agree. ``there`` names the other node."""
    here, other = parse(mine), parse(theirs)
    if here is None or other is None:
        if mine == theirs:
            return []
        return [f"{there} advertises no security fingerprint of this version (an older build?)"]
    out = []
    if here["auth"] != other.get("auth"):
        out.append(f"authentication is {here['auth']} here and {other.get('auth')} on {there}")
    for key, setting in _SETTINGS.items():
        a, b = here.get(key, UNSET), other.get(key, UNSET)
        if a == b:
            continue
        if b == UNSET:
            out.append(f"{setting} is set here, not on {there}")
        elif a == UNSET:
            out.append(f"{setting} is not set here, but is on {there}")
        else:
            out.append(f"{setting} differs from {there}'s")
    return out
