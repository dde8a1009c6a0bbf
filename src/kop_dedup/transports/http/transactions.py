"""Routes for transactions and consumer-group offsets: HTTP <-> coordinator calls only.

Calls that succeed or fail as a whole answer HTTP 200 with Kafka's code in the body
(``errorCode``, ``error``, ``errorMessage``), as init-producer-id and produce do;
``GET`` of something unknown answers 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.api import UnknownGroup
from kop_dedup.coordination.groups.store import StagedOffset
from kop_dedup.coordination.transactions.requests import EndTxn, StageOffsets, TxnOffset
from kop_dedup.protocol.transactions import Transaction
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.authorizer import CONSUME, TXN
from kop_dedup.transports.http.answers import INVALID_RESPONSE, JSON_OBJECT, TOO_LARGE_RESPONSE
from kop_dedup.transports.http.bodies import body_spec, parsed_body
from kop_dedup.transports.http.deps import AccessDep, Authorized, OwnsGroup, RuntimeDep
from kop_dedup.transports.http.models import (
    EndTxnIn,
    KafkaAnswer,
    OffsetCommitIn,
    OffsetIn,
    TxnOffsetCommitIn,
)

__all__ = ["router"]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such transactional id", **JSON_OBJECT}
}
_BODY = {**TOO_LARGE_RESPONSE, **INVALID_RESPONSE}

router = APIRouter(dependencies=[Authorized])


def _answer(error: errors.KafkaError | None) -> KafkaAnswer:
    if error is None:
        return KafkaAnswer(errorCode=errors.NONE_ERRNO, error=errors.NONE_NAME)
    return KafkaAnswer(errorCode=error.errno, error=error.name, errorMessage=error.message)


async def _call(what: str, call: Any) -> KafkaAnswer:
    try:
        await call
    except Exception as exc:  # Kafka errors pass through; Pulsar trouble is translated
        return _answer(translate(exc, what))
    return _answer(None)


def _staged(offsets: list[OffsetIn]) -> list[StagedOffset]:
    return [StagedOffset(o.topic, o.partition, o.offset, o.metadata or "") for o in offsets]


@router.post(
    "/v1/txn-offset-commit",
    tags=["transactions"],
    openapi_extra=body_spec(TxnOffsetCommitIn),
    responses=_BODY,
)
async def txn_offset_commit(
    body: Annotated[TxnOffsetCommitIn, Depends(parsed_body(TxnOffsetCommitIn))],
    runtime: RuntimeDep,
    access: AccessDep,
) -> KafkaAnswer:
    """Stage consumer-group offsets in the open transaction (Kafka's
    sendOffsetsToTransaction): committed with it, dropped if it aborts; until then a
    stable fetch of those partitions answers 88 UNSTABLE_OFFSET_COMMIT. Errors: 49
    (another producer id), 90 PRODUCER_FENCED (an older epoch), 51 (a decision is
    being applied: retry), 48 (``transactionToken`` names another transaction). With
    ``memberId`` and ``generation`` (KIP-447) the member is checked as its own commit
    is: 25 UNKNOWN_MEMBER_ID, 22 ILLEGAL_GENERATION, and nothing is staged."""
    await access.require_txn(body.transactionalId)
    await access.require_group(body.groupId)
    await access.require(CONSUME, (o.topic for o in body.offsets))
    return await _call(
        "staging offsets",
        runtime.transactions.stage_offsets(
            StageOffsets(
                body.transactionalId,
                body.producerId,
                body.producerEpoch,
                body.groupId,
                tuple(
                    TxnOffset(o.topic, o.partition, o.offset, o.metadata or "")
                    for o in body.offsets
                ),
                member_id=body.memberId,
                generation=body.generation,
                token=body.transactionToken,
            )
        ),
    )


@router.post(
    "/v1/end-txn", tags=["transactions"], openapi_extra=body_spec(EndTxnIn), responses=_BODY
)
async def end_txn(
    body: Annotated[EndTxnIn, Depends(parsed_body(EndTxnIn))],
    runtime: RuntimeDep,
    access: AccessDep,
) -> KafkaAnswer:
    """Commit or abort the open transaction; answered once the decision is durable
    (records become visible as it is applied, partition by partition). The same
    decision again after it completed: 0; the other one: 48 INVALID_TXN_STATE; while a
    decision is being applied: 51 (retry); nothing open: 48; an older epoch: 90. With
    ``transactionToken``: only the transaction it names is ended; a token of a complete
    transaction is answered from its decision (0 the same, 48 the other), any other
    token 48."""
    await access.require_txn(body.transactionalId)
    return await _call(
        "ending the transaction",
        runtime.transactions.end(
            EndTxn(
                body.transactionalId,
                body.producerId,
                body.producerEpoch,
                body.commit,
                token=body.transactionToken,
            )
        ),
    )


def _describe(txn: Transaction, now_ms: int) -> dict[str, Any]:
    return {
        "transactionalId": txn.transactional_id,
        "state": txn.state.value,
        "producerId": txn.producer_id,
        "producerEpoch": txn.producer_epoch,
        "ordinal": txn.ordinal,
        "transactionToken": txn.token,
        "partitions": [{"topic": p.topic, "partition": p.partition} for p in txn.partitions],
        "groups": sorted({o.group for o in txn.offsets}),
        "offsets": [
            {"groupId": o.group, "topic": o.topic, "partition": o.partition, "offset": o.offset}
            for o in txn.offsets
        ],
        "startedMs": txn.started_ms or None,
        "ageMs": (now_ms - txn.started_ms) if txn.state.open and txn.started_ms else None,
        "timeoutMs": txn.timeout_ms,
        "inDoubt": txn.in_doubt,
        "checkBacks": txn.check_backs,
        "checkBackUrl": txn.check_back_url,
        "updatedMs": txn.updated_ms,
        "unresolved": txn.unresolved,
    }


@router.get("/v1/transactions", tags=["transactions"])
async def list_transactions(runtime: RuntimeDep, access: AccessDep) -> dict[str, Any]:
    """The open transactions (Ongoing, or decided and being applied), oldest first: of
    the caller's role's transactional ids only (all of them for a superuser)."""
    now = now_ms()
    txns = await runtime.transactions.open_transactions()
    mine = set(await access.visible(TXN, (t.transactional_id for t in txns)))
    txns = [t for t in txns if t.transactional_id in mine]
    return {"transactions": [_describe(t, now) for t in txns]}


@router.get("/v1/transactions/{transactionalId}", tags=["transactions"], responses=_NOT_FOUND)
async def describe_transaction(
    transactionalId: str,  # noqa: N803
    runtime: RuntimeDep,
    access: AccessDep,
) -> JSONResponse:
    """A transactional id's state, producer id and epoch, partitions, groups, age and
    timeout (Kafka's DescribeTransactions); another role's: 403, 53."""
    await access.require_txn(transactionalId, claim=False)
    txn = await runtime.transactions.describe(transactionalId)
    if txn is None:
        return JSONResponse(
            {"error": f"no transactional id {transactionalId!r} is known"}, status_code=404
        )
    return JSONResponse(_describe(txn, now_ms()))


@router.post(
    "/v1/groups/{groupId}/offsets",
    tags=["groups"],
    dependencies=[OwnsGroup],
    openapi_extra=body_spec(OffsetCommitIn),
    responses=_BODY,
)
async def commit_offsets(
    groupId: str,  # noqa: N803
    body: Annotated[OffsetCommitIn, Depends(parsed_body(OffsetCommitIn))],
    runtime: RuntimeDep,
    access: AccessDep,
) -> KafkaAnswer:
    """Commit a group's offsets (each the next record to read), durably in Pulsar."""
    await access.require(CONSUME, (o.topic for o in body.offsets))
    return await _call("committing offsets", runtime.offsets.commit(groupId, _staged(body.offsets)))


@router.get(
    "/v1/groups/{groupId}/offsets",
    tags=["groups"],
    dependencies=[OwnsGroup],
    responses={404: {"description": "no such group: errorCode 69", **JSON_OBJECT}},
)
async def fetch_offsets(
    groupId: str,  # noqa: N803
    runtime: RuntimeDep,
    access: AccessDep,
    requireStable: Annotated[bool, Query()] = False,  # noqa: N803
) -> JSONResponse:
    """A group's committed offsets (-1: none) of the topics the caller may consume
    (as Kafka's OffsetFetch of every topic); 404 with 69 GROUP_ID_NOT_FOUND for a
    group with nothing stored (no offsets, no configuration), as the other group
    routes answer. With ``requireStable=true``, a partition
    whose offsets wait in a transaction not yet complete answers 88
    UNSTABLE_OFFSET_COMMIT (retry) instead of its offset."""
    try:
        answers = await runtime.offsets.fetch(groupId, require_stable=requireStable)
    except Exception as exc:
        error = translate(exc, "fetching offsets")
        body = _answer(error).model_dump()
        return JSONResponse({**body, "groupId": groupId, "offsets": []})
    if not answers and await runtime.groups.describe(groupId) is None:
        # as every other route of a group with nothing stored: 404, 69
        missing = UnknownGroup(
            f"no group {groupId!r}: nothing is stored for it (no offsets, no configuration)"
        )
        body = _answer(missing).model_dump()
        return JSONResponse({**body, "groupId": groupId, "offsets": []}, status_code=404)
    shown = await access.may_each(CONSUME, (a.topic for a in answers))
    answers = [a for a in answers if shown[a.topic]]
    return JSONResponse(
        {
            "groupId": groupId,
            "errorCode": errors.NONE_ERRNO,
            "error": errors.NONE_NAME,
            "offsets": [
                {
                    "topic": a.topic,
                    "partition": a.partition,
                    "offset": a.offset,
                    "metadata": a.metadata,
                    "commitMs": a.commit_ms,
                    "errorCode": errors.NONE_ERRNO if a.error is None else a.error.errno,
                    "error": errors.NONE_NAME if a.error is None else a.error.name,
                    "errorMessage": None if a.error is None else a.error.message,
                }
                for a in answers
            ],
        }
    )
