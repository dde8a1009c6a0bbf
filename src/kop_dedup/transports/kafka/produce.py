"""Produce (v3+, RecordBatch v2): each partition's batch through ``ProduceService.produce``.

The same path HTTP takes, so the same answers: 46 DUPLICATE_SEQUENCE_NUMBER for a
batch already stored (clients count it delivered), 45 for a gap, 47 for a fenced
epoch, retriable codes whose retries are safe; a batch without a producer id is
written without deduplication. Before that, as Kafka's ``KafkaApis`` does: acks other
than -1, 0, 1 are INVALID_REQUIRED_ACKS; a topic that does not exist (Produce never
creates one: Metadata does) or a partition out of range is
UNKNOWN_TOPIC_OR_PARTITION; the batch is checked (:mod:`.batches`). The partitions of
one request are produced side by side; a partition the request names twice is produced
once, with the data named last, and answered once (Kafka gathers a request's partitions
in a map).

What one request's compressed batches inflate to together is bounded
(``KAFKA_MAX_REQUEST_INFLATED_BYTES``: 10 MESSAGE_TOO_LARGE past it, inflating stopped
there), and so is what a connection's requests hold at once
(``KAFKA_MAX_CONNECTION_INFLATED_BYTES``): a request reserves its bound before inflating,
keeps what it inflated until answered, and waits while earlier ones hold too much.

Transactional batches need the request's transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole request) and go, all of one request
in one call, through the transaction coordinator's journal
(``TransactionCoordinator.produce``): visible once the transaction commits, never if it
aborts. A record's offset is known only when the commit copies it into the data
partition, so their answer's base offset is a floor, the partition's end as last known
(``KAFKA_TRANSACTION_PRODUCE_OFFSETS``; ``ProducedOffsets.floor``), or -1. As Kafka's
transactions v1 with partition verification, a batch for a partition the client did not
add (AddPartitionsToTxn) is refused: INVALID_TXN_STATE up to v10, TRANSACTION_ABORTABLE
in v11; a transactional Produce v12 comes from a client of transactions v2 (KIP-890),
whose first batch adds its partition. The coordinator's answers are mapped as Kafka maps
them (:mod:`.txn_codes`: 47 for a fenced epoch, 19 NOT_ENOUGH_REPLICAS, retried, while a
decision is applied).

acks=1 and acks=all both answer once Pulsar has stored the entry (a Pulsar write is
durable per the namespace's persistence policy); acks=0 gets no answer, and a failure
closes the connection, as Kafka does, so that the client notices.

The base offset: see :mod:`kop_dedup.pulsar.produced` (``KAFKA_PRODUCE_OFFSETS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from kop_dedup import errors
from kop_dedup.admission import ByteBudget
from kop_dedup.cluster.peers import PeerUnavailable
from kop_dedup.cluster.placement import Member
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.transports.kafka import topology, txn_codes
from kop_dedup.transports.kafka.batches import decode_batch, is_compressed, is_transactional
from kop_dedup.transports.kafka.forward import forward
from kop_dedup.transports.kafka.inflate import InflateBudget
from kop_dedup.transports.kafka.registry import Api, CloseConnection, Session

__all__ = ["APIS", "produce"]

_Topic = ProduceResponse.TopicProduceResponse
_Partition = _Topic.PartitionProduceResponse
_ACKS = (-1, 0, 1)
_MIN_SERVED = 3
_ON_LOOP_BYTES = 64 * 1024  # larger batches, and compressed ones, are decoded in a thread
_IMPLICIT_ADD_FROM = 12  # transactions v2 (KIP-890): the first batch adds its partition
Answer = tuple[int, errors.KafkaError | None, int]
"""(partition, error, base offset) for one partition's batch."""


def _partition(index: int, error: errors.KafkaError | None, base_offset: int = -1) -> Any:
    return _Partition(
        index=index,
        error_code=errors.NONE_ERRNO if error is None else error.errno,
        base_offset=base_offset,
        log_append_time_ms=-1,
        log_start_offset=-1,
        record_errors=[],
        error_message=None if error is None else error.message,
    )


class _Inflating(InflateBudget):
    """One request's inflate budget, reserved from its connection's (``held``)."""

    def __init__(self, limit: int, held: ByteBudget) -> None:
        super().__init__(limit)
        self.held = held
        self.reserved = min(limit, held.capacity)

    def settle(self) -> None:
        """Inflating is over: of the reservation keep what the batches hold."""
        keep = min(self.taken, self.reserved)
        self.held.release(self.reserved - keep)
        self.reserved = keep


@contextlib.asynccontextmanager
async def _inflating(session: Session) -> AsyncIterator[_Inflating]:
    """The request's inflate budget, once its connection has room for it (the request
    waits meanwhile); given back when the request is answered."""
    s = session.settings
    held = session.extra.get(__name__)
    if held is None:
        held = session.extra[__name__] = ByteBudget(s.kafka_max_connection_inflated_bytes)
    budget = _Inflating(s.kafka_max_request_inflated_bytes, held)
    await held.acquire(budget.reserved)
    try:
        yield budget
    finally:
        held.release(budget.reserved)


def _partitions(request: Any) -> list[tuple[str, Any]]:
    """(topic, partition data) of the request, a partition named twice once: with the
    data named last, at its first place (Kafka's ``KafkaApis`` keys them by partition)."""
    parts: dict[tuple[str, int], Any] = {}
    for t in request.topic_data:
        for p in t.partition_data:
            parts[(t.name, p.index)] = p
    return [(name, p) for (name, _), p in parts.items()]


async def _count(session: Session, topic: str, deadline: float) -> int | errors.KafkaError:
    """The topic's partition count, or the error its batch is answered: the count not
    read by ``deadline`` or the admin API failing give a retriable code
    (:meth:`~kop_dedup.produce.service.ProduceService.partition_count`)."""
    try:
        validate_topic(topic)
        return await session.runtime.service.partition_count(topic, deadline, create_with=None)
    except (errors.InvalidTopic, errors.UnknownTopicOrPartition):
        return errors.UnknownTopicOrPartition(f"topic {topic!r} does not exist")
    except errors.KafkaError as exc:
        return exc


async def _decoded(
    session: Session,
    version: int,
    topic: str,
    index: int,
    data: bytes,
    budget: InflateBudget,
    deadline: float,
) -> KafkaBatch | errors.KafkaError:
    """One partition's batch, checked; or the error it is answered."""
    count = await _count(session, topic, deadline)
    if isinstance(count, errors.KafkaError):
        return count
    if not 0 <= index < count:
        return errors.UnknownTopicOrPartition(
            f"topic {topic!r} has partitions 0..{count - 1}; got {index}"
        )
    s = session.settings
    decode = functools.partial(
        decode_batch,
        topic,
        index,
        data,
        produce_version=version,
        max_records=s.max_batch_records,
        max_bytes=s.max_batch_bytes,
        budget=budget,
    )
    try:
        if len(data) > _ON_LOOP_BYTES or is_compressed(data):
            return await asyncio.to_thread(decode)  # inflating or walking it takes a while
        return decode()
    except errors.KafkaError as exc:
        return exc


async def _one(session: Session, batch: KafkaBatch, deadline: float) -> Answer:
    """An idempotent (or plain) batch through the produce path."""
    runtime = session.runtime
    result = await runtime.service.produce(batch, deadline)
    offset = -1
    if result.message_id is not None:
        ptopic = runtime.service.naming.partition_topic(batch.topic, batch.partition)
        offset = await session.shared.offsets.base_offset(
            ptopic, result.message_id, len(batch.records)
        )
    return batch.partition, result.error, offset


async def _transactional(
    session: Session,
    version: int,
    transactional_id: str,
    batches: list[KafkaBatch],
    deadline: float,
) -> list[Answer]:
    """A request's transactional batches, in one call of the transaction coordinator."""
    runtime = session.runtime
    answers = await runtime.transactions.produce(
        transactional_id, batches, deadline, join=version >= _IMPLICIT_ADD_FROM
    )
    out: list[Answer] = []
    for batch, answer in zip(batches, answers, strict=True):
        if not answer.counted:
            runtime.stats.record(
                batch.topic,
                batch.producer_id,
                batch.producer_epoch,
                answer.error,
                len(batch.records),
                0.0,
            )
        error = None if answer.error is None else txn_codes.for_produce(version, answer.error)
        out.append((batch.partition, error, -1 if error is not None else _floor(session, batch)))
    return out


def _floor(session: Session, batch: KafkaBatch) -> int:
    """A transactional batch's base offset: where its records land at the lowest (they
    are copied once the transaction commits; see ``ProducedOffsets.floor``), or -1."""
    if session.settings.kafka_transaction_produce_offsets == "none":
        return -1
    naming = session.runtime.service.naming
    return session.shared.offsets.floor(naming.partition_topic(batch.topic, batch.partition))


async def _elsewhere(
    session: Session,
    version: int,
    request: Any,
    parts: list[tuple[str, Any]],
    indexes: list[int],
    owner: Member,
) -> list[Answer]:
    """Some of the request's batches, produced by the node that owns them: the
    transactional ones by their transactional id's coordinator (it journals them,
    whichever node leads their partitions), plain ones by their partition's leader
    (sidecar mode: the client reaches no other node)."""
    topics: dict[str, list[Any]] = {}
    for i in indexes:
        topics.setdefault(parts[i][0], []).append(parts[i][1])
    transactional = is_transactional(parts[indexes[0]][1].records or b"")
    sub = ProduceRequest(
        version=version,
        transactional_id=request.transactional_id if transactional else None,
        acks=-1,
        timeout_ms=request.timeout_ms,
        topic_data=[
            ProduceRequest.TopicProduceData(name=name, partition_data=datas)
            for name, datas in topics.items()
        ],
    )
    try:
        answer = await forward(session, owner, ProduceResponse, 0, version, sub)
    except PeerUnavailable as exc:
        session.runtime.cluster.stats.forward_failures += 1
        why = f"node {owner.node_id}, which owns them, could not be reached ({exc}); retry"
        unreachable: errors.KafkaError = (
            errors.NotEnoughReplicas(why) if transactional else errors.NotLeaderOrFollower(why)
        )
        return [(parts[i][1].index, unreachable, -1) for i in indexes]
    found = {(t.name, p.index): p for t in answer.responses for p in t.partition_responses}
    out: list[Answer] = []
    for i in indexes:
        name, data = parts[i]
        p = found.get((name, data.index))
        if p is None or p.error_code == errors.NONE_ERRNO:
            error = None if p is not None else errors.KafkaError(f"node {owner.node_id} lost it")
            out.append((data.index, error, -1 if p is None else p.base_offset))
            continue
        cls = errors.error_for_code(p.error_code)
        out.append((data.index, cls(p.error_message or cls.name), p.base_offset))
    return out


Led = dict[int, tuple[Member, list[int]]]
"""Leader node id -> (leader, indexes of the batches it leads)."""


async def _sort(
    session: Session,
    version: int,
    parts: list[tuple[str, Any]],
    budget: _Inflating,
    deadline: float,
) -> tuple[dict[int, Answer], dict[int, KafkaBatch], dict[int, KafkaBatch], Led]:
    """The request's partitions by where they go: (answered already: refused; plain
    batches produced here; transactional ones; plain ones led by other nodes, sidecar
    mode only: in cluster mode those are answered 6)."""
    datas = [p.records or b"" for _, p in parts]
    decoding = [
        _decoded(session, version, t, p.index, d, budget, deadline)
        for (t, p), d in zip(parts, datas, strict=True)
    ]
    # one partition (a producer's usual request): awaited here, no task to gather
    decoded = [await decoding[0]] if len(decoding) == 1 else await asyncio.gather(*decoding)
    budget.settle()
    results: dict[int, Answer] = {}
    plain: dict[int, KafkaBatch] = {}
    txn: dict[int, KafkaBatch] = {}
    led: Led = {}
    sidecar = session.runtime.cluster.mode == "sidecar" and not session.forwarded
    for i, ((_, p), batch) in enumerate(zip(parts, decoded, strict=True)):
        if isinstance(batch, errors.KafkaError):
            results[i] = (p.index, batch, -1)
        elif is_transactional(datas[i]):
            txn[i] = batch
        elif sidecar and (
            leader := await topology.leader_elsewhere(session, batch.topic, batch.partition)
        ):
            led.setdefault(leader.node_id, (leader, []))[1].append(i)
        elif refused := await topology.not_leader(session, batch.topic, batch.partition):
            results[i] = (p.index, refused, -1)
        else:
            plain[i] = batch
    return results, plain, txn, led


async def _all(
    session: Session,
    version: int,
    request: Any,
    parts: list[tuple[str, Any]],
    deadline: float,
    budget: _Inflating,
) -> list[Answer]:
    """Every partition's answer, in request order: idempotent batches side by side (6
    for a partition another node leads), the transactional ones together through the
    coordinator (here, or forwarded to it)."""
    results, plain, txn, led = await _sort(session, version, parts, budget, deadline)
    tid = request.transactional_id
    owner = None
    if txn and not session.forwarded and tid is not None:
        owner = session.runtime.cluster.txn_coordinator(tid)

    async def transactional() -> list[Answer]:
        if not txn:
            return []
        if owner is not None and not session.runtime.cluster.is_me(owner):
            return await _elsewhere(session, version, request, parts, list(txn), owner)
        return await _transactional(session, version, tid, list(txn.values()), deadline)

    async def to_leaders() -> None:
        answers = await asyncio.gather(
            *(_elsewhere(session, version, request, parts, ix, m) for m, ix in led.values())
        )
        for (_, ix), answered in zip(led.values(), answers, strict=True):
            results.update(zip(ix, answered, strict=True))

    if len(plain) == 1 and not txn and not led:  # the usual request: no task to gather
        ((i, only),) = plain.items()
        results[i] = await _one(session, only, deadline)
        return [results[i] for i in range(len(parts))]
    journaled, stored, _ = await asyncio.gather(
        transactional(),
        asyncio.gather(*(_one(session, b, deadline) for b in plain.values())),
        to_leaders(),
    )
    results.update(zip(txn, journaled, strict=True))
    results.update(zip(plain, stored, strict=True))
    return [results[i] for i in range(len(parts))]


async def produce(session: Session, request: Any, version: int) -> Any:
    if request.acks != 0:
        return await _produce(session, request, version)
    try:  # acks=0: whatever fails is told by closing the connection, never by an answer
        return await _produce(session, request, version)
    except CloseConnection:
        raise
    except Exception as exc:
        raise CloseConnection(
            f"a Produce with acks=0 failed ({exc!r}); closing the connection tells the client",
            kind="acks0_error",
        ) from exc


async def _produce(session: Session, request: Any, version: int) -> Any:
    s = session.settings
    acks = request.acks
    parts = _partitions(request)
    results: list[Answer]
    if acks not in _ACKS:
        results = [
            (p.index, errors.InvalidRequiredAcks(f"acks must be -1, 0 or 1; got {acks}"), -1)
            for _, p in parts
        ]
        by_topic = [t for t, _ in parts]
    elif request.transactional_id is None and any(
        is_transactional(p.records or b"") for _, p in parts
    ):
        raise errors.TransactionalIdAuthorizationFailed(
            "transactional records need the request's transactional id"
        )
    else:
        timeout_ms = request.timeout_ms if request.timeout_ms > 0 else s.default_timeout_ms
        deadline = time.monotonic() + min(timeout_ms, s.max_timeout_ms) / 1000
        async with _inflating(session) as budget:
            results = await _all(session, version, request, parts, deadline, budget)
        by_topic = [t for t, _ in parts]
    failed = [e for _, e, _ in results if e is not None]
    if acks == 0:
        if failed:
            raise CloseConnection(
                f"a Produce with acks=0 failed ({', '.join(sorted({e.name for e in failed}))}); "
                "closing the connection tells the client",
                kind="acks0_error",
            )
        return None
    return _response(version, zip(by_topic, results, strict=True))


def _response(version: int, answers: Iterable[tuple[str, Answer]]) -> Any:
    """The ProduceResponse: each (topic, answer) under its topic, in request order."""
    topics: dict[str, list[Any]] = {}
    for name, (index, error, offset) in answers:
        topics.setdefault(name, []).append(_partition(index, error, offset))
    return ProduceResponse(
        version=version,
        responses=[_Topic(name=n, partition_responses=p) for n, p in topics.items()],
        throttle_time_ms=0,
    )


def _error(request: Any, version: int, error: errors.KafkaError) -> Any:
    return _response(version, ((name, (p.index, error, -1)) for name, p in _partitions(request)))


APIS = (
    Api(
        key=0,
        name="Produce",
        request=ProduceRequest,
        versions=(0, 12),
        served_from=_MIN_SERVED,
        handle=produce,
        error_answer=_error,
        concurrent=True,
    ),
)
