"""Taking names back: an admin's release of a transactional id, and deleting a group
(one never stored included), so that a name another role squats has a way back.

``DELETE /v1/transactions/{transactionalId}/owner`` (the tenant's admin role or a
superuser; 403 with 53 otherwise): the id's owner is forgotten, and its producer id's,
so the next role to use the id owns it; answered on the id's coordinator (forwarded
there), on its state as it then is: 409 with 51 CONCURRENT_TRANSACTIONS while a
transaction of it is open, 404 with 105 TRANSACTIONAL_ID_NOT_FOUND when no role owns it.

``DELETE /v1/groups/{groupId}`` (its owner, the tenant's admin role or a superuser; 403
with 30 otherwise): Kafka's DeleteGroups over HTTP. Every key of the group is removed and
its owner forgotten; a group claimed but never stored is deleted too (its owner
forgotten). 409 with 68 NON_EMPTY_GROUP while it has members, 404 with 69
GROUP_ID_NOT_FOUND when nothing of it is stored and no role owns it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from kop_dedup import errors
from kop_dedup.protocol.transactions import Transaction
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.authorizer import TXN
from kop_dedup.security.pruning import release_transactional_id
from kop_dedup.transports.http.answers import JSON_OBJECT
from kop_dedup.transports.http.deps import AccessDep, Authorized, RuntimeDep, refused_with

__all__ = ["router"]

router = APIRouter(dependencies=[Authorized])

_TXN_ANSWERS: dict[int | str, dict[str, Any]] = {
    404: {"description": "no role owns the transactional id: errorCode 105", **JSON_OBJECT},
    409: {"description": "a transaction of the id is open: errorCode 51", **JSON_OBJECT},
}
_GROUP_ANSWERS: dict[int | str, dict[str, Any]] = {
    404: {"description": "nothing stored, no owner: errorCode 69", **JSON_OBJECT},
    409: {"description": "the group has members: errorCode 68", **JSON_OBJECT},
}
_CONFLICTS = (errors.ConcurrentTransactions, errors.NonEmptyGroup)
_MISSING = (errors.TransactionalIdNotFound, errors.GroupIdNotFound)


def _answer(error: errors.KafkaError | None, **extra: Any) -> JSONResponse:
    if error is None:
        return JSONResponse({"errorCode": errors.NONE_ERRNO, "error": errors.NONE_NAME, **extra})
    if isinstance(error, (*_CONFLICTS, *_MISSING)):
        body = {"errorCode": error.errno, "error": error.name, "errorMessage": error.message}
        return JSONResponse(body, status_code=409 if isinstance(error, _CONFLICTS) else 404)
    return refused_with(error)


@router.delete(
    "/v1/transactions/{transactionalId}/owner", tags=["transactions"], responses=_TXN_ANSWERS
)
async def release_transactional_id_route(
    transactionalId: str,  # noqa: N803
    runtime: RuntimeDep,
    access: AccessDep,
) -> JSONResponse:
    """Forget who owns a transactional id (an admin's way back from a role squatting it):
    the next role to use it owns it. Its last producer is cut off (its producer id is
    nobody's: 59). 403/53 without the tenant's admin role; 409/51 while a transaction of
    the id is open (end or abort it, or let it time out, then retry); 404/105 when no
    role owns it."""
    authorizer = runtime.authorizer  # a superuser's Access asks nothing: this one writes
    await authorizer.require_admin(
        access.who, "release a transactional id", errors.TransactionalIdAuthorizationFailed
    )
    released: list[str | None] = []

    async def release(txn: Transaction | None) -> None:
        if txn is None:
            released.append(await authorizer.released(TXN, transactionalId))
        else:
            released.append(await release_transactional_id(authorizer, txn))

    try:
        await runtime.transactions.release(transactionalId, release)
    except Exception as exc:  # Kafka errors pass through; Pulsar trouble is translated
        return _answer(translate(exc, "releasing the transactional id"))
    if not released or released[0] is None:
        missing = errors.TransactionalIdNotFound(
            f"no role owns transactional id {transactionalId!r}: nothing to release"
        )
        return _answer(missing)
    return _answer(None, transactionalId=transactionalId, releasedFrom=released[0])


@router.delete("/v1/groups/{groupId}", tags=["groups"], responses=_GROUP_ANSWERS)
async def delete_group(
    groupId: str,  # noqa: N803
    runtime: RuntimeDep,
    access: AccessDep,
) -> JSONResponse:
    """Delete a group (Kafka's DeleteGroups): its offsets, configuration and owner; a
    group claimed but never stored too. 403/30 unless the caller's role owns it or is
    the tenant's admin; 409/68 while it has members; 404/69 when nothing of it is stored
    and no role owns it."""
    await runtime.authorizer.may_delete_group(access.who, groupId)
    try:
        await runtime.group_deletion.delete_group(groupId)
    except Exception as exc:
        return _answer(translate(exc, f"deleting group {groupId!r}"))
    return _answer(None, groupId=groupId)
