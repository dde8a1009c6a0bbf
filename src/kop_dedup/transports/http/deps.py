"""Dependencies: the runtime, the caller's identity (bearer-token authentication).

All are ``async def``: FastAPI runs plain ``def`` dependencies in a worker
thread, a thread hand-off per request that showed up in the profile.
``authenticated`` is the token check itself, shared with the produce endpoint
(which runs without FastAPI's dependency resolution, see produce.py). A route that
authorizes takes :data:`CallerDep` (the :class:`~kop_dedup.security.identity.Identity`);
an authorization failure it raises (29, 30, 53) is answered 403 by the app's handler
(:func:`forbidden`), with the Kafka code in the body.
"""

from __future__ import annotations

from typing import Annotated, NamedTuple

from fastapi import Depends, HTTPException, Request, status
from fastapi.responses import JSONResponse
from starlette.types import Scope

from kop_dedup import errors
from kop_dedup.runtime import Runtime
from kop_dedup.security.authorizer import OPEN, Access
from kop_dedup.security.identity import ANONYMOUS, Authenticator, Identity

__all__ = [
    "AUTHORIZATION_ERRORS",
    "STARTING",
    "AccessDep",
    "Authorized",
    "CallerDep",
    "OwnsGroup",
    "Refusal",
    "RuntimeDep",
    "Superuser",
    "authenticated",
    "authenticated_scope",
    "forbidden",
    "not_allowed",
    "refused_with",
]

AUTHORIZATION_ERRORS = (
    errors.TopicAuthorizationFailed,
    errors.GroupAuthorizationFailed,
    errors.ClusterAuthorizationFailed,
    errors.TransactionalIdAuthorizationFailed,
)

STARTING = "the sidecar is starting"
"""The 503's detail while the runtime is not up yet."""


class Refusal(NamedTuple):
    """Why a request is not let in: status, detail and headers of its answer."""

    status: int
    detail: str
    headers: dict[str, str]


def authenticated(auth: Authenticator, authorization: str) -> Identity | Refusal:
    """The caller's identity, or why it is refused: when authentication is on, demand
    ``Authorization: Bearer <token>`` (``authorization`` is the header's value, "" when
    absent) naming a known token."""
    if not auth.enabled:
        return ANONYMOUS
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return Refusal(
            status.HTTP_401_UNAUTHORIZED, "missing bearer token", {"WWW-Authenticate": "Bearer"}
        )
    who = auth.authenticate(presented.strip())
    if who is None:
        return Refusal(
            status.HTTP_403_FORBIDDEN,
            "bearer token not accepted",
            {"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return who


def authenticated_scope(auth: Authenticator, scope: Scope) -> Identity | JSONResponse:
    """:func:`authenticated` for an ASGI request, by its ``Authorization`` header, before
    any of its body is read: the caller's identity, or the answer that refuses it (401,
    403; what :func:`require_token` raises)."""
    if not auth.enabled:
        return ANONYMOUS
    authorization = ""
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
            break
    checked = authenticated(auth, authorization)
    if isinstance(checked, Refusal):
        return JSONResponse({"detail": checked.detail}, checked.status, headers=checked.headers)
    return checked


def forbidden(error: errors.KafkaError) -> JSONResponse:
    """403 for an authorization failure, in the house shape of a Kafka answer."""
    return JSONResponse(
        {"errorCode": error.errno, "error": error.name, "errorMessage": error.message},
        status_code=status.HTTP_403_FORBIDDEN,
    )


async def not_allowed(_request: Request, exc: Exception) -> JSONResponse:
    """The app's handler of a Kafka error a route (or a dependency) raised: 403 for
    :data:`AUTHORIZATION_ERRORS`, 503 for a retriable one (Pulsar away while
    permissions were read), else 500; the house body either way."""
    if not isinstance(exc, errors.KafkaError):  # registered for those classes only
        raise exc
    return refused_with(exc)


def refused_with(error: errors.KafkaError) -> JSONResponse:
    """A request refused as a whole for ``error``: 403 for an authorization failure,
    429 for THROTTLING_QUOTA_EXCEEDED (a cap, a role's quota), 503 for a retriable
    error, 500 for UNKNOWN_SERVER_ERROR, else 400 (what the request
    names: an invalid topic name, 17); the house body of a Kafka answer."""
    if isinstance(error, AUTHORIZATION_ERRORS):
        return forbidden(error)
    code = status.HTTP_400_BAD_REQUEST
    if isinstance(error, errors.ThrottlingQuotaExceeded):  # a cap or a role's quota
        code = status.HTTP_429_TOO_MANY_REQUESTS
    elif error.retriable:
        code = status.HTTP_503_SERVICE_UNAVAILABLE
    elif type(error) is errors.KafkaError:
        code = status.HTTP_500_INTERNAL_SERVER_ERROR
    return JSONResponse(
        {"errorCode": error.errno, "error": error.name, "errorMessage": error.message},
        status_code=code,
    )


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, STARTING)
    return runtime


async def require_token(request: Request) -> Identity:
    who = authenticated(request.app.state.auth, request.headers.get("authorization", ""))
    if isinstance(who, Refusal):
        raise HTTPException(who.status, who.detail, headers=who.headers)
    return who


async def require_superuser(request: Request) -> Identity:
    who = await require_token(request)
    if not who.superuser:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {who.role!r} is not a superuser")
    return who


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
Authorized = Depends(require_token)
CallerDep = Annotated[Identity, Depends(require_token)]
"""The authenticated caller (FastAPI resolves the dependency once per request)."""
Superuser = Depends(require_superuser)


async def get_access(request: Request, who: CallerDep) -> Access:
    """The caller's :class:`Access`; a superuser's (everyone's with authentication
    off) asks nothing of the runtime."""
    if who.superuser:
        return Access(OPEN, who)
    return Access((await get_runtime(request)).authorizer, who)


AccessDep = Annotated[Access, Depends(get_access)]


async def require_group(request: Request, groupId: str, access: AccessDep) -> None:  # noqa: N803
    """The caller's role owns the path's group (claimed by its first use: any method but
    GET), else 30 (403)."""
    await access.require_group(groupId, claim=request.method != "GET")


OwnsGroup = Depends(require_group)
"""For routes of ``/v1/groups/{groupId}``."""
