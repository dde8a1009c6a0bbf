"""The sidecar's Pulsar producers: one Kafka batch in, one Pulsar batch entry out.

One Kafka batch is published as exactly one Pulsar batch entry: the producer batches
on the client with limits no accepted Kafka batch reaches and a publish delay that
never fires, and :meth:`PulsarProducer.send_batch` enqueues every record of the batch
and flushes, in one event-loop step.

Every record carries the same Pulsar sequence id: the one of the batch's *last*
record. The C++ client (pulsar-client 3.13) gives a batch entry its first message's id
and sends no ``highest_sequence_id``, so the broker records only that one id per entry
(verified: after an entry with ids 1, 2, 3 ``last_sequence_id()`` is 1 and a resend of
2, 3 is stored again). With the last record's id on the entry, the broker's high-water
mark is the batch's last sequence, and a batch whose last sequence is at or below it
comes back with ledger id and entry id -1: a duplicate.

A batch is stored whole or not at all. The client's queue is sized for
``max_in_flight`` full batches and a batch is only sent when the queue has room for all
of its records (:attr:`PulsarProducer.room`; the rules machine waits otherwise), so no
record is refused half-way for a full queue; the entry's size is bounded before it is
sent (:func:`kop_dedup.pulsar.wire.entry_size_bound`), so the client never splits it;
and every record's answer counts: the batch fails if any record failed.

Callbacks from the C++ client run on its I/O thread: they never raise and never block.
Only the first and the last record of a batch carry a Python callback; the others,
and the flush, carry none (``None``: an empty ``std::function``, which the C++ client
skips: ``if (callback)``, ``addTrackerCallback``). A Python
callback costs the I/O thread the GIL several times per record (pybind11 takes it to
call the function and again to copy and to destroy it), and with 100-record batches
that was a quarter of the CPU of a send, on the sidecar and on the benchmark's direct
producer alike. Nothing is lost by it (pulsar-client-cpp ``ProducerImpl::sendAsync``
and ``isValidProducerState``):

- every record of one entry is answered with the entry's one result, so the last
  record's answer is every record's (and an entry split in two is reported);
- a record is refused at once (inside ``send_async``) only for a full queue, which
  the room check rules out, or for a producer that is closing, closed, fenced or whose
  topic was terminated, states a producer never leaves: a refused middle record means
  a refused last record. The client has no memory limit (none is configured), and the
  entry's size is checked before sending.

So a refusal of the first record means nothing was enqueued (:class:`SendFailed`),
and a refusal of the last record after the first was taken means part of the batch
may have been enqueued (:class:`PartialBatch`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_async

from kop_dedup.protocol.records import SEQ_MODULUS, KafkaBatch, KafkaRecord
from kop_dedup.pulsar.failures import SendFailed
from kop_dedup.pulsar.wire import (
    PROP_ENTRY_FORMAT,
    PROP_EPOCH,
    PROP_KEY_ENCODING,
    PROP_PRODUCER_ID,
    PROP_SEQUENCE,
    PROP_TIMESTAMP,
    WHOLE_BATCH,
    encode_key,
    encode_properties,
    encode_whole,
    record_properties,
)

__all__ = ["BatchReceipt", "PartialBatch", "Publisher", "PulsarProducer"]

log = logging.getLogger(__name__)

_NEVER_MS = 24 * 3600 * 1000  # the batch timer must never flush half a Kafka batch
_CONTAINER_BYTES = 1 << 30  # entries are bounded before sending; the container never splits one
_OK = _pulsar.Result.Ok
_BYTES = pulsar.schema.BytesSchema()
"""One schema for every producer: the client builds a new one per producer when given
none, and its JSON encoding (pure Python, ``indent=True``) was 5% of the sidecar's CPU
while a wide produce opened 10,240 names."""


@dataclass(frozen=True, slots=True)
class BatchReceipt:
    """The broker's answer for one batch: its first record's position, or a duplicate."""

    ledger_id: int
    entry_id: int
    partition: int
    batch_index: int

    @property
    def duplicate(self) -> bool:
        return self.ledger_id == -1 and self.entry_id == -1

    @property
    def message_id(self) -> str | None:
        if self.duplicate:
            return None
        return f"{self.ledger_id}:{self.entry_id}:{self.partition}:{self.batch_index}"


class PartialBatch(Exception):
    """The client refused a record after earlier records of the batch were enqueued.

    The earlier records cannot be taken back: they are flushed as an entry with the
    batch's sequence id. Never expected (the queue has room and the entry's size is
    bounded before sending); the answer must say the batch may be stored in part.
    """

    def __init__(self, result: _pulsar.Result) -> None:
        super().__init__(
            f"the Pulsar client refused the batch's last record ({result.name}) after its "
            "first was enqueued; the records enqueued may be stored"
        )
        self.result = result


_PLAIN = KafkaRecord(key=None, value=b"")
"""A record with no headers, no timestamp and a value: its properties are the batch's."""


class BatchWaiter:
    """Wakes the event loop once, when the batch's last record is answered.

    The first record's callback is ``results.__setitem__`` (result -> message id, a C
    builtin that runs no Python frame), the last record's is :meth:`on_last`, the
    others have none (see the module docstring). The C++ client answers a batch's
    records in order, so when the last record's callback runs, the first record's
    result is in ``results``. The batch succeeds only if both are Ok. The first
    record's position is the last one's minus its batch index; a last record whose
    batch index is not ``count - 1`` means the batch was split across entries, which
    the size bound prevents.

    Before :attr:`flushed` is set nothing can be answered but a refusal: the last
    record's refusal is then kept in :attr:`refused` for :meth:`PulsarProducer.send_batch`
    to raise, and the future is left alone.
    """

    __slots__ = ("_count", "_future", "_loop", "_thread", "flushed", "refused", "results")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self._loop = loop
        self._thread = threading.get_ident()
        self._future: asyncio.Future[BatchReceipt] = loop.create_future()
        self._count = count
        self.results: dict[Any, Any] = {}
        self.flushed = False
        self.refused: Any = None

    def on_last(self, result: Any, msg_id: Any) -> None:
        if not self.flushed:  # refused inside send_async, on the event loop's thread
            self.refused = result
            return
        try:
            failed = result if result != _OK else next((r for r in self.results if r != _OK), None)
            if failed is not None:
                outcome: BatchReceipt | SendFailed = SendFailed(failed)
            else:
                index = msg_id.batch_index()
                if index not in (-1, self._count - 1):
                    log.error("a Kafka batch was split across Pulsar entries; it is not atomic")
                first = 0 if index == -1 else max(index - (self._count - 1), 0)
                outcome = BatchReceipt(
                    msg_id.ledger_id(), msg_id.entry_id(), msg_id.partition(), first
                )
            if threading.get_ident() == self._thread:
                # answered inside the flush (the client refused the entry): the future
                # is done when send_batch returns, before anything else is sent
                self._complete(outcome)
            else:
                self._loop.call_soon_threadsafe(self._complete, outcome)
        except Exception:  # never let an exception reach the C++ thread
            log.exception("send callback failed")

    def _complete(self, outcome: BatchReceipt | SendFailed) -> None:
        if self._future.done():
            return
        if isinstance(outcome, SendFailed):
            self._future.set_exception(outcome)
        else:
            self._future.set_result(outcome)

    @property
    def future(self) -> asyncio.Future[BatchReceipt]:
        return self._future


def _sequences(base: int, count: int) -> list[str]:
    """The ``kafka.sequence`` property of each of ``count`` records from ``base``."""
    if base + count <= SEQ_MODULUS:
        return [str(seq) for seq in range(base, base + count)]
    return [str((base + i) % SEQ_MODULUS) for i in range(count)]


class PulsarProducer:
    """One Pulsar producer (one name on one partition topic) with a bounded queue."""

    def __init__(self, producer: Any, topic: str, name: str, capacity: int) -> None:
        self._producer = producer
        self._raw: Any = producer._producer
        self.topic = topic
        self.name = name
        self.capacity = capacity
        """Records the client's queue holds (its ``max_pending_messages``)."""
        self.queued = 0
        """Records handed to the client with no answer yet."""
        self.outstanding = 0
        """Batches handed to the client with no answer yet."""

    @property
    def room(self) -> int:
        """Records the queue can take now without refusing any."""
        return self.capacity - self.queued

    def last_sequence_id(self) -> int:
        """The broker's highest sequence id for this name when the producer connected."""
        return int(self._producer.last_sequence_id())

    def send_batch(  # noqa: C901, PLR0912, PLR0915 - one loop on the hot path: no call per record
        self,
        batch: KafkaBatch,
        sequence_id: int,
        extra: Mapping[str, str] | None = None,
        head: Mapping[str, str] | None = None,
    ) -> asyncio.Future[BatchReceipt]:
        """Enqueue every record and flush, in one loop step; the future answers the batch.

        ``sequence_id`` is the entry's Pulsar sequence id (that of the batch's last
        record), set on every record; ignored for non-idempotent batches. ``extra``
        properties go on every record, ``head`` ones on the first only (a transaction's
        markers: what names the transaction, and what it says once per batch). Raises
        :class:`~kop_dedup.pulsar.failures.SendFailed` when the client refuses the
        first record (nothing was enqueued) and :class:`PartialBatch` when it refuses
        the last after the first was taken; the future fails when the entry fails.
        """
        records = batch.records
        count = len(records)
        if count > self.room:  # the rules machine waits for room; this guards the invariant
            raise SendFailed(_pulsar.Result.ProducerQueueIsFull)
        waiter = BatchWaiter(asyncio.get_running_loop(), count)
        pid, epoch = batch.producer_id, batch.producer_epoch
        idempotent = batch.idempotent
        if not idempotent:
            pid, epoch = -1, -1
        # the properties every record of the batch shares, encoded once per batch
        common = encode_properties(
            _PLAIN,
            producer_id=pid,
            epoch=epoch,
            sequence=None,
            partition=batch.partition,
            key_encoding=None,
        )
        if extra:
            common.update(extra)
        keyless = {**common, PROP_KEY_ENCODING: "null"}  # most Kafka records have no key
        send, build, own = self._raw.send_async, _pulsar.MessageBuilder, record_properties
        last = count - 1
        sequences = _sequences(batch.base_sequence, count) if idempotent else ()
        callback: Callable[[Any, Any], Any] | None = waiter.results.__setitem__
        stamp, stamped = None, ""  # the last timestamp seen and its text: a batch's repeat
        for i, record in enumerate(records):
            builder = build()
            value, key, timestamp = record.value, record.key, record.timestamp
            if value is not None and not record.headers:  # the usual record: no copy of
                builder.content(value)  # what record_properties would answer
                props = (keyless if key is None else common).copy()
                if timestamp is not None:
                    if timestamp != stamp:
                        stamp, stamped = timestamp, str(timestamp)
                    props[PROP_TIMESTAMP] = stamped
            else:
                builder.content(b"" if value is None else value)
                props = own(keyless if key is None else common, record)
            if timestamp is not None and timestamp > 0:
                builder.event_timestamp(timestamp)
            if key is not None:
                text, key_encoding = encode_key(key)
                if text is not None:
                    builder.partition_key(text)
                if key_encoding is not None:
                    props[PROP_KEY_ENCODING] = key_encoding
            if idempotent:
                props[PROP_SEQUENCE] = sequences[i]
                builder.sequence_id(sequence_id)
            if i == 0 and head:
                props.update(head)
            builder.properties(props)
            if i == last:
                callback = waiter.on_last
            send(builder.build(), callback)
            if i == 0:
                if waiter.results:  # refused at once: nothing was enqueued
                    raise SendFailed(next(iter(waiter.results)))
                callback = None
        return self._flush(waiter, count)

    def send_whole(
        self, batch: KafkaBatch, sequence_id: int, extra: Mapping[str, str] | None = None
    ) -> asyncio.Future[BatchReceipt]:
        """The whole batch as one message (:func:`~kop_dedup.pulsar.wire.encode_whole`):
        a journal entry, read back only by the sidecar. One message instead of one per
        record: the per-record cost of a send is paid once, by the copy. Same sequence
        id, receipts and failures as :meth:`send_batch`."""
        if self.room < 1:
            raise SendFailed(_pulsar.Result.ProducerQueueIsFull)
        waiter = BatchWaiter(asyncio.get_running_loop(), 1)
        builder = _pulsar.MessageBuilder()
        builder.content(encode_whole(batch))
        props = {
            PROP_ENTRY_FORMAT: WHOLE_BATCH,
            PROP_PRODUCER_ID: str(batch.producer_id),
            PROP_EPOCH: str(batch.producer_epoch),
            PROP_SEQUENCE: str(batch.last_sequence),
        }
        if extra:
            props.update(extra)
        builder.properties(props)
        builder.sequence_id(sequence_id)
        self._raw.send_async(builder.build(), waiter.on_last)
        return self._flush(waiter, 1)

    def send_marker(self, properties: Mapping[str, str]) -> asyncio.Future[BatchReceipt]:
        """One empty message carrying ``properties`` (a journal's barrier: found by its
        position, never read as a batch); the client assigns its sequence id. Same
        receipts and failures as :meth:`send_batch`."""
        if self.room < 1:
            raise SendFailed(_pulsar.Result.ProducerQueueIsFull)
        waiter = BatchWaiter(asyncio.get_running_loop(), 1)
        builder = _pulsar.MessageBuilder()
        builder.content(b"")
        builder.properties(dict(properties))
        self._raw.send_async(builder.build(), waiter.on_last)
        return self._flush(waiter, 1)

    def _flush(self, waiter: BatchWaiter, count: int) -> asyncio.Future[BatchReceipt]:
        """Flush the enqueued records as one entry, or raise for a last record refused."""
        if waiter.refused is not None:
            if count == 1:
                raise SendFailed(waiter.refused)
            self._raw.flush_async(None)
            raise PartialBatch(waiter.refused)
        waiter.flushed = True
        self._raw.flush_async(None)  # no callback: each record's receipt carries the answer
        self.queued += count
        self.outstanding += 1
        fut = waiter.future
        fut.add_done_callback(lambda _f: self._answered(count))
        return fut

    def _answered(self, count: int) -> None:
        self.queued -= count
        self.outstanding -= 1

    async def close(self, timeout_s: float = 5.0) -> None:
        """Close, bounded: a paused or dead broker must not hold the caller for the
        client's whole operation timeout (the broker drops the producer with the
        connection anyway)."""
        try:
            await asyncio.wait_for(self._producer.close(), timeout_s)
        except Exception as exc:
            log.debug("closing producer %s on %s: %s", self.name, self.topic, exc)


class Publisher:
    """Owns the Pulsar client; creates producers configured for one entry per batch."""

    def __init__(
        self,
        service_url: str,
        *,
        send_timeout_ms: int,
        auth_token: str | None = None,
        tls_trust_certs_file: str | None = None,
        tls_allow_insecure: bool = False,
        tls_validate_hostname: bool = False,
        operation_timeout_s: int = 30,
    ) -> None:
        kwargs: dict[str, Any] = {
            "operation_timeout_seconds": operation_timeout_s,
            "io_threads": 1,
            "message_listener_threads": 1,
            "logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        }
        if auth_token:
            kwargs["authentication"] = pulsar.AuthenticationToken(auth_token)
        if tls_trust_certs_file:
            kwargs["tls_trust_certs_file_path"] = tls_trust_certs_file
        if service_url.startswith("pulsar+ssl://"):
            kwargs["tls_allow_insecure_connection"] = tls_allow_insecure
            kwargs["tls_validate_hostname"] = tls_validate_hostname
        self.client = pulsar_async.Client(service_url, **kwargs)
        self._send_timeout_ms = send_timeout_ms

    async def create(
        self,
        topic: str,
        name: str | None,
        *,
        capacity: int = 50_000,
        send_timeout_ms: int | None = None,
    ) -> PulsarProducer:
        """A producer named ``name`` (None: broker-assigned) on a partition topic whose
        queue holds ``capacity`` records. ``send_timeout_ms``: the client's send timeout
        (None: the publisher's; 0: none, the client never fails a pending send on its
        own but keeps resending it across reconnections, in order)."""
        producer = await self.client.create_producer(
            topic,
            producer_name=name,
            schema=_BYTES,
            send_timeout_millis=(
                self._send_timeout_ms if send_timeout_ms is None else send_timeout_ms
            ),
            max_pending_messages=capacity,
            max_pending_messages_across_partitions=capacity,
            block_if_queue_full=False,
            batching_enabled=True,
            # the client refuses a container of one message ("needs to be greater than 1"):
            # a transaction's single record on a partition asks for a capacity of 1
            batching_max_messages=max(capacity, 2),
            batching_max_allowed_size_in_bytes=_CONTAINER_BYTES,
            batching_max_publish_delay_ms=_NEVER_MS,
            batching_type=pulsar.BatchingType.Default,
        )
        return PulsarProducer(producer, topic, name or producer.producer_name(), capacity)

    async def close(self) -> None:
        try:
            await self.client.close()
        except Exception as exc:
            log.debug("closing the Pulsar client: %s", exc)
