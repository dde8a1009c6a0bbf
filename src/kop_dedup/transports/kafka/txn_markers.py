"""WriteTxnMarkers (v1-2) from an operator: ``kafka-transactions abort`` sends an abort
marker for one partition to its leader, for a transaction ``find-hanging`` reported.

Kafka's own coordinators send this API to partition leaders; the sidecar's coordinator
copies commits instead, so a marker here only ever comes from an operator. An abort
marker is decided by the coordinator of the transaction's id
(:func:`kop_dedup.protocol.transaction_markers.abort_marker`: the partition is dropped
from a commit whose copy cannot complete, 51 while it is being copied, 47 for an older
epoch, nothing for a producer with nothing there), on this node or forwarded to the node
coordinating the id. A commit marker is INVALID_TXN_STATE (48): commits are decided by
the coordinator alone. A partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION.
The caller needs the tenant's admin role (31 otherwise), as Kafka asks CLUSTER_ACTION.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import WriteTxnMarkersRequest, WriteTxnMarkersResponse

from kop_dedup import errors
from kop_dedup.cluster.peers import PeerUnavailable
from kop_dedup.coordination.transactions import hanging
from kop_dedup.pulsar.failures import translate
from kop_dedup.transports.kafka.fetch import partition_topic
from kop_dedup.transports.kafka.forward import forward
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "write_txn_markers"]

_Result = WriteTxnMarkersResponse.WritableTxnMarkerResult
_TopicResult = _Result.WritableTxnMarkerTopicResult
_PartitionResult = _TopicResult.WritableTxnMarkerPartitionResult


def _answer(marker: Any, codes: dict[tuple[str, int], int]) -> Any:
    return _Result(
        producer_id=marker.producer_id,
        topics=[
            _TopicResult(
                name=t.name,
                partitions=[
                    _PartitionResult(partition_index=i, error_code=codes[t.name, i])
                    for i in t.partition_indexes
                ],
            )
            for t in marker.topics
        ],
    )


def _all(marker: Any, error: errors.KafkaError) -> Any:
    return _answer(
        marker, {(t.name, i): error.errno for t in marker.topics for i in t.partition_indexes}
    )


async def _forwarded(session: Session, tid: str, marker: Any, version: int) -> Any | None:
    """The answer of the node coordinating ``tid`` (None: this node coordinates it)."""
    cluster = session.runtime.cluster
    owner = None if session.forwarded else cluster.txn_coordinator(tid)
    if owner is None or cluster.is_me(owner) or not cluster.membership.joined:
        return None
    try:
        answer = await forward(
            session,
            owner,
            WriteTxnMarkersResponse,
            27,
            version,
            WriteTxnMarkersRequest(markers=[marker]),
        )
    except PeerUnavailable as exc:
        cluster.stats.forward_failures += 1
        raise errors.CoordinatorNotAvailable(
            f"the coordinator of {tid!r}, node {owner.node_id}, could not be reached ({exc})"
        ) from exc
    return answer.markers[0]


async def _marker(session: Session, marker: Any, version: int) -> Any:
    if marker.transaction_result:
        return _all(marker, errors.InvalidTxnState("commits are decided by the coordinator"))
    coordinator = session.runtime.transactions
    try:
        tid = await hanging.holder(coordinator.state, marker.producer_id)
        if tid is not None and (done := await _forwarded(session, tid, marker, version)):
            return done
    except Exception as exc:
        return _all(marker, translate(exc, "writing an abort marker"))
    codes: dict[tuple[str, int], int] = {}
    for t in marker.topics:
        for index in t.partition_indexes:
            try:
                await partition_topic(session, t.name, index)
                if tid is not None:
                    await hanging.abort_partition(
                        coordinator.state,
                        coordinator.applier,
                        tid,
                        producer_id=marker.producer_id,
                        producer_epoch=marker.producer_epoch,
                        topic=t.name,
                        partition=index,
                    )
                codes[t.name, index] = errors.NONE_ERRNO
            except Exception as exc:
                error = translate(exc, f"aborting in {t.name}-{index}")
                codes[t.name, index] = error.errno
    return _answer(marker, codes)


async def write_txn_markers(session: Session, request: Any, version: int) -> Any:
    markers = [await _marker(session, m, version) for m in request.markers]
    return WriteTxnMarkersResponse(version=version, markers=markers)


def _error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return WriteTxnMarkersResponse(
        version=version, markers=[_all(m, error) for m in request.markers]
    )


APIS = (
    Api(
        key=27,
        name="WriteTxnMarkers",
        request=WriteTxnMarkersRequest,
        versions=(1, 2),
        handle=write_txn_markers,
        error_answer=_error,
        response=WriteTxnMarkersResponse,
    ),
)
