"""ListTransactions (v0-2), DescribeTransactions (v0) and DescribeProducers (v0): what
``kafka-transactions list / describe / describe-producers``, franz-go's kadm and
Flink's transactional id pooling ask.

ListTransactions and DescribeTransactions read the transaction log (every partition,
any sidecar's: every change made before the call; in cluster mode ListTransactions
names the ids this node coordinates, as a Kafka broker does) through the transaction coordinator
(:mod:`kop_dedup.protocol.transaction_listing` has the filters); an unknown
transactional id is TRANSACTIONAL_ID_NOT_FOUND. The state names are Kafka's.

DescribeProducers lists, per partition, the producers with state on it: those the
broker's deduplication keeps (its last snapshot, every
``brokerDeduplicationSnapshotIntervalSeconds``), those connected now (every sidecar's),
and those this sidecar produced through, merged by producer id (the newest epoch, the
highest sequence known). A transactional producer shows under the name its commits
are copied with. A transaction's records reach the partition only when it commits, so
an open one holds no reader back; a commit being copied does (the partition's last
stable offset waits for it): its producer shows the offset where its copy begins as
the transaction's start offset, and the decision's time as the last timestamp (else
-1: none). The coordinator epoch is not kept (-1). With DescribeTransactions, which
leaves out the partitions of a commit whose copy cannot complete as decided
(``unresolved``), ``kafka-transactions find-hanging`` names those partitions.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import (
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.protocol import transaction_listing as listing
from kop_dedup.protocol.records import SEQ_MODULUS, from_pulsar
from kop_dedup.protocol.transactions import Transaction
from kop_dedup.pulsar.failures import translate
from kop_dedup.security.authorizer import TXN
from kop_dedup.transports.kafka import topology
from kop_dedup.transports.kafka.fetch import partition_topic
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "describe_producers", "describe_transactions", "list_transactions"]

_Listed = ListTransactionsResponse.TransactionState
_Described = DescribeTransactionsResponse.TransactionState
_TopicData = _Described.TopicData
_ProducerTopic = DescribeProducersResponse.TopicResponse
_ProducerPartition = _ProducerTopic.PartitionResponse
_ProducerState = _ProducerPartition.ProducerState
_TXN_NAME = "-txn-"


# -- ListTransactions ---------------------------------------------------------------------


async def list_transactions(session: Session, request: Any, version: int) -> Any:
    states = list(request.state_filters or [])
    filters = listing.Filters(
        states=frozenset(states),
        producer_ids=frozenset(request.producer_id_filters or []),
        duration_ms=request.duration_filter if version >= 1 else -1,
        pattern=request.transactional_id_pattern if version >= 2 else None,
    )
    unknown = listing.unknown_states(states)
    state = session.runtime.transactions.state
    try:
        await state.read_all()
        here = [t for t in state if topology.lists_transaction(session, t.transactional_id)]
        # the caller's own ids first: a client's filters (its pattern) never run over
        # another role's ids
        mine = set(
            await session.runtime.authorizer.visible(
                session.identity, TXN, [t.transactional_id for t in here]
            )
        )
        chosen = listing.select((t for t in here if t.transactional_id in mine), filters, now_ms())
    except Exception as exc:
        return _list_answer(version, translate(exc, "listing transactions"), unknown, [])
    return _list_answer(version, None, unknown, chosen)


def _list_answer(
    version: int, error: errors.KafkaError | None, unknown: list[str], txns: list[Any]
) -> Any:
    return ListTransactionsResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        unknown_state_filters=unknown,
        transaction_states=[
            _Listed(
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state.value,
            )
            for t in txns
        ],
    )


def _list_error(_request: Any, version: int, error: errors.KafkaError) -> Any:
    return _list_answer(version, error, [], [])


# -- DescribeTransactions -----------------------------------------------------------------


def _described(transactional_id: str, txn: Any, error: errors.KafkaError | None) -> Any:
    if txn is None or error is not None:
        return _Described(
            error_code=(error or errors.TransactionalIdNotFound()).errno,
            transactional_id=transactional_id,
            transaction_state="",
            transaction_timeout_ms=0,
            transaction_start_time_ms=0,
            producer_id=0,
            producer_epoch=0,
            topics=[],
        )
    return _Described(
        error_code=errors.NONE_ERRNO,
        transactional_id=transactional_id,
        transaction_state=txn.state.value,
        transaction_timeout_ms=txn.timeout_ms,
        transaction_start_time_ms=listing.start_time(txn),
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        topics=[_TopicData(topic=t, partitions=p) for t, p in listing.topics_of(txn).items()],
    )


async def describe_transactions(session: Session, request: Any, version: int) -> Any:
    out = []
    for transactional_id in request.transactional_ids:
        try:
            txn = await session.runtime.transactions.describe(transactional_id)
            out.append(_described(transactional_id, txn, None))
        except Exception as exc:
            error = translate(exc, f"describing transaction {transactional_id!r}")
            out.append(_described(transactional_id, None, error))
    return DescribeTransactionsResponse(version=version, throttle_time_ms=0, transaction_states=out)


def _describe_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return DescribeTransactionsResponse(
        version=version,
        throttle_time_ms=0,
        transaction_states=[_described(t, None, error) for t in request.transactional_ids],
    )


# -- DescribeProducers --------------------------------------------------------------------


def _parse(session: Session, name: str) -> tuple[int, int] | None:
    """(producer id, epoch) of a Pulsar producer name the sidecar made: an idempotent
    producer's, or the copy producer of a transactional one's commits."""
    prefix = session.settings.producer_name_prefix
    if name.startswith(f"{prefix}{_TXN_NAME}"):
        name = prefix + "-" + name.removeprefix(f"{prefix}{_TXN_NAME}")
    return session.runtime.naming.parse_producer_name(name)


async def _producers(
    session: Session, topic: str, index: int, copying: list[Transaction]
) -> list[Any]:
    ptopic = await partition_topic(session, topic, index)
    admin = session.runtime.admin
    known: dict[tuple[int, int], int | None] = {}
    for name, mark in (await admin.dedup_marks(ptopic)).items():
        ids = _parse(session, name)
        if ids is not None:
            known[ids] = from_pulsar(mark)
    for name in await admin.publishers(ptopic):
        ids = _parse(session, name)
        if ids is not None:
            known.setdefault(ids, None)
    for ids, seq in session.runtime.service.channels.producers_on(ptopic).items():
        have = known.get(ids)
        known[ids] = seq if have is None else max(have, seq or -1)
    for txn in copying:
        known.setdefault((txn.producer_id, txn.producer_epoch), None)
    newest: dict[int, tuple[int, int | None]] = {}
    for (pid, epoch), seq in known.items():
        if pid not in newest or epoch > newest[pid][0]:
            newest[pid] = (epoch, seq)
    open_at = await _copies_here(session, topic, index, copying)
    return [
        _ProducerState(
            producer_id=pid,
            producer_epoch=epoch,
            last_sequence=-1 if seq is None else seq % SEQ_MODULUS,
            last_timestamp=open_at.get((pid, epoch), (-1, -1))[1],
            coordinator_epoch=-1,
            current_txn_start_offset=open_at.get((pid, epoch), (-1, -1))[0],
        )
        for pid, (epoch, seq) in sorted(newest.items())
    ]


async def _copies_here(
    session: Session, topic: str, index: int, copying: list[Transaction]
) -> dict[tuple[int, int], tuple[int, int]]:
    """(producer id, epoch) -> (start offset, decided at) of each commit being copied
    into the partition."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for txn in copying:
        part = txn.partition(topic, index)
        if part is not None:
            start = await session.runtime.stable.copy_start(part)
            out[txn.producer_id, txn.producer_epoch] = (start, txn.updated_ms)
    return out


async def _partition(
    session: Session, topic: str, index: int, copying: dict[tuple[str, int], list[Transaction]]
) -> Any:
    try:
        active = await _producers(session, topic, index, copying.get((topic, index), []))
    except Exception as exc:
        error = translate(exc, f"describing the producers of {topic}-{index}")
        return _ProducerPartition(
            partition_index=index,
            error_code=error.errno,
            error_message=error.message,
            active_producers=[],
        )
    return _ProducerPartition(
        partition_index=index,
        error_code=errors.NONE_ERRNO,
        error_message=None,
        active_producers=active,
    )


async def describe_producers(session: Session, request: Any, version: int) -> Any:
    copying = await session.runtime.stable.copying()
    topics = []
    for t in request.topics:
        parts = [await _partition(session, t.name, i, copying) for i in t.partition_indexes]
        topics.append(_ProducerTopic(name=t.name, partitions=parts))
    return DescribeProducersResponse(version=version, throttle_time_ms=0, topics=topics)


def _producers_error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return DescribeProducersResponse(
        version=version,
        throttle_time_ms=0,
        topics=[
            _ProducerTopic(
                name=t.name,
                partitions=[
                    _ProducerPartition(
                        partition_index=i,
                        error_code=error.errno,
                        error_message=error.message,
                        active_producers=[],
                    )
                    for i in t.partition_indexes
                ],
            )
            for t in request.topics
        ],
    )


APIS = (
    Api(
        key=66,
        name="ListTransactions",
        request=ListTransactionsRequest,
        versions=(0, 2),
        handle=list_transactions,
        error_answer=_list_error,
    ),
    Api(
        key=65,
        name="DescribeTransactions",
        request=DescribeTransactionsRequest,
        versions=(0, 0),
        handle=describe_transactions,
        error_answer=_describe_error,
    ),
    Api(
        key=61,
        name="DescribeProducers",
        request=DescribeProducersRequest,
        versions=(0, 0),
        handle=describe_producers,
        error_answer=_producers_error,
    ),
)
