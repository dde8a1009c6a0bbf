"""One holder at a time: a cluster-wide name mutex, and a fenced single writer.

Two ways Pulsar lets exactly one client act at a time:

:class:`NameMutex`
    A producer *name* on a topic is held by one producer at a time (a second
    one is refused ``ProducerBusy``), so holding the name is holding a mutex
    across every sidecar. While held, the holder may send through it with
    explicit sequence ids: with dedup on, the broker remembers the name's
    highest sequence id across restarts (``last_sequence_id``), which the
    producer-id allocator uses. The name is released when the holder exits (or
    its connection dies: then after the broker notices)::

        async with NameMutex(client, topic, "kop-producer-id-allocator").hold() as held:
            held.last_sequence_id          # the broker's, -1 when it knows none
            await held.send(b"7", sequence_id=8)   # False: a duplicate, not stored

:class:`FencedWriter`
    The one writer of a state partition (a topic): opening it with the client's
    ``ExclusiveWithFencing`` access mode evicts the previous writer, whatever
    client holds it, and no other producer may write the topic meanwhile. The
    evicted writer's next send fails with :class:`OwnershipLost`::

        writer = FencedWriter(client, "persistent://public/sys/txn-log-3")
        await writer.open()                 # now the owner; the old owner is fenced
        await table.catch_up()              # see "taking over" below
        await writer.send("txn-a", payload) # OwnershipLost once someone else opened

    Taking over: a send of the old owner that the broker accepted before
    ``open()`` returned is in the topic; one it had not accepted fails. To be
    sure the table holds everything the old owner stored, send one record (an
    ownership marker) and catch up until it is read back: every record before
    it in the topic is then applied.

    A writer never re-opens on its own (after a broker restart the client
    reconnects it, still fenced if someone else opened meanwhile): re-opening
    would take the partition back from whoever took it over. Calling ``open()``
    again is the caller's decision to take ownership.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import _pulsar
import pulsar.asyncio as pulsar_async

from kop_dedup.pulsar.tables import PulsarClient, TableRecord, discard, read_last

__all__ = ["FencedWriter", "HeldName", "MutexBusy", "NameMutex", "OwnershipLost"]

log = logging.getLogger(__name__)

_SEND_TIMEOUT_MS = 30_000
# a fenced producer answers ProducerFenced, and AlreadyClosed once the client closed it
_LOST = frozenset({_pulsar.Result.ProducerFenced, _pulsar.Result.AlreadyClosed})


class MutexBusy(TimeoutError):
    """Another client held the name for longer than we were willing to wait."""


class OwnershipLost(RuntimeError):
    """This writer was fenced: another writer opened the topic after it."""

    def __init__(self, topic: str, cause: BaseException | None = None) -> None:
        super().__init__(
            f"lost ownership of {topic}: another writer opened it (ExclusiveWithFencing)"
            + (f" ({cause})" if cause else "")
        )
        self.topic = topic


class HeldName:
    """What the holder of a :class:`NameMutex` can do while it holds the name."""

    def __init__(self, client: PulsarClient, topic: str, producer: Any) -> None:
        self.topic = topic
        self._client, self._producer = client, producer

    @property
    def last_sequence_id(self) -> int:
        """The broker's highest sequence id for the name (-1 when unknown or dedup off)."""
        return int(self._producer.last_sequence_id())

    async def send(
        self,
        value: bytes,
        *,
        key: str | None = None,
        sequence_id: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> bool:
        """Store one record (not batched); False when the broker's dedup dropped it."""
        receipt = await self._producer.send(
            value,
            partition_key=key,
            sequence_id=sequence_id,
            properties=dict(properties) if properties else None,
        )
        return not (receipt.ledger_id() == -1 and receipt.entry_id() == -1)

    async def last_record(self) -> TableRecord | None:
        """The topic's last message, whoever wrote it."""
        return await read_last(self._client, self.topic)


class NameMutex:
    """A producer name on a topic, held by one client of the cluster at a time."""

    def __init__(self, client: PulsarClient, topic: str, name: str) -> None:
        self.topic, self.name = topic, name
        self._client = client

    @asynccontextmanager
    async def hold(self, wait_s: float = 30.0) -> AsyncIterator[HeldName]:
        """Hold the name for the ``async with`` block; MutexBusy after ``wait_s``.

        ``wait_s=0`` tries once (a try-lock).
        """
        producer = await self._acquire(wait_s)
        try:
            yield HeldName(self._client, self.topic, producer)
        finally:
            await discard(producer)

    async def _acquire(self, wait_s: float) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        delay = 0.02
        while True:
            try:
                return await self._client.create_producer(
                    self.topic,
                    producer_name=self.name,
                    batching_enabled=False,
                    send_timeout_millis=_SEND_TIMEOUT_MS,
                )
            except pulsar_async.PulsarException as exc:
                if exc.error() != _pulsar.Result.ProducerBusy:
                    raise
                if loop.time() + delay > deadline:
                    raise MutexBusy(
                        f"{self.name} on {self.topic} is held by another client "
                        f"(waited {wait_s:g} s)"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)


class FencedWriter:
    """The single writer of a table topic; opening it fences the previous writer."""

    def __init__(self, client: PulsarClient, topic: str) -> None:
        self.topic = topic
        self._client = client
        self._producer: Any = None
        self._lost: OwnershipLost | None = None
        self.opened_at = 0.0
        """When this writer last took ownership (``time.monotonic()``)."""

    @property
    def owned(self) -> bool:
        """Open and not (yet known to be) fenced."""
        return self._producer is not None and self._lost is None

    @property
    def name(self) -> str | None:
        """The producer name the broker knows this writer by (None when not open)."""
        return None if self._producer is None else str(self._producer.producer_name())

    @property
    def connected(self) -> bool:
        """Whether the client has this writer connected right now (False while it
        reconnects after a broker restart)."""
        return self._producer is not None and bool(self._producer.is_connected())

    async def lost(self) -> None:
        """The broker no longer lists this writer while the client has it connected
        (it was fenced while idle): give it up. It is closed too, or the client would
        reconnect it after a broker restart and fence whoever owns the topic then."""
        if self._lost is None:
            self._lost = OwnershipLost(self.topic)
        producer, self._producer = self._producer, None
        if producer is not None:
            await discard(producer)

    async def open(self) -> None:
        """Take ownership: from here on, no earlier writer's send can succeed."""
        await self.close()
        self._producer = await self._client.create_producer(
            self.topic,
            access_mode=_pulsar.ProducerAccessMode.ExclusiveWithFencing,
            send_timeout_millis=_SEND_TIMEOUT_MS,
            # batched, so that Pulsar 4.0.x compaction removes tombstones
            batching_enabled=True,
            batching_max_publish_delay_ms=1,
        )
        self._lost = None
        self.opened_at = time.monotonic()
        log.debug("took ownership of %s", self.topic)  # its owner logs the summary

    async def send(
        self, key: str, value: bytes, *, properties: Mapping[str, str] | None = None
    ) -> None:
        """Store ``key -> value``; durable when it returns, OwnershipLost when fenced."""
        if not value:
            raise ValueError("an empty value is a tombstone: call tombstone()")
        await self._send(key, value, properties)

    async def tombstone(self, key: str, *, properties: Mapping[str, str] | None = None) -> None:
        """Remove ``key``; OwnershipLost when fenced."""
        await self._send(key, b"", properties)

    async def _send(self, key: str, value: bytes, properties: Mapping[str, str] | None) -> None:
        if self._lost is not None:
            raise self._lost
        if self._producer is None:
            raise RuntimeError(f"the writer of {self.topic} is not open")
        try:
            await self._producer.send(value, partition_key=key, properties=dict(properties or {}))
        except pulsar_async.PulsarException as exc:
            if exc.error() in _LOST:
                self._lost = OwnershipLost(self.topic, exc)
                log.warning("lost ownership of %s: %s", self.topic, exc)
                raise self._lost from exc
            raise

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await discard(producer)
