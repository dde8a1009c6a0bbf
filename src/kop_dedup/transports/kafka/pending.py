"""APIs answered with an error until they are built: a valid answer, never a closed
connection.

- The transaction APIs (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit)
  are not advertised, and a client that sends them anyway gets UNSUPPORTED_VERSION
  (a transactional producer never gets that far: InitProducerId with a transactional
  id is refused first, :mod:`.producer_ids`).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from kop_dedup import errors
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS"]


def _not_yet(what: str) -> errors.KafkaError:
    return errors.UnsupportedVersion(f"{what} is not served on the Kafka listener yet")


# -- transactions -------------------------------------------------------------------------


def _add_partitions_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    result = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
    part = result.AddPartitionsToTxnPartitionResult

    def topics(items: Any) -> list[Any]:
        return [
            result(
                name=t.name,
                results_by_partition=[
                    part(partition_index=p, partition_error_code=error.errno) for p in t.partitions
                ],
            )
            for t in items
        ]

    if version < 4:
        return AddPartitionsToTxnResponse(
            version=version,
            throttle_time_ms=0,
            results_by_topic_v3_and_below=topics(request.v3_and_below_topics),
        )
    return AddPartitionsToTxnResponse(
        version=version,
        throttle_time_ms=0,
        error_code=error.errno,
        results_by_transaction=[
            AddPartitionsToTxnResponse.AddPartitionsToTxnResult(
                transactional_id=t.transactional_id, topic_results=topics(t.topics)
            )
            for t in request.transactions
        ],
    )


def _add_offsets_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return AddOffsetsToTxnResponse(version=version, throttle_time_ms=0, error_code=error.errno)


def _end_txn_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return EndTxnResponse(
        version=version,
        throttle_time_ms=0,
        error_code=error.errno,
        producer_id=-1,
        producer_epoch=-1,
    )


def _txn_offset_commit_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    topic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    part = topic.TxnOffsetCommitResponsePartition
    return TxnOffsetCommitResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            topic(
                name=t.name,
                partitions=[
                    part(partition_index=p.partition_index, error_code=error.errno)
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ],
    )


def _placeholder(name: str, error_answer: Any) -> Any:
    async def handle(_session: Session, request: Any, version: int) -> Any:
        return error_answer(request, version, _not_yet(name))

    return handle


APIS = (
    Api(
        key=24,
        name="AddPartitionsToTxn",
        request=AddPartitionsToTxnRequest,
        versions=(0, 5),
        handle=_placeholder("AddPartitionsToTxn", _add_partitions_error),
        error_answer=_add_partitions_error,
        advertised=False,
    ),
    Api(
        key=25,
        name="AddOffsetsToTxn",
        request=AddOffsetsToTxnRequest,
        versions=(0, 4),
        handle=_placeholder("AddOffsetsToTxn", _add_offsets_error),
        error_answer=_add_offsets_error,
        advertised=False,
    ),
    Api(
        key=26,
        name="EndTxn",
        request=EndTxnRequest,
        versions=(0, 5),
        handle=_placeholder("EndTxn", _end_txn_error),
        error_answer=_end_txn_error,
        advertised=False,
    ),
    Api(
        key=28,
        name="TxnOffsetCommit",
        request=TxnOffsetCommitRequest,
        versions=(0, 5),
        handle=_placeholder("TxnOffsetCommit", _txn_offset_commit_error),
        error_answer=_txn_offset_commit_error,
        advertised=False,
    ),
)
