"""InitProducerId: a producer id and epoch, for an idempotent or a transactional producer.

Without a transactional id, Kafka's ``TransactionCoordinator.handleInitProducerId``
hands out a new producer id at epoch 0 and ignores the rest of the request (the
timeout, and the id and epoch a v3+ client sends to bump its epoch, KIP-360): so does
this, from the same cluster-wide allocator HTTP's init-producer-id uses.

With one, the transaction coordinator answers (``TransactionCoordinator.init_producer_id``,
the call HTTP makes): the id's producer id at the next epoch, fencing the previous
one; 51 CONCURRENT_TRANSACTIONS while an open transaction of the id is being fenced and
aborted, or a decision applied (clients retry); 50 INVALID_TRANSACTION_TIMEOUT for a
``transaction.timeout.ms`` outside 1..``KOP_DEDUP_MAX_TRANSACTION_TIMEOUT_MS``. The
producer id and epoch of a v3+ request (KIP-360: a producer bumping its own epoch after
an abortable error) are the caller's current ones: both -1 is none, one of them -1 is
INVALID_REQUEST (as Kafka's ``KafkaApis``), a stale pair PRODUCER_FENCED (47 below v4:
:mod:`.txn_codes`). An empty transactional id is INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from kop_dedup import errors
from kop_dedup.coordination.transactions.requests import InitProducerId
from kop_dedup.pulsar.failures import translate
from kop_dedup.transports.kafka import txn_codes
from kop_dedup.transports.kafka.registry import Api, Session
from kop_dedup.transports.kafka.routed import txn_key

__all__ = ["APIS", "init_producer_id"]

_NO_ID = -1
_KIP_360_FROM = 3


def _answer(version: int, error: errors.KafkaError | None, pid: int = -1, epoch: int = -1) -> Any:
    return InitProducerIdResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        producer_id=pid,
        producer_epoch=epoch,
    )


async def init_producer_id(session: Session, request: Any, version: int) -> Any:
    tid = request.transactional_id
    if tid is None:
        try:
            pid = await session.runtime.registry.allocator.allocate()
        except errors.KafkaError:
            raise
        except Exception as exc:
            raise translate(exc, "allocating a producer id") from exc
        await _claim(session, pid)
        return _answer(version, None, pid, 0)
    if tid == "":
        return _answer(version, errors.InvalidRequest("an empty transactional id"))
    current = (_NO_ID, _NO_ID)
    if version >= _KIP_360_FROM:
        current = (request.producer_id, request.producer_epoch)
    if (current[0] == _NO_ID) != (current[1] == _NO_ID):
        return _answer(
            version,
            errors.InvalidRequest(
                f"producer id {current[0]} and epoch {current[1]}: give both or neither"
            ),
        )
    known = current[0] != _NO_ID
    try:
        ids = await session.runtime.transactions.init_producer_id(
            InitProducerId(
                tid,
                timeout_ms=request.transaction_timeout_ms,
                producer_id=current[0] if known else None,
                producer_epoch=current[1] if known else None,
            )
        )
        await _claim(session, ids.producer_id)
    except Exception as exc:
        return _answer(version, txn_codes.for_api("InitProducerId", version, exc))
    return _answer(version, None, ids.producer_id, ids.producer_epoch)


async def _claim(session: Session, producer_id: int) -> None:
    """The producer id is the caller's role's (its batches are refused to others)."""
    if not session.identity.superuser:
        await session.runtime.authorizer.claim_producer(session.identity, producer_id)


async def _claim_forwarded(session: Session, answer: Any) -> None:
    """The coordinator that served a forwarded InitProducerId does not know its caller:
    the producer id it handed out is given to the caller's role here, before the
    client learns it."""
    if answer.error_code == errors.NONE_ERRNO:
        await _claim(session, answer.producer_id)


def _error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _answer(version, error)


APIS = (
    Api(
        key=22,
        name="InitProducerId",
        request=InitProducerIdRequest,
        versions=(0, 5),
        handle=init_producer_id,
        error_answer=_error,
        coordinator_key=txn_key,
        response=InitProducerIdResponse,
        after_forward=_claim_forwarded,
    ),
)
