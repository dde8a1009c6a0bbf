"""InitProducerId: a fresh producer id for an idempotent producer.

Without a transactional id, Kafka's ``TransactionCoordinator.handleInitProducerId``
hands out a new producer id at epoch 0 and ignores the rest of the request (the
timeout, and the id and epoch a v3+ client sends to bump its epoch, KIP-360): so does
this, from the same cluster-wide allocator HTTP's init-producer-id uses. An empty
transactional id is INVALID_REQUEST. A transactional id is answered
TRANSACTIONAL_ID_AUTHORIZATION_FAILED until the listener serves transactions: librdkafka
and the Java client both fail ``initTransactions`` at once on it (UNSUPPORTED_VERSION
would make librdkafka retry until its timeout).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from kop_dedup import errors
from kop_dedup.pulsar.failures import translate
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "init_producer_id"]


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
        return _answer(version, None, pid, 0)
    if tid == "":
        return _answer(version, errors.InvalidRequest("an empty transactional id"))
    return _answer(
        version,
        errors.TransactionalIdAuthorizationFailed(
            "transactions are not served on the Kafka listener yet"
        ),
    )


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
    ),
)
