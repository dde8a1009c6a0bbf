"""A Produce answer whose offset lookup takes longer than the answer after it waits for it:
one past ``_CHAIN_WAIT_S`` (``pulsar/produced.py``, 5 s).

A Produce answer carries the batch's base offset, derived from the index of the entry
before it (no round trip) or asked of the broker's admin API (the entry's index). An
answer whose preceding entry is being looked up waits for that lookup at most
``_CHAIN_WAIT_S``, then asks for its own entry. Here the admin API is stalled (a proxy
in front of the real broker holds every entry lookup longer than that bound, and
shorter than the admin client's own timeout), so the first batch of a fresh partition
is looked up slowly and the batches in flight behind it each wait their 5 s, then ask.

What must hold, whatever the clients see meanwhile (a late answer, a request timed out
and sent again): every record stored once, and every offset a delivery report gives
the one the record is stored at; never another record's.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from kop_dedup.pulsar import produced
from tests.helpers import uniq
from tests.integration.kafka_consume import Got, confluent_consumer, confluent_read, create
from tests.sidecar import ThreadSidecar
from tests.tcp_proxy import RecordingProxy

pytestmark = pytest.mark.integration

STALL_S = 7.0  # past _CHAIN_WAIT_S (5 s), short of the admin client's timeout (10 s)
LOOKUP = re.compile(r"^GET /admin/v2/persistent/\S+/ledger/\d+/entry/\d+")


class StallingProxy(RecordingProxy):
    """The admin API through a proxy that, while :attr:`stalling`, holds every request
    whose line matches ``pattern`` for ``stall_s`` before passing it on (:attr:`stalled`
    counts them); everything else passes at once."""

    def __init__(self, upstream: str, pattern: re.Pattern[str], stall_s: float) -> None:
        super().__init__(upstream)
        self._pattern, self.stall_s = pattern, stall_s
        self.stalling = False
        self.stalled = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = self.upstreams[0].rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._requests(reader, up_writer), _answers(up_reader, writer))

    async def _requests(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        pending = b""
        try:
            while data := await source.read(1 << 16):
                seen = len(self.requests)
                pending = self._seen(data, pending)
                lines = self.requests[seen:]
                if self.stalling and any(self._pattern.match(line) for line in lines):
                    self.stalled += 1
                    await asyncio.sleep(self.stall_s)
                sink.write(data)
                await sink.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            sink.close()


async def _answers(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(1 << 16):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        sink.close()


@pytest.fixture(scope="module")
def stalled(pulsar: Any) -> Iterator[tuple[ThreadSidecar, StallingProxy]]:
    assert produced._CHAIN_WAIT_S < STALL_S, "the stall must pass the bound under test"
    upstream = pulsar.admin_url.removeprefix("http://").rstrip("/")
    with StallingProxy(upstream, LOOKUP, STALL_S) as proxy:
        broker = SimpleNamespace(service_url=pulsar.service_url, admin_url=proxy.url)
        with ThreadSidecar(broker, system_namespace=uniq("sys")) as sc:
            yield sc, proxy


def _produce(address: str, topic: str, values: list[bytes], **conf: Any) -> list[Got]:
    """Send ``values`` to partition 0, several batches in flight (one record each); the
    delivery reports, every one a success."""
    producer = Producer(
        {
            "bootstrap.servers": address,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "batch.num.messages": 1,
            **conf,
        }
    )
    out: list[Got] = []
    failures: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(err)
        else:
            out.append(Got(msg.partition(), msg.offset(), msg.key(), msg.value()))

    for value in values:
        producer.produce(topic, value=value, partition=0, on_delivery=report)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert failures == []
    return out


def _scenario(stalled: tuple[ThreadSidecar, StallingProxy], **conf: Any) -> None:
    sc, proxy = stalled
    address = sc.kafka_bootstrap
    topic = create(address, 1)
    values = [b"v%02d" % i for i in range(12)]
    proxy.stalling, before = True, proxy.stalled
    try:
        started = time.monotonic()
        reports = _produce(address, topic, values, **conf)
        elapsed = time.monotonic() - started
    finally:
        proxy.stalling = False
    assert proxy.stalled > before, "no entry lookup was stalled: the bound was not passed"
    assert elapsed > produced._CHAIN_WAIT_S, elapsed
    consumer = confluent_consumer(address)
    try:
        stored = confluent_read(
            consumer, [TopicPartition(topic, 0, OFFSET_BEGINNING)], len(values) + 1, timeout=10
        )
    finally:
        consumer.close()
    # every record stored once, in the order sent (one producer, idempotent)
    assert [g.value for g in stored] == values
    assert [g.offset for g in stored] == list(range(len(values)))
    at = {g.value: g.offset for g in stored}
    # every offset answered is the record's own
    answered = {g.value: g.offset for g in reports}
    assert answered == at, sorted(answered.items())


def test_offsets_answered_past_the_chain_wait_are_the_records_own(stalled):
    """The client waits for the answers (its request timeout is longer than the stall)."""
    _scenario(stalled)


def test_produces_timed_out_and_sent_again_past_the_chain_wait_are_stored_once(stalled):
    """The client's request timeout (6 s) lies past the chain wait and short of the
    answers: it sends the batches again, on a new connection; each is stored once, and
    the offsets finally answered are the records' own."""
    _scenario(stalled, **{"request.timeout.ms": 6000})
