"""Producer ids, epochs and transactional ids: state kept in Pulsar, not here.

Three topics in the system namespace (infinite retention, dedup on):

``producer-id-blocks``
    Blocks of 1000 producer ids. A sidecar claims the next block while it is
    the only holder of the producer name ``<prefix>-producer-id-allocator``
    (Pulsar refuses a second producer with the same name: ProducerBusy, so the
    name is a cluster-wide mutex). The block number is the message's sequence
    id minus one and its payload, so the claim survives broker restarts through
    dedup state and, should that be purged, through the last message.

``producer-epochs``
    Keyed ``producerId -> epoch`` records; the highest epoch seen for a
    producer id fences all lower ones (INVALID_PRODUCER_EPOCH). Every sidecar
    replays it at start and catches up again before it trusts its memory.

``transactional-ids``
    Keyed ``transactionalId -> {"producerId", "producerEpoch"}``; updated under
    the name mutex ``<prefix>-transaction-coordinator``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_async

from kop_dedup import errors
from kop_dedup.protocol.records import MAX_EPOCH

__all__ = ["EpochRegistry", "ProducerIdAllocator", "Registry", "TransactionalIds"]

log = logging.getLogger(__name__)

BLOCK_SIZE = 1000
_MUTEX_WAIT_S = 30.0
_DISCARD_WAIT_S = 5.0
_PROBE_WAIT_S = 5.0


class _Mutex:
    """Hold a uniquely named Pulsar producer for the duration of a critical section."""

    def __init__(self, client: pulsar_async.Client, topic: str, name: str) -> None:
        self._client, self._topic, self._name = client, topic, name
        self.producer: pulsar_async.Producer | None = None

    async def __aenter__(self) -> pulsar_async.Producer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _MUTEX_WAIT_S
        delay = 0.02
        while True:
            try:
                self.producer = await self._client.create_producer(
                    self._topic,
                    producer_name=self._name,
                    batching_enabled=False,
                    send_timeout_millis=30_000,
                )
            except pulsar_async.PulsarException as exc:
                if exc.error().name != "ProducerBusy" or loop.time() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
            else:
                return self.producer

    async def __aexit__(self, *exc: object) -> None:
        if self.producer is not None:
            await self.producer.close()


async def _last_message(client: pulsar_async.Client, topic: str) -> pulsar.Message | None:
    reader = await client.create_reader(
        topic, pulsar.MessageId.latest, start_message_id_inclusive=True
    )
    try:
        if await reader.has_message_available():
            return await reader.read_next()
        return None
    finally:
        await reader.close()


class ProducerIdAllocator:
    """Hands out producer ids unique across every sidecar on the cluster."""

    def __init__(self, client: pulsar_async.Client, topic: str, prefix: str) -> None:
        self._client, self._topic = client, topic
        self._mutex_name = f"{prefix}-producer-id-allocator"
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                block = await self._claim_block()
                self._next, self._end = block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE
            pid = self._next
            self._next += 1
            return pid

    async def _claim_block(self) -> int:
        async with _Mutex(self._client, self._topic, self._mutex_name) as producer:
            last = producer.last_sequence_id() - 1  # -2 when the broker knows none
            msg = await _last_message(self._client, self._topic)
            if msg is not None:
                last = max(last, int(msg.data()))
            block = last + 1 if last >= 0 else 0
            receipt = await producer.send(str(block).encode(), sequence_id=block + 1)
            if receipt.ledger_id() == -1 and receipt.entry_id() == -1:
                raise errors.KafkaStorageError(
                    f"producer id block {block} was already claimed; retry"
                )
            log.info("claimed producer id block %d", block)
            return block


async def _discard(handle: pulsar_async.Reader | pulsar_async.Producer) -> None:
    """Close a reader or producer we stop using, without waiting on a dead broker."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(handle.close(), _DISCARD_WAIT_S)


class _KeyedTable:
    """A local view of a keyed topic, caught up on demand by one reader.

    A reader that lost its broker (restarted, moved) is replaced by a new one
    that starts after the last record applied: the client's own reconnection
    waits out an exponential backoff that can outlast the outage by tens of
    seconds, and until then every catch-up would fail or wait for the client's
    operation timeout. The records are keyed and idempotent, so seeing one
    again would be harmless.
    """

    def __init__(
        self, client: pulsar_async.Client, topic: str, apply: Callable[[str, bytes], None]
    ) -> None:
        self._client, self._topic, self._apply = client, topic, apply
        self._reader: pulsar_async.Reader | None = None
        self._last: pulsar.MessageId | None = None
        self._lock = asyncio.Lock()

    async def catch_up(self) -> None:
        """Apply every record written so far (by any sidecar).

        A reader the broker no longer knows (it reports connected, but its
        subscription went with the old broker) fails, or does not answer within
        ``_PROBE_WAIT_S``, once and is replaced at once; a second failure is the
        caller's.
        """
        async with self._lock:
            if self._reader is not None and not self._reader.is_connected():
                log.info("replacing the disconnected reader of %s", self._topic)
                await self._drop_reader()
            for may_retry in (True, False):
                try:
                    await self._read_to_end()
                except (pulsar_async.PulsarException, TimeoutError) as exc:
                    await self._drop_reader()  # the retry, or the next catch-up, starts afresh
                    if not may_retry:
                        raise
                    log.info("replacing the reader of %s after %r", self._topic, exc)
                else:
                    return

    async def _read_to_end(self) -> None:
        if self._reader is None:
            self._reader = await self._client.create_reader(
                self._topic, self._last or pulsar.MessageId.earliest
            )
        # a reader whose connection is gone can wait out the client's whole operation
        # timeout here (30 s, as long as a request): give up sooner and replace it
        while await asyncio.wait_for(self._reader.has_message_available(), _PROBE_WAIT_S):
            msg = await self._reader.read_next()
            try:
                self._apply(msg.partition_key(), msg.data())
            except (ValueError, KeyError) as exc:
                log.warning("skipping malformed record in %s: %s", self._topic, exc)
            self._last = msg.message_id()

    async def _drop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await _discard(reader)

    async def close(self) -> None:
        await self._drop_reader()


def _observed(future: asyncio.Future[None]) -> asyncio.Future[None]:
    """A shared future whose failure is read even when every waiter gave up
    (their deadlines passed): asyncio would log it as never retrieved."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


class EpochRegistry:
    """Highest epoch per producer id, durable in Pulsar."""

    def __init__(self, client: pulsar_async.Client, topic: str) -> None:
        self._client, self._topic = client, topic
        self._highest: dict[int, int] = {}
        self._table = _KeyedTable(client, topic, self._apply)
        self._producer: pulsar_async.Producer | None = None
        self._running: asyncio.Future[None] | None = None
        self._queued: asyncio.Future[None] | None = None
        self._producer_lock = asyncio.Lock()

    def _apply(self, key: str, data: bytes) -> None:
        pid, epoch = int(key), int(data)
        if epoch > self._highest.get(pid, -1):
            self._highest[pid] = epoch

    def highest(self, producer_id: int) -> int | None:
        return self._highest.get(producer_id)

    async def catch_up(self) -> None:
        await self._table.catch_up()

    async def barrier(self) -> None:
        """Return once every epoch written before this call is applied here.

        Coalesced: one catch-up (one broker round trip when nothing is new)
        serves every caller that arrived before it started, so concurrent
        batches share the cost. A caller arriving while one runs waits for the
        next, which is the first that surely started after it.
        """
        if self._running is None:
            await asyncio.shield(self._start_barrier())
            return
        if self._queued is None:
            self._queued = _observed(asyncio.ensure_future(self._run_after(self._running)))
        await asyncio.shield(self._queued)

    def _start_barrier(self) -> asyncio.Future[None]:
        self._running = _observed(asyncio.ensure_future(self._run_barrier()))
        return self._running

    async def _run_barrier(self) -> None:
        try:
            await self._table.catch_up()
        finally:
            self._running = None

    async def _run_after(self, running: asyncio.Future[None]) -> None:
        with contextlib.suppress(Exception):
            await running
        self._queued = None
        await (self._running if self._running is not None else self._start_barrier())

    async def raise_to(self, producer_id: int, epoch: int) -> None:
        """Record ``epoch`` for ``producer_id`` durably before anything relies on it."""
        if epoch <= self._highest.get(producer_id, -1):
            return
        async with self._producer_lock:  # concurrent first writers share one producer
            if self._producer is not None and not self._producer.is_connected():
                # as with the reader: a new producer connects at once, the old one
                # only after its backoff; epoch records are idempotent
                log.info("replacing the disconnected epoch producer on %s", self._topic)
                old, self._producer = self._producer, None
                await _discard(old)
            if self._producer is None:
                self._producer = await self._client.create_producer(
                    self._topic, batching_enabled=False, send_timeout_millis=30_000
                )
            producer = self._producer
        await producer.send(str(epoch).encode(), partition_key=str(producer_id))
        self._apply(str(producer_id), str(epoch).encode())

    async def close(self) -> None:
        await self._table.close()
        if self._producer is not None:
            await self._producer.close()


class TransactionalIds:
    """transactionalId -> (producer id, epoch); each init bumps the epoch."""

    def __init__(
        self,
        client: pulsar_async.Client,
        topic: str,
        prefix: str,
        allocator: ProducerIdAllocator,
        epochs: EpochRegistry,
    ) -> None:
        self._client, self._topic = client, topic
        self._mutex_name = f"{prefix}-transaction-coordinator"
        self._allocator, self._epochs = allocator, epochs
        self._ids: dict[str, tuple[int, int]] = {}
        self._table = _KeyedTable(client, topic, self._apply)

    def _apply(self, key: str, data: bytes) -> None:
        doc: dict[str, Any] = json.loads(data)
        self._ids[key] = (int(doc["producerId"]), int(doc["producerEpoch"]))

    async def init(self, transactional_id: str) -> tuple[int, int]:
        async with _Mutex(self._client, self._topic, self._mutex_name) as producer:
            await self._table.catch_up()
            current = self._ids.get(transactional_id)
            if current is None or current[1] >= MAX_EPOCH:
                pid, epoch = await self._allocator.allocate(), 0
            else:
                pid, epoch = current[0], current[1] + 1
            # fence first: once the epoch is durable, older epochs are refused
            await self._epochs.raise_to(pid, epoch)
            doc = {"producerId": pid, "producerEpoch": epoch}
            await producer.send(json.dumps(doc).encode(), partition_key=transactional_id)
            self._ids[transactional_id] = (pid, epoch)
            return pid, epoch

    async def close(self) -> None:
        await self._table.close()


class Registry:
    """The three registries over one Pulsar client."""

    def __init__(self, client: pulsar_async.Client, system_namespace: str, prefix: str) -> None:
        base = f"persistent://{system_namespace}"
        self.allocator = ProducerIdAllocator(client, f"{base}/producer-id-blocks", prefix)
        self.epochs = EpochRegistry(client, f"{base}/producer-epochs")
        self.transactional = TransactionalIds(
            client, f"{base}/transactional-ids", prefix, self.allocator, self.epochs
        )

    async def start(self) -> None:
        await self.epochs.catch_up()

    async def close(self) -> None:
        await self.transactional.close()
        await self.epochs.close()
