"""Keyed tables kept in Pulsar topics: read into local state, caught up on demand.

A *keyed table* is a topic of keyed records in which the latest record of a key
is what counts; a record with an empty payload is a *tombstone* that removes its
key. Pulsar topic compaction keeps exactly that (the latest record per key, no
tombstones), so a table is read with ``read_compacted``: once the broker has
compacted the topic, a fresh reader reads about one record per live key plus
what was written since the last compaction, however long the history.

What the owner of a table (a coordinator) gets here::

    state = LatestRecords()                      # or the owner's own apply function
    table = KeyedTable(client, topic, state.apply)
    await table.catch_up()                       # every record written so far is applied
    await table.barrier()                        # the same, coalesced across callers
    writer = KeyedWriter(client, topic)          # any number of writers per topic
    await writer.send("key", b"value")           # durable when it returns
    await writer.tombstone("key")

``apply`` sees every keyed record in topic order, tombstones included (``value
is None``), exactly once per table object; a replaced reader restarts after the
last record applied, and so does the reader of a catch-up cut short (cancelled, so
that records its worker thread took are read again, never skipped; when ``apply``
raises anything but ValueError or KeyError, the records of that read before it are
applied again). A reader given up while its worker thread still reads on it (the
catch-up cancelled, or its chunk not read within ``_CHUNK_WAIT_S``) is closed once that
thread returns, never under it. Messages without a key are skipped: after compaction, a
batch keeps the slots of its removed records as empty messages without a key,
which the C++ client (pulsar-client 3.13) hands out where the Java client skips
them (``compactedOut``). A coordinator that must be the only writer of its table
uses :class:`kop_dedup.pulsar.exclusive.FencedWriter` instead of
:class:`KeyedWriter`.

Pulsar 4.0.x keeps a *non-batched* empty-payload message from the C++ client in
the compacted ledger (seen on 4.0.8; fixed later by apache/pulsar#25817): writers
here therefore send through a batching producer, whose single-message batches
are compacted as tombstones (tests/integration/test_tables.py checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pulsar
import pulsar.asyncio as pulsar_async

__all__ = [
    "CompactTopic",
    "Discards",
    "KeyedTable",
    "KeyedWriter",
    "LatestRecords",
    "PulsarClient",
    "TableRecord",
    "discard",
    "read_last",
]

log = logging.getLogger(__name__)

PulsarClient: TypeAlias = pulsar_async.Client
"""The asyncio Pulsar client the adapters are built on (coordinators only pass it on)."""

CompactTopic: TypeAlias = Callable[[str], Awaitable[None]]
"""Asks the broker to compact a topic (``PulsarAdmin.compact``)."""

_COMPACTION_SLACK = 1000
_DISCARD_WAIT_S = 5.0
_PROBE_WAIT_S = 5.0
_CHUNK_MESSAGES = 10_000
_CHUNK_WAIT_S = 10.0
"""How long a catch-up waits for one chunk read on a worker thread; past it the reader
is replaced (the chunk is read again by the next one) and closed once the thread,
which reads on, returns."""
_SEND_TIMEOUT_MS = 30_000


@dataclass(frozen=True, slots=True)
class TableRecord:
    """One record of a keyed table, as read (or about to be written)."""

    key: str
    value: bytes | None
    """The payload; ``None`` for a tombstone (an empty payload)."""
    publish_time_ms: int
    """When the broker stored it (its clock, epoch milliseconds)."""
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


def _record(msg: Any) -> TableRecord:
    """A TableRecord from a message of either the sync or the asyncio API."""
    data = msg.data()
    return TableRecord(msg.partition_key(), data or None, msg.publish_timestamp(), msg.properties())


async def discard(handle: Any) -> None:
    """Close a reader or producer we stop using, without waiting on a dead broker."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(handle.close(), _DISCARD_WAIT_S)


class Discards:
    """Readers given up mid-read (no await: the read may be cancelled), each closed in
    the background (:func:`discard`) once the read still running on it on a worker
    thread, if any, is done with it; :meth:`wait` at close."""

    def __init__(self) -> None:
        self._closing: set[asyncio.Future[None]] = set()

    def later(self, handle: Any, after: asyncio.Future[Any] | None = None) -> None:
        closing = asyncio.ensure_future(_discard_after(handle, after))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def wait(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def _discard_after(handle: Any, after: asyncio.Future[Any] | None) -> None:
    if after is not None:
        await asyncio.wait([after])
        if not after.cancelled():
            after.exception()  # seen: the read that awaited it failed or went
    await discard(handle)


async def read_last(client: PulsarClient, topic: str) -> TableRecord | None:
    """The topic's last message (not compacted: keyed or not), or None when it is empty.

    A reader started at the latest message seeks to it; a connection that drops during
    the seek fails it ("Failed to seek: ResultDisconnected"), and the reader is replaced
    once, as :meth:`KeyedTable.catch_up` does; a second failure is the caller's."""
    try:
        return await _read_last_once(client, topic)
    except (pulsar_async.PulsarException, pulsar.PulsarException, TimeoutError) as exc:
        log.info("replacing the reader of the last message of %s after %r", topic, exc)
    return await _read_last_once(client, topic)


async def _read_last_once(client: PulsarClient, topic: str) -> TableRecord | None:
    reader = await client.create_reader(
        topic, pulsar.MessageId.latest, start_message_id_inclusive=True
    )
    try:
        if await asyncio.wait_for(reader.has_message_available(), _PROBE_WAIT_S):
            return _record(await asyncio.wait_for(reader.read_next(), _PROBE_WAIT_S))
        return None
    finally:
        await discard(reader)


def _observed(future: asyncio.Future[None]) -> asyncio.Future[None]:
    """A shared future whose failure is read even when every waiter gave up
    (their deadlines passed): asyncio would log it as never retrieved."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


@dataclass(slots=True)
class _Chunk:
    records: list[TableRecord]
    skipped: int
    last: Any
    more: bool


def _read_chunk(reader: Any, limit: int) -> _Chunk:
    """Up to ``limit`` messages that the reader knows to be there, on a worker thread.

    The asyncio API costs a future and two loop hops per message (about 40 us: 4 s
    for 100,000 records); the blocking calls on a worker thread cost a fraction.
    ``reader`` is the client's own (``_pulsar.Reader``); a read that does not come
    within ``_PROBE_WAIT_S`` raises (the caller replaces the reader), and nothing of
    the chunk is applied, so the replacement reads it again.
    """
    records: list[TableRecord] = []
    skipped = 0
    while True:
        msg = reader.read_next(int(_PROBE_WAIT_S * 1000))
        if msg.partition_key():
            records.append(_record(msg))
        else:  # a compacted-out slot, or a stray unkeyed message
            skipped += 1
        more = reader.has_message_available()
        if not more or len(records) + skipped >= limit:
            return _Chunk(records, skipped, msg.message_id(), more)


class KeyedTable:
    """A local view of a keyed topic, caught up on demand by one reader.

    ``apply(record)`` is called for every record in topic order, on the event
    loop; a ``ValueError`` or ``KeyError`` from it skips the record with a
    warning (a malformed record must not stop a sidecar from starting).

    A reader that lost its broker (restarted, moved) is replaced by a new one
    that starts after the last record applied: the client's own reconnection
    waits out an exponential backoff that can outlast the outage by tens of
    seconds, and until then every catch-up would fail or wait for the client's
    operation timeout. Records are keyed, so reading one twice would be harmless.
    """

    def __init__(
        self,
        client: PulsarClient,
        topic: str,
        apply: Callable[[TableRecord], None],
        *,
        read_compacted: bool = True,
        compact: CompactTopic | None = None,
    ) -> None:
        self.topic = topic
        self._client, self._apply, self._compacted = client, apply, read_compacted
        self._compact = compact
        self._reader: Any = None
        self._last: Any = None
        self._lock = asyncio.Lock()
        self._given_up = Discards()
        self._thread: asyncio.Future[_Chunk] | None = None
        """The chunk read running on a worker thread, on :attr:`_reader`."""
        self._running: asyncio.Future[None] | None = None
        self._queued: asyncio.Future[None] | None = None
        self.records_read = 0
        """Records applied since this table was created (tombstones included)."""
        self.catch_ups = 0
        """Catch-ups that succeeded (each one broker round trip at least)."""
        self.caught_up_from: float | None = None
        """When (``time.monotonic``) the last catch-up that succeeded began: every record
        written before then is applied here."""
        self.slots_skipped = 0
        """Messages without a key skipped: compacted-out slots of batches, which the C++
        client hands out as empty messages (the Java client skips them), or strays."""

    async def catch_up(self) -> int:
        """Apply every record written so far (by anyone); return how many were new.

        A reader the broker no longer knows (it reports connected, but its
        subscription went with the old broker) fails, or does not answer within
        ``_PROBE_WAIT_S``, once and is replaced at once; a second failure is the
        caller's.

        A catch-up cut short in any other way (cancelled: a state partition's load
        when the partition moves on mid-load; or ``apply`` raising) gives its reader
        up too: the worker thread may have taken records from it that were never
        applied, and the same reader would go on after them (a new owner then
        answered from a view without them). The next catch-up reads from the last
        record applied.
        """
        async with self._lock:
            before = self.records_read
            if self._reader is not None and not self._reader.is_connected():
                log.info("replacing the disconnected reader of %s", self.topic)
                await self._drop_reader()
            for may_retry in (True, False):
                began = time.monotonic()
                try:
                    await self._read_to_end()
                except (pulsar_async.PulsarException, pulsar.PulsarException, TimeoutError) as exc:
                    self._abandon_reader()  # the retry, or the next catch-up, starts afresh
                    if not may_retry:
                        raise
                    log.info("replacing the reader of %s after %r", self.topic, exc)
                except BaseException:
                    self._abandon_reader()
                    raise
                else:
                    self.caught_up_from = max(began, self.caught_up_from or began)
                    self.catch_ups += 1
                    break
            return self.records_read - before

    async def restart(self, reset: Callable[[], None]) -> None:
        """Read the topic again from its start at the next catch-up; ``reset`` (the
        caller's state dropped) runs first, while no catch-up runs."""
        async with self._lock:
            await self._drop_reader()
            self._last = None
            reset()

    def compaction_due(self, live_keys: int) -> bool:
        """Reading cost far more records than the table keeps keys (> 2x + 1000)."""
        return self.records_read > 2 * live_keys + _COMPACTION_SLACK

    async def compact_if_due(self, live_keys: int) -> bool:
        """Ask the broker to compact the topic when :meth:`compaction_due`, so the next
        reader reads about one record per key; True when asked.

        Meant for right after the first catch-up. A failure is logged, not raised:
        compaction only saves start-up time.
        """
        if self._compact is None or not self.compaction_due(live_keys):
            return False
        log.info(
            "asking the broker to compact %s: read %d records for %d keys",
            self.topic,
            self.records_read,
            live_keys,
        )
        try:
            await self._compact(self.topic)
        except Exception as exc:  # any failure: the table works uncompacted, only slower
            log.warning("could not ask for compaction of %s: %s", self.topic, exc)
            return False
        return True

    async def barrier(self) -> None:
        """Return once every record written before this call is applied here.

        Coalesced: one catch-up (one broker round trip when nothing is new)
        serves every caller that arrived before it started, so concurrent
        callers share the cost. A caller arriving while one runs waits for the
        next, which is the first that surely started after it. Shielded: a
        caller that gives up does not cancel the catch-up others wait on.
        """
        await asyncio.shield(self.barrier_future())

    def barrier_future(self) -> asyncio.Future[None]:
        """The shared catch-up that serves a caller arriving now (see :meth:`barrier`),
        for a caller that awaits it its own way; never cancel it."""
        if self._running is None:
            return self._start_barrier()
        if self._queued is None:
            self._queued = _observed(asyncio.ensure_future(self._run_after(self._running)))
        return self._queued

    def _start_barrier(self) -> asyncio.Future[None]:
        self._running = _observed(asyncio.ensure_future(self._run_barrier()))
        return self._running

    async def _run_barrier(self) -> None:
        try:
            await self.catch_up()
        finally:
            self._running = None

    async def _run_after(self, running: asyncio.Future[None]) -> None:
        with contextlib.suppress(Exception):
            await running
        self._queued = None
        await (self._running if self._running is not None else self._start_barrier())

    async def _read_to_end(self) -> None:
        if self._reader is None:
            self._reader = await self._client.create_reader(
                self.topic,
                self._last or pulsar.MessageId.earliest,
                is_read_compacted=self._compacted,
            )
        # a reader whose connection is gone can wait out the client's whole operation
        # timeout here (30 s, as long as a request): give up sooner and replace it
        more = await asyncio.wait_for(self._reader.has_message_available(), _PROBE_WAIT_S)
        loop = asyncio.get_running_loop()
        while more:
            self._thread = loop.run_in_executor(
                None, _read_chunk, self._reader._reader, _CHUNK_MESSAGES
            )
            # shielded: cut short (cancelled, or past _CHUNK_WAIT_S), the thread reads on,
            # and the reader is closed once it returns (_abandon_reader)
            chunk = await asyncio.wait_for(asyncio.shield(self._thread), _CHUNK_WAIT_S)
            self._thread = None
            for record in chunk.records:
                try:
                    self._apply(record)
                except (ValueError, KeyError) as exc:
                    log.warning("skipping malformed record in %s: %s", self.topic, exc)
            self.records_read += len(chunk.records)
            self.slots_skipped += chunk.skipped
            self._last, more = chunk.last, chunk.more

    async def _drop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await discard(reader)

    def _abandon_reader(self) -> None:
        """Give the reader up at once (no await: the catch-up may be cancelled); it is
        closed in the background once the chunk read still running on it on a worker
        thread, if any, returns: a close while another thread is inside ``read_next`` or
        ``has_message_available`` on the same reader races in the C++ client."""
        reader, self._reader = self._reader, None
        thread, self._thread = self._thread, None
        if reader is not None:
            self._given_up.later(reader, thread)

    async def close(self) -> None:
        async with self._lock:
            await self._drop_reader()
        await self._given_up.wait()


class LatestRecords:
    """The plainest state of a table: the latest record per key; tombstones remove.

    Use its ``apply`` as a :class:`KeyedTable`'s, then read it like a mapping.
    """

    def __init__(self) -> None:
        self._latest: dict[str, TableRecord] = {}

    def apply(self, record: TableRecord) -> None:
        if record.value is None:
            self._latest.pop(record.key, None)
        else:
            self._latest[record.key] = record

    def get(self, key: str) -> TableRecord | None:
        return self._latest.get(key)

    def items(self) -> Iterator[tuple[str, TableRecord]]:
        return iter(list(self._latest.items()))

    def __len__(self) -> int:
        return len(self._latest)

    def __contains__(self, key: object) -> bool:
        return key in self._latest


class KeyedWriter:
    """Writes keyed records to a table topic through one shared producer.

    Any number of writers, in any number of sidecars, may write one topic: use
    it for tables whose records are idempotent or ordered by the reader (the
    highest epoch wins), not for a table with one owner. A producer that lost
    its broker is replaced at the next send: a new producer connects at once,
    the old one only after the client's backoff.
    """

    def __init__(self, client: PulsarClient, topic: str) -> None:
        self.topic = topic
        self._client = client
        self._producer: Any = None
        self._lock = asyncio.Lock()

    async def _current(self) -> Any:
        async with self._lock:  # concurrent first writers share one producer
            if self._producer is not None and not self._producer.is_connected():
                log.info("replacing the disconnected writer of %s", self.topic)
                old, self._producer = self._producer, None
                await discard(old)
            if self._producer is None:
                self._producer = await self._client.create_producer(
                    self.topic,
                    send_timeout_millis=_SEND_TIMEOUT_MS,
                    # batched, so that Pulsar 4.0.x compaction removes tombstones
                    batching_enabled=True,
                    batching_max_publish_delay_ms=1,
                )
            return self._producer

    async def send(
        self, key: str, value: bytes, *, properties: Mapping[str, str] | None = None
    ) -> None:
        """Store ``key -> value``; durable when this returns."""
        if not value:
            raise ValueError("an empty value is a tombstone: call tombstone()")
        producer = await self._current()
        await producer.send(value, partition_key=key, properties=dict(properties or {}))

    async def tombstone(self, key: str, *, properties: Mapping[str, str] | None = None) -> None:
        """Remove ``key`` (an empty payload; compaction drops the key)."""
        producer = await self._current()
        await producer.send(b"", partition_key=key, properties=dict(properties or {}))

    async def close(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await discard(producer)
