"""The pulsar-client producers: create, cache, close, send. The only module that
publishes to Pulsar, and the one place Pulsar errors become Kafka errors.

One Kafka batch is published as exactly one Pulsar batch entry: the producer
batches on the client, with limits no Kafka batch reaches and a publish delay
that never fires, and :meth:`PulsarProducer.send_batch` enqueues every record
of the batch and flushes in the same event-loop step.

Every record of the batch carries the same Pulsar sequence id: the one of the
batch's *last* record. The C++ client (pulsar-client 3.13) gives a batch entry
its first message's id and sends no ``highest_sequence_id``, so the broker
records only that one id per entry (verified: after an entry with ids 1, 2, 3
``last_sequence_id()`` is 1 and a resend of 2, 3 is stored again). With the
last record's id on the entry, the broker's high-water mark is the batch's
last sequence, and a batch whose last sequence is at or below it comes back
with ledger id and entry id -1: a duplicate. The sequencer refuses batches
that straddle the mark before they get here.

Callbacks from the C++ client run on its I/O thread: they never raise and
never block; they count answers and wake the event loop once per batch.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_async

from kop_dedup import errors
from kop_dedup.protocol.records import SEQ_MODULUS as _SEQ_MODULUS
from kop_dedup.protocol.records import KafkaBatch, KafkaRecord
from kop_dedup.pulsar.wire import PROP_KEY_ENCODING, PROP_SEQUENCE, encode_key, encode_properties

__all__ = [
    "BatchReceipt",
    "Publisher",
    "PulsarProducer",
    "translate",
]

log = logging.getLogger(__name__)

_BATCH_BYTES_LIMIT = 5 << 20  # the client container never splits a batch we accept
_NEVER_MS = 24 * 3600 * 1000  # the batch timer must never flush half a Kafka batch

_RETRIABLE_CONNECTION = {
    "Timeout",
    "ConnectError",
    "ReadError",
    "AlreadyClosed",
    "ProducerNotInitialized",
    "ServiceUnitNotReady",
    "NotConnected",
    "TooManyLookupRequestException",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "LookupError",
    "RetryLater",
    "ResultRetryable",
    "Disconnected",
    "ProducerQueueIsFull",
    "Interrupted",
}


def translate(exc_or_result: Any, what: str) -> errors.KafkaError:
    """A Kafka error for a pulsar-client failure (a Result or an exception).

    Timeouts -> REQUEST_TIMED_OUT (7); producer-busy and connection/lookup
    trouble -> NOT_LEADER_OR_FOLLOWER (6), both retriable; a topic that does
    not exist -> UNKNOWN_TOPIC_OR_PARTITION (3); a message the broker refuses
    as too big -> MESSAGE_TOO_LARGE (10); anything else -> KAFKA_STORAGE_ERROR
    (56, retriable), so a client retries rather than loses data.
    """
    if isinstance(exc_or_result, asyncio.TimeoutError | TimeoutError):
        return errors.RequestTimedOut(f"{what}: timed out waiting for Pulsar")
    result = exc_or_result
    if isinstance(exc_or_result, pulsar_async.PulsarException):
        result = exc_or_result.error()
    name = getattr(result, "name", None) or type(result).__name__
    detail = f"{what}: Pulsar answered {name}"
    if isinstance(exc_or_result, Exception) and str(exc_or_result):
        detail = f"{what}: {exc_or_result}"
    return _BY_RESULT.get(name, errors.KafkaStorageError)(detail)


_BY_RESULT: dict[str, type[errors.KafkaError]] = {
    "Timeout": errors.RequestTimedOut,
    "TimeoutException": errors.RequestTimedOut,
    "ProducerBusy": errors.NotLeaderOrFollower,
    "ProducerFenced": errors.NotLeaderOrFollower,
    "ProducerBlockedQuotaExceededError": errors.NotLeaderOrFollower,
    "ProducerBlockedQuotaExceededException": errors.NotLeaderOrFollower,
    "TopicNotFound": errors.UnknownTopicOrPartition,
    "TopicTerminated": errors.UnknownTopicOrPartition,
    "MessageTooBig": errors.MessageTooLarge,
    **dict.fromkeys(_RETRIABLE_CONNECTION, errors.NotLeaderOrFollower),
}


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


_PLAIN = KafkaRecord(key=None, value=b"")
"""A record with no headers, no timestamp and a value: its properties are the batch's."""


def _is_plain(record: KafkaRecord) -> bool:
    return not record.headers and record.timestamp is None and record.value is not None


class _BatchWaiter:
    """Wakes the event loop once, when the batch's last record is answered.

    Every record of a batch is in one entry and shares its receipt, and the
    C++ client answers a batch's records in order, so only the last record
    carries a Python callback; the others get ``operator.is_``, a C builtin
    that runs no Python frame and cannot raise (a callback per record took
    the GIL from the I/O thread 100 times per 100-record batch). The first
    record's position is the last one's minus its batch index; a last record
    whose batch index is not ``count - 1`` means the batch was split.
    """

    __slots__ = ("_count", "_future", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self._loop = loop
        self._future: asyncio.Future[BatchReceipt] = loop.create_future()
        self._count = count

    def callback(self, index: int) -> Callable[[Any, Any], Any]:
        return self._on_last if index == self._count - 1 else operator.is_

    def _on_last(self, result: Any, msg_id: Any) -> None:
        try:
            if result != _pulsar.Result.Ok:
                outcome: BatchReceipt | _SendFailed = _SendFailed(result)
            else:
                index = msg_id.batch_index()
                if index not in (-1, self._count - 1):
                    log.error("a Kafka batch was split across Pulsar entries; it is not atomic")
                first = 0 if index == -1 else max(index - (self._count - 1), 0)
                outcome = BatchReceipt(
                    msg_id.ledger_id(), msg_id.entry_id(), msg_id.partition(), first
                )
            self._loop.call_soon_threadsafe(self._complete, outcome)
        except Exception:  # never let an exception reach the C++ thread
            log.exception("send callback failed")

    def _complete(self, outcome: BatchReceipt | _SendFailed) -> None:
        if self._future.done():
            return
        if isinstance(outcome, _SendFailed):
            self._future.set_exception(outcome)
        else:
            self._future.set_result(outcome)

    @property
    def future(self) -> asyncio.Future[BatchReceipt]:
        return self._future


class _SendFailed(Exception):
    def __init__(self, result: Any) -> None:
        super().__init__(getattr(result, "name", str(result)))
        self.result = result


class PulsarProducer:
    """One Pulsar producer (one name on one partition topic)."""

    def __init__(self, producer: pulsar_async.Producer, topic: str, name: str) -> None:
        self._producer = producer
        self._raw: Any = producer._producer
        self.topic = topic
        self.name = name
        self.outstanding = 0
        """Batches handed to the client with no answer yet."""

    def last_sequence_id(self) -> int:
        """The broker's highest sequence id for this name when the producer connected."""
        return int(self._producer.last_sequence_id())

    def send_batch(self, batch: KafkaBatch, sequence_id: int) -> asyncio.Future[BatchReceipt]:
        """Enqueue every record and flush, in one loop step; the future answers the batch.

        ``sequence_id`` is the entry's Pulsar sequence id (that of the batch's
        last record), set on every record; ignored for non-idempotent batches.
        The future fails with the client's Result when any record failed.
        """
        loop = asyncio.get_running_loop()
        waiter = _BatchWaiter(loop, len(batch.records))
        pid, epoch, partition = batch.producer_id, batch.producer_epoch, batch.partition
        idempotent = batch.idempotent
        if not idempotent:
            pid, epoch = -1, -1
        raw = self._raw
        # the properties every record of the batch shares, encoded once per batch
        common = encode_properties(
            _PLAIN,
            producer_id=pid,
            epoch=epoch,
            sequence=None,
            partition=partition,
            key_encoding=None,
        )
        base = batch.base_sequence
        for i, record in enumerate(batch.records):
            builder = _pulsar.MessageBuilder()
            builder.content(record.value or b"")
            key, key_encoding = encode_key(record.key)
            if key is not None:
                builder.partition_key(key)
            if _is_plain(record):
                props = dict(common)
            else:
                props = encode_properties(
                    record,
                    producer_id=pid,
                    epoch=epoch,
                    sequence=None,
                    partition=partition,
                    key_encoding=None,
                )
            if key_encoding is not None:
                props[PROP_KEY_ENCODING] = key_encoding
            if idempotent:
                props[PROP_SEQUENCE] = str((base + i) % _SEQ_MODULUS)
                builder.sequence_id(sequence_id)
            builder.properties(props)
            if record.timestamp is not None and record.timestamp > 0:
                builder.event_timestamp(record.timestamp)
            raw.send_async(builder.build(), waiter.callback(i))
        raw.flush_async(id)  # a C builtin: each record's receipt carries the answer
        self.outstanding += 1
        fut = waiter.future
        fut.add_done_callback(self._on_done)
        return fut

    def _on_done(self, _fut: asyncio.Future[BatchReceipt]) -> None:
        self.outstanding -= 1

    async def close(self, timeout_s: float = 5.0) -> None:
        """Close, bounded: a paused or dead broker must not hold the caller for the
        client's whole operation timeout (the broker drops the producer with the
        connection anyway)."""
        try:
            await asyncio.wait_for(self._producer.close(), timeout_s)
        except Exception as exc:
            log.debug("closing producer %s on %s: %s", self.name, self.topic, exc)


def is_send_failure(exc: BaseException) -> bool:
    return isinstance(exc, _SendFailed)


def failure_result(exc: BaseException) -> Any:
    return exc.result if isinstance(exc, _SendFailed) else exc


class Publisher:
    """Owns the Pulsar client; creates producers configured for one-entry-per-batch."""

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

    async def create(self, topic: str, name: str | None) -> PulsarProducer:
        """A producer named ``name`` (None: broker-assigned) on a partition topic."""
        producer = await self.client.create_producer(
            topic,
            producer_name=name,
            send_timeout_millis=self._send_timeout_ms,
            max_pending_messages=200_000,
            max_pending_messages_across_partitions=200_000,
            block_if_queue_full=False,
            batching_enabled=True,
            batching_max_messages=200_000,
            batching_max_allowed_size_in_bytes=_BATCH_BYTES_LIMIT,
            batching_max_publish_delay_ms=_NEVER_MS,
            batching_type=pulsar.BatchingType.Default,
        )
        return PulsarProducer(producer, topic, name or producer.producer_name())

    async def close(self) -> None:
        try:
            await self.client.close()
        except Exception as exc:
            log.debug("closing the Pulsar client: %s", exc)
