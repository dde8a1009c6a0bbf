"""Dependencies: the runtime, and optional bearer-token authentication.

Both are ``async def``: FastAPI runs plain ``def`` dependencies in a worker
thread, a thread hand-off per request that showed up in the profile.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from kop_dedup.runtime import Runtime

__all__ = ["Authorized", "RuntimeDep"]


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the sidecar is starting")
    return runtime


async def require_token(request: Request) -> None:
    """When tokens are configured, demand ``Authorization: Bearer <token>``."""
    tokens: frozenset[str] = request.app.state.tokens
    if not tokens:
        return
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not any(hmac.compare_digest(presented.encode(), t.encode()) for t in tokens):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "bearer token not accepted",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
Authorized = Depends(require_token)
