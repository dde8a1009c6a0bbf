"""The records a partition reader decodes (``kop_dedup.pulsar.stored.read_available``)
from the messages the produce path stores, and the RecordBatch a Fetch answers with
them: real client messages, built by ``PulsarProducer.send_batch`` itself (its
``_pulsar.MessageBuilder`` calls and ``wire.py``'s properties; only the send is caught
here), at positions in a log (a built message has none), read back as Kafka's decoders
read the answer (kafka-python's and aiokafka's).

The reader decodes a plain record (a UTF-8 key, a value, a timestamp, no headers) in
a few calls and every other through :func:`~kop_dedup.pulsar.wire.decode_record`; it
asks the ledger and entry of a message only when it does not follow the one taken
before it in its batch. Both are checked here against what was produced."""

from __future__ import annotations

import asyncio
from typing import Any

import pulsar
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as PyRecordBatch

from kop_dedup.protocol.records import NO_PRODUCER_ID, Header, KafkaBatch, KafkaRecord
from kop_dedup.pulsar.producers import PulsarProducer
from kop_dedup.pulsar.stored import RawEntry, StoredEntry, read_available
from kop_dedup.transports.kafka.fetched import encode_entry
from tests.strategies import records, sequences

PUBLISHED = 0  # what a built message answers for its publish time (the broker sets it)


class _Caught:
    """The client producer's two calls ``send_batch`` makes; keeps what it sends."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_async(self, msg: Any, _callback: Any) -> None:
        self.sent.append(msg)

    def flush_async(self, _callback: Any) -> None:
        pass


class _Id:
    def __init__(self, ledger: int, entry: int, batch: int) -> None:
        self.at = ledger, entry, batch

    def ledger_id(self) -> int:
        return self.at[0]

    def entry_id(self) -> int:
        return self.at[1]

    def batch_index(self) -> int:
        return self.at[2]


class _At:
    """A message the client built, at a position in the log."""

    def __init__(self, msg: Any, ledger: int, entry: int, batch: int) -> None:
        self._msg, self._id = msg, _Id(ledger, entry, batch)

    def message_id(self) -> _Id:
        return self._id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._msg, name)


class _Reader:
    def __init__(self, queue: list[_At]) -> None:
        self.queue = queue

    def read_next(self, _timeout_ms: int) -> _At:
        if not self.queue:
            raise pulsar.Timeout
        return self.queue.pop(0)

    def has_message_available(self) -> bool:
        return bool(self.queue)


def _stored(batches: list[KafkaBatch], ledger: int = 9) -> list[_At]:
    """The messages of ``batches`` as the produce path builds them, one entry each."""

    async def send() -> list[list[Any]]:
        out = []
        for batch in batches:
            caught = _Caught()
            producer = PulsarProducer(type("P", (), {"_producer": caught})(), "t", "n", 1 << 20)
            producer.send_batch(batch, sequence_id=batch.last_sequence + 1)
            out.append(caught.sent)
        return out

    sent = asyncio.run(send())
    return [_At(msg, ledger, e, i) for e, msgs in enumerate(sent) for i, msg in enumerate(msgs)]


def _batch(recs: list[KafkaRecord], producer_id: int, base: int) -> KafkaBatch:
    if producer_id == NO_PRODUCER_ID:
        return KafkaBatch("t", 3, NO_PRODUCER_ID, -1, -1, -1, tuple(recs))
    last = (base + len(recs) - 1) % (1 << 31)
    return KafkaBatch("t", 3, producer_id, 2, base, last, tuple(recs))


plain = st.builds(  # what the Kafka clients send most: a UTF-8 key, a value, a timestamp
    KafkaRecord,
    key=st.text(min_size=1, max_size=12).map(str.encode),
    value=st.binary(max_size=64),
    headers=st.just(()),
    timestamp=st.integers(min_value=0, max_value=(1 << 62)),
)
kafka_batches = st.builds(
    _batch,
    st.lists(plain | records, min_size=1, max_size=30),
    st.just(NO_PRODUCER_ID) | st.integers(0, 1 << 40),
    sequences,
)


@settings(max_examples=200)
@given(st.lists(kafka_batches, min_size=1, max_size=5))
def test_every_record_reads_back_as_it_was_produced(batches):
    raw, held, drained = read_available(_Reader(_stored(batches)), None, 1 << 30)
    assert (held, drained) == (None, True)
    assert [r.records for r in raw] == [list(b.records) for b in batches]
    for entry, batch in zip(raw, batches, strict=True):
        assert (entry.producer_id, entry.epoch, entry.sequence) == (
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
        )


def _answered(entry: RawEntry, offset: int) -> StoredEntry:
    return StoredEntry(
        offset,
        entry.position,
        entry.producer_id,
        entry.epoch,
        entry.sequence,
        tuple(entry.records),
        entry.publish_time_ms,
        entry.size,
    )


@settings(max_examples=100)
@given(st.lists(kafka_batches, min_size=1, max_size=4), st.integers(0, 1 << 40))
def test_kafkas_decoders_read_the_fetch_answer_as_it_was_produced(batches, base):
    raw, _, _ = read_available(_Reader(_stored(batches)), None, 1 << 30)
    offset = base
    for entry, batch in zip(raw, batches, strict=True):
        data = encode_entry(_answered(entry, offset))
        for decoded in (PyRecordBatch(data), DefaultRecordBatch(data)):
            assert decoded.validate_crc()
            got = [
                (r.offset, r.key, r.value, [tuple(h) for h in r.headers], r.timestamp)
                for r in decoded
            ]
            assert got == [
                (
                    offset + i,
                    r.key,
                    r.value,
                    [(h.key, h.value) for h in r.headers],
                    PUBLISHED if r.timestamp is None else r.timestamp,
                )
                for i, r in enumerate(batch.records)
            ]
        offset += len(batch.records)


def test_the_edges_read_back():
    """Null and empty keys and values, a key not in UTF-8, headers with a null value, no
    timestamp, a zero timestamp, many records: each as produced."""
    recs = [
        KafkaRecord(None, None, (), 5),
        KafkaRecord(b"", b"", (), 0),
        KafkaRecord(b"\xff\xfe", b"v", (Header("h", None), Header("", b"\x00")), 7),
        KafkaRecord(b"k", b"v", (), None),
        KafkaRecord("ключ".encode(), b"", (), 1 << 62),
        *(KafkaRecord(str(i).encode(), b"x" * 100, (), 1_000 + i) for i in range(2_000)),
    ]
    raw, _, _ = read_available(_Reader(_stored([_batch(recs, 7, 0)])), None, 1 << 30)
    assert [len(r.records) for r in raw] == [len(recs)]
    assert raw[0].records == recs


def test_a_message_handed_out_again_never_joins_the_batch_being_read():
    """After a reconnection the client may hand out messages already taken; they are
    dropped by position, and the message after one dropped is placed by its ledger and
    entry again, even when its batch index follows the last one taken (here entry 0's
    second message, after entry 1's first: not the second record of entry 1)."""
    batches = [
        _batch([KafkaRecord(b"a", f"{n}:{i}".encode(), (), i) for i in range(3)], 7, 3 * n)
        for n in range(2)
    ]
    stored = _stored(batches)
    first, second = stored[:3], stored[3:]
    again = _Reader([second[0], first[0], first[1], first[2], second[1], second[2]])
    raw, _, _ = read_available(again, None, 1 << 30, last=(9, 0, 2))
    assert [(r.entry, r.batch_index, len(r.records)) for r in raw] == [(1, 0, 3)]
    assert [r.value for r in raw[0].records] == [b"1:0", b"1:1", b"1:2"]
    assert raw[0].last == (9, 1, 2)


def test_a_read_ends_at_an_entry_boundary_within_its_budget():
    batches = [_batch([KafkaRecord(b"k", b"v" * 50, (), 1)] * 10, 7, 10 * n) for n in range(3)]
    reader = _Reader(_stored(batches))
    raw, held, drained = read_available(reader, None, 1)
    assert [(r.entry, len(r.records)) for r in raw] == [(0, 10)]
    assert (held.message_id().at, drained) == ((9, 1, 0), False)
    raw, held, drained = read_available(reader, held, 1 << 20, last=raw[0].last)
    assert [(r.entry, len(r.records), r.sequence) for r in raw] == [(1, 10, 10), (2, 10, 20)]
    assert (held, drained) == (None, True)
