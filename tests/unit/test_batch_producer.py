"""send_batch and the batch waiter on a fake client producer: all or nothing per batch.

The fake stands in for the C++ client's producer callbacks only (when and with what a
record's callback is called); publishing and dedup are tested against the real broker
in tests/integration.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import _pulsar
import pytest

from kop_dedup.protocol.records import SEQ_MODULUS, Header, KafkaBatch, KafkaRecord
from kop_dedup.pulsar.failures import SendFailed, translate
from kop_dedup.pulsar.producers import PartialBatch, PulsarProducer
from kop_dedup.pulsar.wire import encode_key, encode_properties

OK = _pulsar.Result.Ok


@dataclass
class FakeMessageId:
    ledger: int
    entry: int
    index: int

    def ledger_id(self) -> int:
        return self.ledger

    def entry_id(self) -> int:
        return self.entry

    def partition(self) -> int:
        return -1

    def batch_index(self) -> int:
        return self.index


@dataclass
class FakeRawProducer:
    """Calls back like the C++ client: refusals at once (from ``refuse_at`` on, as a
    closed or fenced producer refuses every later record), answers after a flush, from
    another thread, in record order; a record without a callback (None) is not told."""

    refuse_at: int | None = None
    refusal: _pulsar.Result = _pulsar.Result.ProducerQueueIsFull
    results: dict[int, _pulsar.Result] = field(default_factory=dict)
    """Answer per record index of the flushed entry (default Ok)."""
    duplicate: bool = False
    split_at: int | None = None
    pending: list[Any] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)
    """Every callback given, in order (None included)."""
    flushes: int = 0
    sent: int = 0
    messages: list[Any] = field(default_factory=list)
    """Every message given, in order."""

    def send_async(self, msg: Any, callback: Any) -> None:
        self.messages.append(msg)
        self.callbacks.append(callback)
        if self.refuse_at is not None and self.sent >= self.refuse_at:
            if callback is not None:
                callback(self.refusal, FakeMessageId(-1, -1, -1))
            return
        self.sent += 1
        self.pending.append(callback)

    def flush_async(self, _callback: Any) -> None:
        self.flushes += 1
        callbacks, self.pending = self.pending, []

        def answer() -> None:
            ledger, entry = (-1, -1) if self.duplicate else (12, 3)
            for i, cb in enumerate(callbacks):
                index = i if self.split_at is None else i % self.split_at
                if cb is not None:
                    cb(self.results.get(i, OK), FakeMessageId(ledger, entry, index))

        threading.Thread(target=answer).start()


class FakeAsyncProducer:
    def __init__(self, raw: FakeRawProducer) -> None:
        self._producer = raw


def make(n: int) -> KafkaBatch:
    records = tuple(KafkaRecord(None, f"v{i}".encode()) for i in range(n))
    return KafkaBatch("t", 0, 7, 0, 0, n - 1, records)


def producer(raw: FakeRawProducer, capacity: int = 100) -> PulsarProducer:
    return PulsarProducer(
        FakeAsyncProducer(raw), "persistent://p/n/t-partition-0", "kop-7-0", capacity
    )


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_whole_batch_is_one_flush_and_answered_with_its_first_records_position():
    async def go() -> Any:
        raw = FakeRawProducer()
        p = producer(raw)
        future = p.send_batch(make(4), 4)
        assert (p.queued, p.outstanding, p.room) == (4, 1, 96)
        receipt = await future
        assert (p.queued, p.outstanding) == (0, 0)
        return raw.flushes, receipt

    flushes, receipt = run(go())
    assert flushes == 1
    assert receipt.message_id == "12:3:-1:0"
    assert not receipt.duplicate


def test_a_duplicate_entry_is_answered_minus_one_minus_one():
    async def go() -> Any:
        return await producer(FakeRawProducer(duplicate=True)).send_batch(make(3), 3)

    receipt = run(go())
    assert receipt.duplicate
    assert receipt.message_id is None


def test_a_first_record_refused_raises_at_once_and_enqueues_nothing():
    async def go() -> Any:
        raw = FakeRawProducer(refuse_at=0)
        p = producer(raw)
        with pytest.raises(SendFailed) as caught:
            p.send_batch(make(3), 3)
        return raw, p, caught.value

    raw, p, exc = run(go())
    assert (raw.sent, raw.flushes, p.queued, p.outstanding) == (0, 0, 0, 0)
    assert exc.result == _pulsar.Result.ProducerQueueIsFull
    assert translate(exc, "publish").retriable


@pytest.mark.parametrize("refuse_at", [2, 4])
def test_a_record_refused_after_others_were_enqueued_is_a_partial_batch_never_an_ok(refuse_at):
    async def go() -> Any:
        raw = FakeRawProducer(refuse_at=refuse_at)
        p = producer(raw)
        with pytest.raises(PartialBatch) as caught:
            p.send_batch(make(5), 5)
        return raw, p, caught.value

    raw, p, exc = run(go())
    assert exc.result == _pulsar.Result.ProducerQueueIsFull
    assert "may be stored" in str(exc)
    assert raw.flushes == 1  # what was enqueued cannot be taken back
    assert (p.queued, p.outstanding) == (0, 0)


def test_a_one_record_batch_refused_raises_at_once():
    async def go() -> Any:
        raw = FakeRawProducer(refuse_at=0)
        with pytest.raises(SendFailed) as caught:
            producer(raw).send_batch(make(1), 1)
        return raw, caught.value

    raw, exc = run(go())
    assert (raw.sent, raw.flushes) == (0, 0)
    assert exc.result == _pulsar.Result.ProducerQueueIsFull


def test_only_the_first_and_the_last_record_carry_a_python_callback():
    """The C++ client answers every record of an entry with the entry's result, and a
    producer that refuses one record refuses every later one: the first and the last
    tell everything, and the I/O thread takes the GIL per batch, not per record."""

    async def go() -> Any:
        raw = FakeRawProducer()
        await producer(raw).send_batch(make(5), 5)
        return raw.callbacks

    callbacks = run(go())
    assert callbacks[0] is not None
    assert callbacks[-1] is not None
    assert callbacks[1:-1] == [None, None, None]


@pytest.mark.parametrize("failing", [0, 3])
def test_any_records_failure_in_the_entry_fails_the_whole_batch(failing):
    async def go() -> Any:
        raw = FakeRawProducer(results={failing: _pulsar.Result.Timeout})
        with pytest.raises(SendFailed) as caught:
            await producer(raw).send_batch(make(4), 4)
        return caught.value

    exc = run(go())
    assert exc.result == _pulsar.Result.Timeout
    assert translate(exc, "publish").errno == 7


def test_a_batch_larger_than_the_room_left_is_refused_before_anything_is_enqueued():
    async def go() -> Any:
        raw = FakeRawProducer()
        p = producer(raw, capacity=5)
        first = p.send_batch(make(3), 3)
        with pytest.raises(SendFailed):
            p.send_batch(make(3), 6)
        assert raw.sent == 3
        await first
        await p.send_batch(make(5), 8)  # room again once the first was answered
        return raw.sent

    assert run(go()) == 8


def test_a_batch_split_across_entries_is_reported(caplog):
    async def go() -> Any:
        return await producer(FakeRawProducer(split_at=2)).send_batch(make(3), 3)

    with caplog.at_level(logging.ERROR):
        run(go())
    assert "split across Pulsar entries" in caplog.text


_MIXED = (
    KafkaRecord(None, b"plain", (), 1_700_000_000_000),
    KafkaRecord(None, b"same ms", (), 1_700_000_000_000),
    KafkaRecord(b"k", b"utf-8 key", (), 1_700_000_000_001),
    KafkaRecord(b"\xff\x00", b"binary key"),
    KafkaRecord(b"", None, (), 0),
    KafkaRecord(None, b"h", (Header("a", b"1"), Header("b", None)), 5),
    KafkaRecord(None, None),
)


@pytest.mark.parametrize(("pid", "base"), [(7, 0), (7, SEQ_MODULUS - 3), (-1, -1)])
def test_every_record_carries_what_encode_properties_says(pid, base):
    """The hot loop's shortcuts (shared properties copied, a batch's repeated timestamp
    encoded once, sequences listed up front) build what the wire module specifies, key,
    event time and sequence id included, across a sequence wrap and without a producer."""
    n = len(_MIXED)
    last = (base + n - 1) % SEQ_MODULUS if pid != -1 else -1
    batch = KafkaBatch("t", 3, pid, 0 if pid != -1 else -1, base, last, _MIXED)

    async def go() -> FakeRawProducer:
        raw = FakeRawProducer()
        await producer(raw).send_batch(batch, 41, {"x.extra": "1"})
        return raw

    raw = run(go())
    assert len(raw.messages) == n
    for i, (record, msg) in enumerate(zip(_MIXED, raw.messages, strict=True)):
        key, encoding = encode_key(record.key)
        want = encode_properties(
            record,
            producer_id=pid,
            epoch=batch.producer_epoch,
            sequence=(base + i) % SEQ_MODULUS if pid != -1 else None,
            partition=3,
            key_encoding=encoding,
        )
        assert msg.properties() == {**want, "x.extra": "1"}, i
        assert msg.data() == (record.value or b"")
        assert msg.partition_key() == (key or "")
        stamp = record.timestamp if record.timestamp and record.timestamp > 0 else 0
        assert msg.event_timestamp() == stamp
