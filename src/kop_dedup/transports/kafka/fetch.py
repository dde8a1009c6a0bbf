"""Fetch (v4-12): records by offset, one RecordBatch per stored entry, with a long poll.

As Kafka's ``ReplicaManager.fetchMessages`` answers a consumer:

- Partitions are read in request order, each up to its ``partition_max_bytes`` and
  all together up to ``max_bytes`` (at most ``KAFKA_FETCH_MAX_BYTES``); the first
  batch of the answer comes whole even when it is larger than both (KIP-74), so a
  consumer always makes progress. Later batches that do not fit stay for the next
  fetch.
- The answer goes once ``min_bytes`` are there, a partition has an error, or
  ``max_wait_ms`` (at most ``MAX_PULL_WAIT_MS``) has passed; meanwhile the fetch
  waits for a record to arrive on any of its partitions (pushed by Pulsar, not
  polled). A fetch of more than 16 partitions takes what each reader's client holds
  without asking the broker, then asks whether more is there for all its emptied
  partitions at once (:func:`_probe`); one the broker said drained within
  ``end_ttl_s`` is not asked again (what comes later is pushed).
- An offset before the earliest still stored or after the end is
  OFFSET_OUT_OF_RANGE (1); a topic that does not exist or a partition out of range
  UNKNOWN_TOPIC_OR_PARTITION (3); an error partition reports -1 watermarks.
- read_committed (isolation level 1) stops at the last stable offset (LSO): a committed
  transaction reaches a data partition as a copy, batch by batch, after EndTxn was
  answered, and a read_committed fetch never returns a record at or after the first
  record of a copy not whole yet (:mod:`kop_dedup.protocol.stable`: each copied batch
  says whose it is and how many records its transaction has there). The answer's
  ``last_stable_offset`` is that LSO, ``high_watermark`` the end. While a copy holds
  the LSO the fetch reads on to see it whole (the long poll waits for it), and a copy
  the data cannot settle is asked of the transaction log
  (:meth:`~kop_dedup.coordination.transactions.stable.StableOffsets.resolve`).
  ``aborted_transactions`` is always empty: double journaling keeps aborted data out
  of the data topics. read_uncommitted (level 0) reads to the end.
- Fetch sessions (KIP-227) are not kept: every answer has session id 0, as a broker
  with no session slots answers, so clients send full fetches. An incremental fetch
  (epoch other than 0 and -1) is FETCH_SESSION_ID_NOT_FOUND (70).

Readers stay open between fetches (:class:`~kop_dedup.pulsar.reader_pool.ReaderPool`):
the next fetch at the offset where one ended reads on without a lookup.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse

from kop_dedup import errors
from kop_dedup.coordination.transactions.stable import StableOffsets
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.fetching import EntryReader
from kop_dedup.pulsar.naming import validate_topic
from kop_dedup.pulsar.reader_pool import ReaderPool
from kop_dedup.transports.kafka import topology
from kop_dedup.transports.kafka.fetched import encode_entry
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["APIS", "fetch", "readers"]

log = logging.getLogger("kop_dedup.kafka")

_Topic = FetchResponse.FetchableTopicResponse
_Partition = _Topic.PartitionData
_FULL_EPOCHS = (0, -1)  # a full fetch that opens a session, one that opens none
_READ_COMMITTED = 1
_POLL_S = 0.01
_MANY_PARTITIONS = 16
"""A fetch of more partitions answers watermarks as known while they are asked again in
the background (:meth:`ReaderPool.watermarks`); a smaller one waits for them. It also
reads only what each reader's client holds, and asks the broker whether more is there
for all its emptied partitions at once (:func:`_probe`), not one after another."""
_PROBES_IN_FLIGHT = 64
_probing: set[asyncio.Future[None]] = set()
"""Probes a fetch stopped waiting for (its deadline passed): kept until they end."""


@dataclass(slots=True)
class _Part:
    topic: str
    index: int
    offset: int
    max_bytes: int
    reader: EntryReader | None = None
    error: errors.KafkaError | None = None
    batches: list[bytes] = field(default_factory=list)
    size: int = 0
    high: int = -1
    start: int = -1
    lso: int = -1
    asked: bool = False
    """The transaction log was asked about this partition's copies in this fetch."""


def readers(session: Session) -> ReaderPool:
    """The listener's kept readers, opened at its first read."""
    shared = session.shared
    if shared.readers is None:
        runtime = session.runtime
        shared.readers = ReaderPool(
            runtime.publisher.client, runtime.admin, positions=runtime.groups.positions
        )
    return shared.readers


async def partition_topic(session: Session, topic: str, index: int) -> str:
    """The Pulsar partition topic of a Kafka partition; UNKNOWN_TOPIC_OR_PARTITION when
    the topic does not exist (a name Pulsar refuses included) or has no such partition."""
    try:
        validate_topic(topic)
        count = await session.runtime.admin.partitions(topic, create_with=None)
    except (errors.InvalidTopic, errors.UnknownTopicOrPartition):
        raise errors.UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
    except Exception as exc:
        raise translate(exc, f"looking up topic {topic!r}") from exc
    if not 0 <= index < count:
        raise errors.UnknownTopicOrPartition(
            f"topic {topic!r} has partitions 0..{count - 1}; got {index}"
        )
    return session.runtime.naming.partition_topic(topic, index)


async def _unknown(session: Session, part: _Part) -> errors.KafkaError | None:
    """3 for a topic or partition that does not exist, before leadership is asked (the
    cluster's lookup of a leader would create a missing topic)."""
    try:
        await partition_topic(session, part.topic, part.index)
    except errors.KafkaError as exc:
        return exc
    return None


async def _open(session: Session, pool: ReaderPool, part: _Part) -> None:
    try:
        ptopic = await partition_topic(session, part.topic, part.index)
        part.reader = await pool.take(ptopic, part.offset)
        await part.reader.open()  # all of the fetch's new readers connect at once
    except Exception as exc:
        part.error = translate(exc, f"fetching {part.topic}-{part.index} at {part.offset}")
        if part.reader is not None:
            pool.discard(part.reader)
            part.reader = None


@dataclass(frozen=True, slots=True)
class _How:
    """How a fetch reads: ``committed`` (below the last stable offset); ``ask`` the
    broker whether more is there when a client's queue runs out (else :func:`_probe`
    asks for all at once), ``fresh_s``: a "nothing more" that recent still holds."""

    committed: bool
    ask: bool = True
    fresh_s: float = 0.0


async def _read(pool: ReaderPool, part: _Part, room: int, first: bool, how: _How) -> int:
    """Read into ``part`` up to ``room`` bytes (a whole first batch when ``first``);
    the bytes added."""
    reader = part.reader
    assert reader is not None
    try:
        entries = await reader.read(
            max(room, 1), committed=how.committed, ask=how.ask, fresh_s=how.fresh_s
        )
    except Exception as exc:
        part.error = translate(exc, f"reading {part.topic}-{part.index}")
        part.reader = None
        pool.discard(reader)
        return -part.size
    if reader.skipped_from is not None:
        part.error = errors.OffsetOutOfRange(
            f"{part.topic}-{part.index}: offset {reader.skipped_from} was deleted (retention) "
            "while it was being read"
        )
        return -part.size
    added = 0
    for n, entry in enumerate(entries):
        data = encode_entry(entry)
        if len(data) > room and not (first and added == 0):
            reader.unread(entries[n:])
            break
        part.batches.append(data)
        part.size += len(data)
        added += len(data)
        room -= len(data)
    return added


async def _pass(pool: ReaderPool, parts: list[_Part], max_bytes: int, total: int, how: _How) -> int:
    """One read of every partition in order, within the limits; the bytes added."""
    added = 0
    for part in parts:
        if part.reader is None or part.error is not None:
            continue
        room = min(part.max_bytes - part.size, max_bytes - total - added)
        if room <= 0 and total + added > 0:
            continue
        got = await _read(pool, part, room, total + added == 0, how)
        if part.error is not None:
            part.batches.clear()
            part.size = 0
        added += got
        if not how.ask:  # read on the loop's thread: let other requests in between
            await asyncio.sleep(0)
    return added


async def _wait(parts: list[_Part], left: float, read: bool, committed: bool) -> bool:
    """Wait for a record to arrive on any partition with room left (up to ``left`` s);
    False when there is nothing to wait for."""
    waits, ready = [], False
    for part in parts:
        if part.reader is None or part.error is not None or part.size >= part.max_bytes:
            continue
        arrival = await part.reader.arrival(committed=committed)
        if arrival is None:
            ready = True
        else:
            waits.append(arrival)
    if ready:
        if not read:  # said readable, gave nothing (a slow delivery): do not spin
            await asyncio.sleep(min(_POLL_S, left))
        return True
    if not waits:
        return False
    await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    return True


async def _fill(
    pool: ReaderPool,
    parts: list[_Part],
    max_bytes: int,
    min_bytes: int,
    deadline: float,
    stable: StableOffsets | None,
) -> None:
    """Read until ``min_bytes`` are there, a partition fails, or the deadline (``stable``:
    read_committed, with the log to settle the copies the data cannot)."""
    total = 0
    committed = stable is not None
    many = len(parts) > _MANY_PARTITIONS
    how = _How(committed, not many, pool.limits.end_ttl_s if many else 0.0)
    while True:
        added = await _pass(pool, parts, max_bytes, total, how)
        total += added
        if total >= min(min_bytes, max_bytes) or any(p.error is not None for p in parts):
            return  # enough, or all there is room for (a min_bytes over max_bytes), or an error
        if many:
            await _probe(parts, deadline)
        if stable is not None and await _settle(stable, parts):
            continue  # a copy the log settled: read on at once
        left = deadline - time.monotonic()
        if left <= 0 or not await _wait(parts, left, added > 0, committed):
            return


async def _probe(parts: list[_Part], deadline: float) -> None:
    """Ask the broker, for every partition whose client's queue ran out unasked, whether
    it has more (GetLastMessageId; ``_PROBES_IN_FLIGHT`` at a time, until the deadline):
    a fetch of 512 caught-up partitions waits for one round trip, not 512 in a row."""
    readers = [
        p.reader
        for p in parts
        if p.reader is not None and p.error is None and p.reader.unasked and p.size < p.max_bytes
    ]
    if not readers:
        return
    slots = asyncio.Semaphore(_PROBES_IN_FLIGHT)

    async def probe(reader: EntryReader) -> None:
        async with slots:
            try:
                await reader.probe()
            except Exception as exc:  # the next read of the partition asks again
                log.debug("kafka fetch: probing %s: %r", reader.topic, exc)

    tasks = [asyncio.ensure_future(probe(r)) for r in readers]
    _, late = await asyncio.wait(tasks, timeout=max(deadline - time.monotonic(), _POLL_S))
    for task in late:  # never cancelled under the client's call: ends on its own
        _probing.add(task)
        task.add_done_callback(_probing.discard)


async def _settle(stable: StableOffsets, parts: list[_Part]) -> bool:
    """Ask the log (once per partition and fetch) about the copies holding a partition's
    last stable offset that its data cannot settle; whether one was settled."""
    settled = False
    now = time.monotonic()
    for part in parts:
        reader = part.reader
        if reader is None or part.error is not None or part.asked:
            continue
        if reader.stable.to_ask(now):
            part.asked = True
            try:
                settled = await stable.resolve(reader.stable) or settled
            except Exception as exc:  # the log is away: the copy holds the LSO meanwhile
                log.warning("kafka fetch: asking the log about %s: %r", reader.topic, exc)
    return settled


async def _stable_offset(stable: StableOffsets, part: _Part) -> None:
    """The answer's last stable offset: the reader's, or, while a copy it met without its
    beginning is still being copied, the partition's own (that copy began before)."""
    assert part.reader is not None
    tracker = part.reader.stable
    part.lso = min(tracker.lso, part.high)
    held = tracker.open_copies()
    if held and not held[0].from_start and held[0].settled is None:
        try:
            part.lso = min(part.lso, await stable.exact(part.topic, part.index))
        except Exception as exc:
            part.error = translate(exc, f"the last stable offset of {part.topic}-{part.index}")


async def _watermarks(pool: ReaderPool, part: _Part, many: bool) -> None:
    assert part.reader is not None
    try:
        part.high, part.start = await pool.watermarks(part.reader.topic, part.reader, many=many)
    except Exception as exc:  # the records read still go; the end is at least theirs
        log.warning("kafka fetch: no watermarks for %s: %r", part.reader.topic, exc)
        part.high, part.start = part.reader.read_offset, -1


async def fetch(session: Session, request: Any, version: int) -> Any:
    if version >= 7 and request.session_epoch not in _FULL_EPOCHS:
        return _session_error(
            version,
            errors.FetchSessionIdNotFound(
                f"fetch session {request.session_id} (epoch {request.session_epoch}) is not "
                "known: this broker keeps no fetch sessions; send full fetches"
            ),
        )
    if request.isolation_level not in (0, _READ_COMMITTED):
        raise errors.InvalidRequest(f"unknown isolation level {request.isolation_level}")
    pool = readers(session)
    parts = [
        _Part(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
        for t in request.topics
        for p in t.partitions
    ]
    for part in parts:
        part.error = await _unknown(session, part) or await topology.not_leader(
            session, part.topic, part.index
        )
    settings = session.settings
    wait_ms = min(max(request.max_wait_ms, 0), settings.max_pull_wait_ms)
    deadline = time.monotonic() + wait_ms / 1000
    stable = session.runtime.stable if request.isolation_level == _READ_COMMITTED else None
    try:
        await asyncio.gather(*(_open(session, pool, p) for p in parts if p.error is None))
        max_bytes = min(request.max_bytes, settings.kafka_fetch_max_bytes)
        await _fill(pool, parts, max_bytes, request.min_bytes, deadline, stable)
        many = len(parts) > _MANY_PARTITIONS
        await asyncio.gather(
            *(_watermarks(pool, p, many) for p in parts if p.reader is not None and p.error is None)
        )
        if stable is not None:
            for part in parts:
                if part.reader is not None and part.error is None:
                    await _stable_offset(stable, part)
    finally:
        for part in parts:
            if part.reader is not None:
                pool.give(part.reader)
    return _answer(request, version, parts)


def _partition(part: _Part, committed: bool) -> Any:
    error = part.error
    if error is not None:
        return _Partition(
            partition_index=part.index,
            error_code=error.errno,
            high_watermark=-1,
            last_stable_offset=-1,
            log_start_offset=-1,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=b"",
        )
    return _Partition(
        partition_index=part.index,
        error_code=errors.NONE_ERRNO,
        high_watermark=part.high,
        last_stable_offset=part.lso if committed else part.high,
        log_start_offset=part.start,
        aborted_transactions=[] if committed else None,
        preferred_read_replica=-1,
        records=b"".join(part.batches),
    )


def _answer(request: Any, version: int, parts: list[_Part]) -> Any:
    committed = request.isolation_level == _READ_COMMITTED
    topics: dict[str, list[Any]] = {}
    for part in parts:
        topics.setdefault(part.topic, []).append(_partition(part, committed))
    return FetchResponse(
        version=version,
        throttle_time_ms=0,
        error_code=errors.NONE_ERRNO,
        session_id=0,
        responses=[_Topic(topic=name, partitions=p) for name, p in topics.items()],
    )


def _session_error(version: int, error: errors.KafkaError) -> Any:
    return FetchResponse(
        version=version, throttle_time_ms=0, error_code=error.errno, session_id=0, responses=[]
    )


def _error(request: Any, version: int, error: errors.KafkaError) -> Any:
    """Every partition asked (and the request, v7+) answered with ``error``."""
    parts = [
        _Part(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes, error=error)
        for t in request.topics
        for p in t.partitions
    ]
    answer = _answer(request, version, parts)
    answer.error_code = error.errno
    return answer


APIS = (
    Api(
        key=1,
        name="Fetch",
        request=FetchRequest,
        versions=(4, 12),
        handle=fetch,
        error_answer=_error,
    ),
)
