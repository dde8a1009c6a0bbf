"""Dependencies: the runtime, and optional bearer-token authentication.

Both are ``async def``: FastAPI runs plain ``def`` dependencies in a worker
thread, a thread hand-off per request that showed up in the profile.
``refusal`` is the token check itself, shared with the produce endpoint
(which runs without FastAPI's dependency resolution, see produce.py).
"""

from __future__ import annotations

import hmac
from typing import Annotated, NamedTuple

from fastapi import Depends, HTTPException, Request, status

from kop_dedup.runtime import Runtime

__all__ = ["STARTING", "Authorized", "Refusal", "RuntimeDep", "refusal"]

STARTING = "the sidecar is starting"
"""The 503's detail while the runtime is not up yet."""


class Refusal(NamedTuple):
    """Why a request is not let in: status, detail and headers of its answer."""

    status: int
    detail: str
    headers: dict[str, str]


def refusal(tokens: frozenset[str], authorization: str) -> Refusal | None:
    """When tokens are configured, demand ``Authorization: Bearer <token>``.

    ``authorization`` is the header's value ("" when absent); None lets the
    request in.
    """
    if not tokens:
        return None
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return Refusal(
            status.HTTP_401_UNAUTHORIZED, "missing bearer token", {"WWW-Authenticate": "Bearer"}
        )
    if not any(hmac.compare_digest(presented.encode(), t.encode()) for t in tokens):
        return Refusal(
            status.HTTP_403_FORBIDDEN,
            "bearer token not accepted",
            {"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return None


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, STARTING)
    return runtime


async def require_token(request: Request) -> None:
    refused = refusal(request.app.state.tokens, request.headers.get("authorization", ""))
    if refused is not None:
        raise HTTPException(refused.status, refused.detail, headers=refused.headers)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
Authorized = Depends(require_token)
