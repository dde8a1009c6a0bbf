"""What the transaction coordinator's errors are answered as on the Kafka wire: Kafka's
own conversions (``KafkaApis``, ``TransactionStateManager``, ``AddPartitionsToTxnManager``,
``ReplicaManager``), per API and version, in one place. Every code a client can get
from the transactional APIs passes through here, so that each is one the client
handles as it does from Kafka (librdkafka's ``rdkafka_txnmgr.c``, Java's
``TransactionManager``, kafka-python, aiokafka).

==========================  ==========================================================
the coordinator raised      the client gets
==========================  ==========================================================
PRODUCER_FENCED (90)        47 INVALID_PRODUCER_EPOCH from InitProducerId below v4,
                            AddPartitionsToTxn, AddOffsetsToTxn and EndTxn below v2
                            (KIP-588: those clients do not know 90; librdkafka sends
                            AddPartitionsToTxn v0 and EndTxn v0-1, aiokafka v0 of
                            all), TxnOffsetCommit (Kafka's group coordinator answers
                            the log's 47) and Produce (47 is fatal to a transactional
                            librdkafka producer, abortable and then fatal to Java)
REQUEST_TIMED_OUT (7),      15 COORDINATOR_NOT_AVAILABLE / 16 NOT_COORDINATOR from the
NOT_ENOUGH_REPLICAS (19),   transaction APIs, as Kafka's ``TransactionStateManager``
NOT_LEADER_OR_FOLLOWER (6), answers a failed log write: every client retries both
KAFKA_STORAGE_ERROR (56)    (a retried EndTxn of a durable decision answers 0)
CONCURRENT_TRANSACTIONS     from Produce: 19 NOT_ENOUGH_REPLICAS, retried by every
(51), NOT_COORDINATOR (16)  client (``ReplicaManager`` does so for its verification)
INVALID_TXN_STATE (48)      from Produce v11 (a partition not added to the
                            transaction): 120 TRANSACTION_ABORTABLE, as Kafka answers
                            a client that knows it (KIP-890)
==========================  ==========================================================

>>> for_api("EndTxn", 1, errors.ProducerFenced("old epoch")).errno
47
>>> for_produce(9, errors.ConcurrentTransactions("being committed")).errno
19
"""

from __future__ import annotations

from typing import Final

from kop_dedup import errors
from kop_dedup.pulsar.failures import translate

__all__ = ["FENCED_FROM", "for_api", "for_produce"]

FENCED_FROM: Final[dict[str, int | None]] = {
    "InitProducerId": 4,
    "AddPartitionsToTxn": 2,
    "AddOffsetsToTxn": 2,
    "EndTxn": 2,
    "TxnOffsetCommit": None,
}
"""The first version of each transaction API answered PRODUCER_FENCED (None: never)."""

_ABORTABLE_PRODUCE_FROM = 11
_UNAVAILABLE = (errors.RequestTimedOut, errors.NotEnoughReplicas)
_MOVED = (errors.NotLeaderOrFollower, errors.KafkaStorageError)


def _epoch(error: errors.ProducerFenced) -> errors.KafkaError:
    return errors.InvalidProducerEpoch(error.message)


def for_api(api: str, version: int, failure: BaseException) -> errors.KafkaError:
    """The error a transaction API (a key of :data:`FENCED_FROM`) answers at
    ``version`` for what the coordinator raised (Pulsar failures translated first)."""
    error = translate(failure, f"{api} in the transaction coordinator")
    if isinstance(error, errors.ProducerFenced):
        since = FENCED_FROM[api]
        return error if since is not None and version >= since else _epoch(error)
    if isinstance(error, _UNAVAILABLE):
        return errors.CoordinatorNotAvailable(error.message)
    if isinstance(error, _MOVED):
        return errors.NotCoordinator(error.message)
    return error


def for_produce(version: int, error: errors.KafkaError) -> errors.KafkaError:
    """The error a transactional batch's partition answers in a Produce at ``version``."""
    if isinstance(error, errors.ProducerFenced):
        return _epoch(error)
    if isinstance(error, errors.ConcurrentTransactions | errors.NotCoordinator):
        return errors.NotEnoughReplicas(
            f"the transaction cannot take the batch yet ({error.name}: {error.message}); retry"
        )
    if isinstance(error, errors.InvalidTxnState) and version >= _ABORTABLE_PRODUCE_FROM:
        return errors.TransactionAbortable(error.message)
    return error
