"""A stored entry as the RecordBatch v2 a Fetch answers with: offsets, producer fields
and records survive, checked by two decoders (aiokafka's Cython one, kafka-python's)."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as PyRecordBatch

from kop_dedup.protocol.records import SEQ_MODULUS, KafkaRecord
from kop_dedup.pulsar.fetching import StoredEntry
from kop_dedup.transports.kafka.fetched import encode_entry
from tests.strategies import records, sequences

PUBLISHED = 1_700_000_000_000

entries = st.builds(
    StoredEntry,
    base_offset=st.integers(0, (1 << 62)),
    position=st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 30), st.integers(-1, 500)),
    producer_id=st.integers(-1, 1 << 40),
    producer_epoch=st.integers(-1, 32767),
    base_sequence=st.just(-1) | sequences,
    records=st.lists(records, min_size=1, max_size=20).map(tuple),
    publish_time_ms=st.just(PUBLISHED),
    size=st.just(0),
)


def _expected(r: KafkaRecord) -> tuple[object, ...]:
    ts = PUBLISHED if r.timestamp is None else r.timestamp
    return r.key, r.value, [(h.key, h.value) for h in r.headers], ts


@given(entries)
def test_an_entry_is_one_batch_at_its_offsets_with_its_producer_fields(entry):
    data = encode_entry(entry)
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    assert batch.base_offset == entry.base_offset
    assert batch.next_offset == entry.next_offset
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        entry.producer_id,
        entry.producer_epoch,
        entry.base_sequence,
    )
    assert not batch.is_transactional
    got = [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in batch]
    assert got == [(entry.base_offset + i, *_expected(r)) for i, r in enumerate(entry.records)]


@given(entries)
def test_kafka_pythons_reader_decodes_the_same_batch(entry):
    batch = PyRecordBatch(encode_entry(entry))
    assert batch.validate_crc()
    assert batch.base_offset == entry.base_offset
    got = list(batch)
    assert [r.offset for r in got] == list(range(entry.base_offset, entry.next_offset))
    assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in entry.records]


@given(entries, st.data())
def test_an_entry_from_its_nth_record_keeps_offsets_sequences_and_positions(entry, data):
    n = data.draw(st.integers(0, len(entry.records) - 1))
    later = entry.starting_at(n)
    if n == 0:
        assert later is entry
        return
    assert later.records == entry.records[n:]
    assert later.base_offset == entry.base_offset + n
    assert later.next_offset == entry.next_offset
    ledger, number, batch_index = entry.position
    assert later.position == (ledger, number, max(batch_index, 0) + n)
    if entry.base_sequence < 0:
        assert later.base_sequence == -1
    else:
        assert later.base_sequence == (entry.base_sequence + n) % SEQ_MODULUS
    assert (later.producer_id, later.producer_epoch) == (entry.producer_id, entry.producer_epoch)
