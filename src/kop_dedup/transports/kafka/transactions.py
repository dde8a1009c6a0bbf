"""The transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
each one call of the transaction coordinator
(:class:`~kop_dedup.coordination.transactions.coordinator.TransactionCoordinator`, the
calls HTTP makes). Its errors are answered as Kafka answers them, per version
(:mod:`.txn_codes`).

The versions are those of Kafka's transactions v1: no ``transaction.version`` feature
is advertised (:mod:`.versions`), so a Java 4.x client sends EndTxn and TxnOffsetCommit
up to v4 and AddPartitionsToTxn up to v3, adds each partition before producing to it
and keeps its epoch across transactions. AddPartitionsToTxn v4+ is the broker-to-broker
form (batched, ``verify_only``): not served; librdkafka sends v0 only.

Before the coordinator, as Kafka's ``KafkaApis``:

- AddPartitionsToTxn: every partition must exist (Produce and these calls never create
  a topic): one that does not is UNKNOWN_TOPIC_OR_PARTITION and every other partition
  of the request OPERATION_NOT_ATTEMPTED (55), nothing added. Otherwise the
  coordinator's answer is every partition's (49, 90/47, 51, ...).
- TxnOffsetCommit: a partition of a topic that does not exist is
  UNKNOWN_TOPIC_OR_PARTITION and metadata over 4096 bytes OFFSET_METADATA_TOO_LARGE;
  the others are staged together. The group may be one the sidecar knows only through
  its offsets. KIP-447 (v3+): generation -1 with an empty member id is a commit made
  without group metadata (``sendOffsetsToTransaction(offsets, groupId)``, or a consumer
  that assigns its partitions), staged without a member check; otherwise the member and
  generation are checked as the member's own commit (25, 22), with its
  ``group_instance_id`` when it names one (static membership, KIP-345: 82 for a
  member id a restart of that instance replaced).
- An empty transactional id is INVALID_REQUEST.
"""

from __future__ import annotations

import asyncio
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
from kop_dedup.cluster.peers import PeerUnavailable
from kop_dedup.coordination.transactions.requests import EndTxn, StageOffsets, TxnOffset
from kop_dedup.transports.kafka import txn_codes
from kop_dedup.transports.kafka.fetch import partition_topic
from kop_dedup.transports.kafka.forward import forward
from kop_dedup.transports.kafka.offsets import MAX_METADATA_BYTES
from kop_dedup.transports.kafka.registry import Api, Session
from kop_dedup.transports.kafka.routed import group_key, txn_key

__all__ = ["APIS", "add_offsets", "add_partitions", "end_txn", "txn_offset_commit"]

PartKey = tuple[str, int]
_MEMBER_FROM = 3

_TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
_PartitionResult = _TopicResult.AddPartitionsToTxnPartitionResult
_OffsetTopic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
_OffsetPartition = _OffsetTopic.TxnOffsetCommitResponsePartition


def _code(error: errors.KafkaError | None) -> int:
    return errors.NONE_ERRNO if error is None else error.errno


def _no_id(transactional_id: str | None) -> errors.KafkaError | None:
    if transactional_id:
        return None
    return errors.InvalidRequest("a transaction call needs a transactional id")


async def _missing(session: Session, topic: str, index: int) -> errors.KafkaError | None:
    """UNKNOWN_TOPIC_OR_PARTITION (or what looking it up met) for a partition that does
    not exist; None when it does."""
    try:
        await partition_topic(session, topic, index)
    except errors.KafkaError as exc:
        return exc
    return None


# -- AddPartitionsToTxn -------------------------------------------------------------------


def _partitions_answer(
    version: int, keys: list[PartKey], results: dict[PartKey, errors.KafkaError | None]
) -> Any:
    topics: dict[str, list[Any]] = {}
    for topic, index in keys:
        topics.setdefault(topic, []).append(
            _PartitionResult(
                partition_index=index, partition_error_code=_code(results[topic, index])
            )
        )
    return AddPartitionsToTxnResponse(
        version=version,
        throttle_time_ms=0,
        results_by_topic_v3_and_below=[
            _TopicResult(name=name, results_by_partition=parts) for name, parts in topics.items()
        ],
    )


def _asked_partitions(request: Any) -> list[PartKey]:
    return list(
        dict.fromkeys((t.name, p) for t in request.v3_and_below_topics or () for p in t.partitions)
    )


async def add_partitions(session: Session, request: Any, version: int) -> Any:
    tid = request.v3_and_below_transactional_id
    keys = _asked_partitions(request)
    refused = _no_id(tid)
    if refused is not None:
        return _partitions_answer(version, keys, dict.fromkeys(keys, refused))
    found = await asyncio.gather(*(_missing(session, t, p) for t, p in keys))
    missing = {k: e for k, e in zip(keys, found, strict=True) if e is not None}
    if missing:
        skipped = errors.OperationNotAttempted(
            f"not added: {', '.join(f'{t}-{p}' for t, p in missing)} cannot be"
        )
        return _partitions_answer(version, keys, {k: missing.get(k, skipped) for k in keys})
    results = await session.runtime.transactions.add_partitions(
        tid, request.v3_and_below_producer_id, request.v3_and_below_producer_epoch, keys
    )
    return _partitions_answer(
        version,
        keys,
        {
            k: None if e is None else txn_codes.for_api("AddPartitionsToTxn", version, e)
            for k, e in results.items()
        },
    )


def _add_partitions_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    keys = _asked_partitions(request)
    return _partitions_answer(version, keys, dict.fromkeys(keys, error))


# -- AddOffsetsToTxn ----------------------------------------------------------------------


def _offsets_answer(version: int, error: errors.KafkaError | None) -> Any:
    return AddOffsetsToTxnResponse(version=version, throttle_time_ms=0, error_code=_code(error))


async def add_offsets(session: Session, request: Any, version: int) -> Any:
    refused = _no_id(request.transactional_id)
    if refused is not None:
        return _offsets_answer(version, refused)
    try:
        await session.runtime.transactions.add_offsets(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
    except Exception as exc:
        return _offsets_answer(version, txn_codes.for_api("AddOffsetsToTxn", version, exc))
    return _offsets_answer(version, None)


def _add_offsets_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _offsets_answer(version, error)


# -- TxnOffsetCommit ----------------------------------------------------------------------


async def _checked(session: Session, topic: str, partition: Any) -> TxnOffset | errors.KafkaError:
    metadata = partition.committed_metadata or ""
    if len(metadata.encode()) > MAX_METADATA_BYTES:
        return errors.OffsetMetadataTooLarge(
            f"{topic}-{partition.partition_index}: metadata over {MAX_METADATA_BYTES} bytes"
        )
    missing = await _missing(session, topic, partition.partition_index)
    if missing is not None:
        return missing
    return TxnOffset(topic, partition.partition_index, partition.committed_offset, metadata)


def _member(request: Any, version: int) -> tuple[str | None, int | None]:
    """(member id, generation) to check (KIP-447); (None, None): no group metadata."""
    if version < _MEMBER_FROM:
        return None, None
    member, generation = request.member_id or "", request.generation_id
    if generation < 0 and not member:
        return None, None
    return member, generation


async def txn_offset_commit(session: Session, request: Any, version: int) -> Any:
    """Sent to the group's coordinator (checked by :mod:`.routed`); the offsets are staged
    in the transaction by the transactional id's coordinator: here, or forwarded to it."""
    cluster = session.runtime.cluster
    tid = request.transactional_id
    owner = None if session.forwarded or not tid else cluster.txn_coordinator(tid)
    if owner is not None and not cluster.is_me(owner) and cluster.membership.joined:
        try:
            return await forward(session, owner, TxnOffsetCommitResponse, 28, version, request)
        except PeerUnavailable as exc:
            cluster.stats.forward_failures += 1
            raise errors.CoordinatorNotAvailable(
                f"the coordinator of {tid!r}, node {owner.node_id}, could not be reached "
                f"({exc}); retry"
            ) from exc
    asked = [(t.name, p) for t in request.topics for p in t.partitions]
    checked = await asyncio.gather(*(_checked(session, t, p) for t, p in asked))
    staged = tuple(c for c in checked if isinstance(c, TxnOffset))
    outcome = _no_id(request.transactional_id)
    if staged and outcome is None:
        member, generation = _member(request, version)
        try:
            await session.runtime.transactions.stage_offsets(
                StageOffsets(
                    request.transactional_id,
                    request.producer_id,
                    request.producer_epoch,
                    request.group_id,
                    staged,
                    member_id=member,
                    generation=generation,
                    instance_id=getattr(request, "group_instance_id", None) if member else None,
                )
            )
        except Exception as exc:
            outcome = txn_codes.for_api("TxnOffsetCommit", version, exc)
    topics: dict[str, list[Any]] = {}
    for (topic, p), result in zip(asked, checked, strict=True):
        error = result if isinstance(result, errors.KafkaError) else outcome
        topics.setdefault(topic, []).append(
            _OffsetPartition(partition_index=p.partition_index, error_code=_code(error))
        )
    return TxnOffsetCommitResponse(
        version=version,
        throttle_time_ms=0,
        topics=[_OffsetTopic(name=n, partitions=parts) for n, parts in topics.items()],
    )


def _txn_offset_commit_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return TxnOffsetCommitResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            _OffsetTopic(
                name=t.name,
                partitions=[
                    _OffsetPartition(partition_index=p.partition_index, error_code=error.errno)
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ],
    )


# -- EndTxn -------------------------------------------------------------------------------


def _end_answer(version: int, error: errors.KafkaError | None) -> Any:
    return EndTxnResponse(
        version=version,
        throttle_time_ms=0,
        error_code=_code(error),
        producer_id=-1,
        producer_epoch=-1,
    )


async def end_txn(session: Session, request: Any, version: int) -> Any:
    refused = _no_id(request.transactional_id)
    if refused is not None:
        return _end_answer(version, refused)
    try:
        await session.runtime.transactions.end(
            EndTxn(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                commit=bool(request.committed),
            )
        )
    except Exception as exc:
        return _end_answer(version, txn_codes.for_api("EndTxn", version, exc))
    return _end_answer(version, None)


def _end_txn_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _end_answer(version, error)


def _add_partitions_key(request: Any, _version: int) -> tuple[int, str] | None:
    """AddPartitionsToTxn v0-3 names one transactional id."""
    tid = request.v3_and_below_transactional_id
    return (1, str(tid)) if tid else None


APIS = (
    Api(
        key=24,
        name="AddPartitionsToTxn",
        request=AddPartitionsToTxnRequest,
        versions=(0, 3),
        handle=add_partitions,
        error_answer=_add_partitions_error,
        coordinator_key=_add_partitions_key,
        response=AddPartitionsToTxnResponse,
    ),
    Api(
        key=25,
        name="AddOffsetsToTxn",
        request=AddOffsetsToTxnRequest,
        versions=(0, 4),
        handle=add_offsets,
        error_answer=_add_offsets_error,
        coordinator_key=txn_key,
        response=AddOffsetsToTxnResponse,
    ),
    Api(
        key=26,
        name="EndTxn",
        request=EndTxnRequest,
        versions=(0, 4),
        handle=end_txn,
        error_answer=_end_txn_error,
        coordinator_key=txn_key,
        response=EndTxnResponse,
    ),
    Api(
        key=28,
        name="TxnOffsetCommit",
        request=TxnOffsetCommitRequest,
        versions=(0, 4),
        handle=txn_offset_commit,
        error_answer=_txn_offset_commit_error,
        coordinator_key=group_key,
        response=TxnOffsetCommitResponse,
    ),
)
