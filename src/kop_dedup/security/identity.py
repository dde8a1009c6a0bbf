"""Who a token is: the role a bearer token or a SASL/PLAIN password names.

Three sources, asked in this order, as configured (docs/operations/security.md):

- ``auth_tokens`` (and ``auth_tokens_file``, re-read when it changes): the sidecar's
  own tokens, which act as the superuser role :data:`TOKENS_ROLE` (authentication
  only, as before roles);
- ``auth_roles_file``: ``role:token`` lines, re-read when the file changes (its
  modification time or size), so a removed line is refused at the next request;
- Pulsar JWTs, verified as Pulsar's ``AuthenticationProviderToken`` does: HS256 with
  ``auth_token_secret_key``, or ``auth_token_public_alg`` with ``auth_token_public_key``;
  the role is the ``auth_token_claim`` claim (``sub``); an expired token is refused.

>>> auth = Authenticator.from_settings(Settings(auth_tokens=["t"]))
>>> auth.authenticate("t")
Identity(role='~auth-tokens', superuser=True)

With none configured, :attr:`Authenticator.enabled` is False and every request is
let in as :data:`ANONYMOUS`, a superuser (the sidecar as it was before tokens).

A session that outlives one request (a Kafka connection) keeps the :class:`Credential`
:meth:`Authenticator.login` gave it and asks :meth:`Authenticator.ended` at each request:
a JWT past its ``exp``, or a file line removed or given to another role, ends it (as
Pulsar's ``authenticationRefreshCheckSeconds`` ends a connection). The credential keeps
a digest of the token, never the token.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import logging
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from kop_dedup.settings import Settings

__all__ = [
    "ANONYMOUS",
    "TOKENS_ROLE",
    "Authenticator",
    "Credential",
    "Identity",
    "read_key",
    "roles_file",
    "tokens_file",
]

log = logging.getLogger(__name__)

TOKENS_ROLE = "~auth-tokens"
"""The role of the ``auth_tokens``: a superuser (a name no Pulsar grant uses)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: its role, and whether it may do everything."""

    role: str
    superuser: bool = False


ANONYMOUS = Identity("~anonymous", superuser=True)
"""Everyone, when authentication is off."""


@dataclass(frozen=True, slots=True)
class Credential:
    """What a session proved at login, to be checked again while it lasts."""

    identity: Identity
    expires_at: float | None = None
    """A JWT's ``exp`` (seconds since the epoch); None: does not expire."""
    source: int | None = None
    """The index of the watched file the token came from; None: a static token or a JWT."""
    digest: bytes = b""
    """SHA-256 of the token, to find it again when its file changes."""
    generation: int = 0
    """The file's read generation at login."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def read_key(value: str) -> bytes:
    """Key bytes from a Pulsar-style key setting: ``file:///path``, ``data:;base64,...``,
    a path that exists, or the key itself in base64 (Pulsar's
    ``AuthTokenUtils.readKeyFromUrl``)."""
    if value.startswith("data:"):
        _, _, data = value.partition(",")
        if ";base64" in value.split(",", 1)[0]:
            return base64.b64decode(data)
        return urllib.parse.unquote_to_bytes(data)
    if value.startswith("file:"):
        return Path(urllib.parse.urlparse(value).path).read_bytes()
    try:
        is_file = Path(value).is_file()
    except OSError:  # a base64 key longer than a file name may be
        is_file = False
    if is_file:
        return Path(value).read_bytes()
    return base64.b64decode(value)


def _public_key(data: bytes) -> Any:
    """A public key object from DER (Pulsar writes raw DER) or PEM."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    if data.lstrip().startswith(b"-----BEGIN"):
        return serialization.load_pem_public_key(data)
    return serialization.load_der_public_key(data)


def roles_file(text: str) -> dict[str, str]:
    """token -> role from ``role:token`` lines (blank lines and ``#`` comments skipped).

    >>> roles_file("# ops\\nalice:s3cret\\nbob:t:with:colons\\n")
    {'s3cret': 'alice', 't:with:colons': 'bob'}
    """
    tokens: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        role, sep, token = line.partition(":")
        if not sep or not role.strip() or not token.strip():
            log.warning("auth_roles_file line %d is not role:token: skipped", number)
            continue
        tokens[token.strip()] = role.strip()
    return tokens


def tokens_file(text: str) -> dict[str, str]:
    """token -> :data:`TOKENS_ROLE` from ``auth_tokens_file`` (one token a line)."""
    return {
        line.strip(): TOKENS_ROLE
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    }


class _WatchedFile:
    """A token file, read again when its modification time or size changes (so a
    removed token is refused at the next request, without a restart)."""

    def __init__(self, path: Path, parse: Callable[[str], dict[str, str]]) -> None:
        self._path, self._parse = path, parse
        self._seen: tuple[int, int] | None = None
        self._tokens: dict[str, str] = {}
        self._roles: dict[bytes, str] = {}
        self.generation = 0
        """Incremented at each read (or loss) of the file."""

    @property
    def path(self) -> Path:
        return self._path

    def role_of(self, digest: bytes) -> str | None:
        """The role the token with this SHA-256 names in the file now (read again if it
        changed); None when no line has it."""
        self.tokens()
        return self._roles.get(digest)

    def tokens(self) -> dict[str, str]:
        """token -> role, as the file says now."""
        try:
            st = self._path.stat()
        except OSError:
            if self._seen is not None:
                log.warning("%s is gone: none of its tokens is accepted", self._path)
                self.generation += 1
            self._seen, self._tokens, self._roles = None, {}, {}
            return self._tokens
        seen = (st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            self._tokens = self._parse(self._path.read_text(encoding="utf-8"))
            self._roles = {_digest(token): role for token, role in self._tokens.items()}
            self._seen = seen
            self.generation += 1
            log.info("%s read: %d tokens", self._path, len(self._tokens))
        return self._tokens


class Authenticator:
    """Token -> :class:`Identity`, from the settings' sources (see the module)."""

    def __init__(
        self,
        *,
        tokens: frozenset[str] = frozenset(),
        tokens_path: Path | None = None,
        roles: Path | None = None,
        secret_key: bytes | None = None,
        public_key: bytes | None = None,
        public_alg: str = "RS256",
        claim: str = "sub",
        superusers: frozenset[str] = frozenset(),
    ) -> None:
        self._tokens = tuple(t.encode() for t in tokens)
        self._files = [
            _WatchedFile(path, parse)
            for path, parse in ((tokens_path, tokens_file), (roles, roles_file))
            if path is not None
        ]
        self._keys: list[tuple[Any, list[str]]] = []
        self._secret_key = secret_key
        if secret_key is not None:
            self._keys.append((secret_key, ["HS256", "HS384", "HS512"]))
        if public_key is not None:
            self._keys.append((_public_key(public_key), [public_alg]))
        self._claim = claim
        self.superusers = superusers
        self.enabled = bool(tokens) or bool(self._files) or bool(self._keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        secret = settings.auth_token_secret_key
        return cls(
            tokens=frozenset(t.get_secret_value() for t in settings.auth_tokens),
            tokens_path=settings.auth_tokens_file,
            roles=settings.auth_roles_file,
            secret_key=read_key(secret.get_secret_value()) if secret is not None else None,
            public_key=(
                read_key(settings.auth_token_public_key) if settings.auth_token_public_key else None
            ),
            public_alg=settings.auth_token_public_alg,
            claim=settings.auth_token_claim,
            superusers=frozenset(
                r.strip() for r in settings.superuser_roles.split(",") if r.strip()
            ),
        )

    def identity(self, role: str) -> Identity:
        return Identity(role, superuser=role == TOKENS_ROLE or role in self.superusers)

    def authenticate(self, token: str) -> Identity | None:
        """The identity ``token`` proves; None when it proves none."""
        credential = self.login(token)
        return None if credential is None else credential.identity

    def login(self, token: str) -> Credential | None:
        """What ``token`` proves, kept by a session to ask :meth:`ended` later; None
        when it proves nothing."""
        if not self.enabled:
            return Credential(ANONYMOUS)
        presented = token.encode("utf-8", "surrogateescape")
        if any(hmac.compare_digest(presented, t) for t in self._tokens):
            return Credential(self.identity(TOKENS_ROLE))
        for index, watched in enumerate(self._files):
            role = None
            for known, named in watched.tokens().items():
                if hmac.compare_digest(presented, known.encode()):
                    role = named
            if role is not None:
                return Credential(
                    self.identity(role),
                    source=index,
                    digest=_digest(token),
                    generation=watched.generation,
                )
        if self._keys and token.count(".") == 2:
            return self._jwt(token)
        return None

    def ended(self, credential: Credential, now: float | None = None) -> str | None:
        """Why ``credential`` no longer holds (for the log and the close), or None
        while it does: a JWT at or past its ``exp``, a file line removed or given to
        another role (the file read again when it changed)."""
        expires = credential.expires_at
        if expires is not None and (time.time() if now is None else now) >= expires:
            at = dt.datetime.fromtimestamp(expires, dt.UTC).isoformat()
            return f"role {credential.identity.role}'s token expired at {at}"
        if credential.source is None:
            return None
        watched = self._files[credential.source]
        watched.tokens()
        if watched.generation == credential.generation:
            return None
        role = watched.role_of(credential.digest)
        if role == credential.identity.role:
            return None
        return f"role {credential.identity.role}'s token is no longer in {watched.path.name}"

    def _jwt(self, token: str) -> Credential | None:
        for key, algorithms in self._keys:
            try:
                claims = jwt.decode(
                    token, key, algorithms=algorithms, options={"require": [self._claim]}
                )
            except jwt.PyJWTError:
                continue
            role = claims.get(self._claim)
            if isinstance(role, str) and role:
                exp = claims.get("exp")  # PyJWT checked it is a number, when present
                expires = float(exp) if isinstance(exp, int | float) else None
                return Credential(self.identity(role), expires_at=expires)
        return None

    def peer_token(self, settings: Settings) -> str | None:
        """The token nodes of one cluster call each other with: a superuser's (the
        first ``auth_tokens`` one, else a superuser role's line of the roles file)."""
        tokens = sorted(settings.http_tokens())
        if tokens:
            return tokens[0]
        for watched in self._files:
            for token, role in sorted(watched.tokens().items()):
                if role in self.superusers:
                    return token
        return None

    def cluster_secret(self, settings: Settings) -> bytes | None:
        """The secret every node of a cluster shares, keying the proofs of forwarded
        requests (:mod:`kop_dedup.cluster.proof`): the :meth:`peer_token`, else the JWT
        secret key; None without either (public-key JWTs only, or authentication off)."""
        token = self.peer_token(settings)
        if token is not None:
            return token.encode("utf-8")
        return self._secret_key
