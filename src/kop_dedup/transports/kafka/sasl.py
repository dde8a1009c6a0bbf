"""SASL/PLAIN: SaslHandshake and SaslAuthenticate, a token as the password.

When authentication is on (tokens, a roles file or JWT keys: the HTTP ones, see
:mod:`kop_dedup.security.identity`) a connection must authenticate before any request
other than ApiVersions and the SASL ones; the user name may be anything, the password
must be a token, and the token's role is the connection's identity. As Kafka's
``SaslServerAuthenticator``: an unknown mechanism answers UNSUPPORTED_SASL_MECHANISM,
wrong credentials SASL_AUTHENTICATION_FAILED with a message, and both then close the
connection, the close delayed by ``KAFKA_FAILED_AUTH_DELAY_MS`` (Kafka's 100 ms); a
request before authentication closes the connection undecoded and unanswered (the
connection does that, as Kafka's ``SaslServerAuthenticator``), so a client without SASL
fails at once instead of hanging. A password is compared as bytes (any bytes are just a
wrong password). Without tokens both APIs answer ILLEGAL_SASL_STATE,
as Kafka does on a listener without SASL. SaslHandshake v0 is followed by a bare
token (no request header), answered with a bare (empty) token.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kop_dedup import errors
from kop_dedup.transports.kafka.registry import Api, CloseConnection, Session

__all__ = ["APIS", "MECHANISMS", "ROLE_COUNTED", "raw_token"]

log = logging.getLogger("kop_dedup.kafka")

MECHANISMS = ("PLAIN",)
ROLE_COUNTED = "sasl.role_counted"
"""The session's ``extra`` key naming the role its connection is counted for (the
listener releases it when the connection closes)."""


def _check_plain(session: Session, token: bytes) -> str:
    """The user name of a valid PLAIN token (``authzid NUL user NUL password``), the
    session's identity set to the password's; SaslAuthenticationFailed otherwise."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        raise errors.SaslAuthenticationFailed(
            "Authentication failed: invalid SASL/PLAIN response: expected 3 tokens"
        )
    authzid, user = (p.decode("utf-8", "replace") for p in parts[:2])
    # any bytes at all are just a wrong password, no error (surrogateescape keeps them
    # exact: authenticate() compares the bytes)
    password = parts[2].decode("utf-8", "surrogateescape")
    if not user:
        raise errors.SaslAuthenticationFailed("Authentication failed: username not specified")
    if authzid and authzid != user:
        raise errors.SaslAuthenticationFailed(
            "Authentication failed: Client requested an authorization id that is different "
            "from username"
        )
    credential = session.shared.auth.login(password)
    if credential is None:
        raise errors.SaslAuthenticationFailed("Authentication failed: Invalid username or password")
    session.identity, session.credential = credential.identity, credential
    return user


def _authenticated(session: Session, user: str) -> None:
    """The connection is ``user``'s, counted against its role's share of connections
    (a superuser's is not): 89 THROTTLING_QUOTA_EXCEEDED past it."""
    who = session.identity
    if not who.superuser and session.shared.role_connections.acquire(who.role):
        session.extra[ROLE_COUNTED] = who.role
    session.authenticated, session.user = True, user
    log.debug("kafka client authenticated", extra={"peer": session.peer, "user": user})


# -- SaslHandshake ------------------------------------------------------------------------


def _handshake_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return SaslHandshakeResponse(version=version, error_code=error.errno, mechanisms=[])


async def handshake(session: Session, request: Any, version: int) -> Any:
    if not session.auth_required:
        return _handshake_error(request, version, errors.IllegalSaslState())
    if session.authenticated or session.mechanism is not None:
        raise CloseConnection(
            "a second SaslHandshake on one connection (re-authentication is not offered)",
            kind="auth",
            answer=_handshake_error(request, version, errors.IllegalSaslState()),
        )
    if request.mechanism not in MECHANISMS:
        raise CloseConnection(
            f"SASL mechanism {request.mechanism!r} is not offered (only PLAIN)",
            kind="auth",
            answer=SaslHandshakeResponse(
                version=version,
                error_code=errors.UnsupportedSaslMechanism.errno,
                mechanisms=list(MECHANISMS),
            ),
        )
    session.mechanism = request.mechanism
    session.raw_sasl = version == 0
    return SaslHandshakeResponse(
        version=version, error_code=errors.NONE_ERRNO, mechanisms=list(MECHANISMS)
    )


# -- SaslAuthenticate ---------------------------------------------------------------------


def _authenticate_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return SaslAuthenticateResponse(
        version=version, error_code=error.errno, error_message=error.message, auth_bytes=b""
    )


async def authenticate(session: Session, request: Any, version: int) -> Any:
    if not session.auth_required:
        return _authenticate_error(
            request, version, errors.IllegalSaslState("SASL is off on this listener")
        )
    if session.mechanism is None or session.authenticated:
        raise CloseConnection(
            "SaslAuthenticate without a SaslHandshake first",
            kind="auth",
            answer=_authenticate_error(
                request, version, errors.IllegalSaslState("SaslHandshake first")
            ),
        )
    try:
        user = _check_plain(session, bytes(request.auth_bytes))
        _authenticated(session, user)
    except (errors.SaslAuthenticationFailed, errors.ThrottlingQuotaExceeded) as exc:
        raise CloseConnection(
            exc.message, kind="auth", answer=_authenticate_error(request, version, exc)
        ) from exc
    return SaslAuthenticateResponse(
        version=version,
        error_code=errors.NONE_ERRNO,
        error_message=None,
        auth_bytes=b"",
        session_lifetime_ms=0,
    )


async def raw_token(session: Session, token: bytes) -> bytes:
    """The answer to the bare token after SaslHandshake v0 (Kafka 0.10 framing)."""
    session.raw_sasl = False
    try:
        user = _check_plain(session, token)
        _authenticated(session, user)
    except (errors.SaslAuthenticationFailed, errors.ThrottlingQuotaExceeded) as exc:
        raise CloseConnection(exc.message, kind="auth") from exc
    return b""


APIS = (
    Api(
        key=17,
        name="SaslHandshake",
        request=SaslHandshakeRequest,
        versions=(0, 1),
        handle=handshake,
        error_answer=_handshake_error,
        before_auth=True,
    ),
    Api(
        key=36,
        name="SaslAuthenticate",
        request=SaslAuthenticateRequest,
        versions=(0, 2),
        handle=authenticate,
        error_answer=_authenticate_error,
        before_auth=True,
    ),
)
