from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup.errors import InvalidRecord, MessageTooLarge
from kop_dedup.protocol.records import (
    SEQ_MODULUS,
    KafkaBatch,
    check_shape,
    from_pulsar,
    last_sequence_for,
    next_sequence,
    rec,
    to_pulsar,
    unwrap,
)
from tests import strategies as s


def make(base: int, last: int, n: int, *, pid: int = 7, epoch: int = 0) -> KafkaBatch:
    return KafkaBatch("t", 0, pid, epoch, base, last, tuple(rec(b"x") for _ in range(n)))


def test_next_sequence_wraps_after_int32_max():
    assert next_sequence(SEQ_MODULUS - 1) == 0
    assert next_sequence(41) == 42


def test_last_sequence_wraps():
    assert last_sequence_for(SEQ_MODULUS - 2, 4) == 1


def test_batch_spanning_the_wrap_is_valid():
    check_shape(make(SEQ_MODULUS - 2, 1, 4))


@pytest.mark.parametrize(
    ("base", "last", "n", "match"),
    [
        (0, 0, 0, "at least one record"),
        (0, 3, 3, "does not match"),
        (-1, 0, 2, "baseSequence -1"),
        (0, SEQ_MODULUS, 1, "lastSequence"),
    ],
)
def test_malformed_batches_are_invalid_record(base, last, n, match):
    with pytest.raises(InvalidRecord, match=match):
        check_shape(make(base, last, n))


def test_epoch_and_producer_id_ranges():
    with pytest.raises(InvalidRecord, match="producerEpoch"):
        check_shape(make(0, 0, 1, epoch=32768))
    with pytest.raises(InvalidRecord, match="producerId"):
        check_shape(make(0, 0, 1, pid=-5))


def test_non_idempotent_batch_skips_sequence_checks():
    check_shape(make(-1, -1, 2, pid=-1))


def test_limits_raise_message_too_large():
    with pytest.raises(MessageTooLarge, match="records"):
        check_shape(make(0, 2, 3), max_records=2)
    with pytest.raises(MessageTooLarge, match="bytes"):
        check_shape(make(0, 2, 3), max_bytes=2)


@given(s.sequences, s.counts)
def test_consistent_last_sequence_always_passes(base, n):
    check_shape(make(base, last_sequence_for(base, n), n))


@given(s.sequences, s.counts, st.integers(min_value=1, max_value=SEQ_MODULUS - 1))
def test_any_other_last_sequence_fails(base, n, delta):
    wrong = (last_sequence_for(base, n) + delta) % SEQ_MODULUS
    with pytest.raises(InvalidRecord):
        check_shape(make(base, wrong, n))


@given(s.extended, st.integers(min_value=-(1 << 29), max_value=1 << 29))
def test_unwrap_recovers_any_sequence_near_the_reference(reference, offset):
    target = reference + offset
    if target < 0:
        return
    assert unwrap(target % SEQ_MODULUS, reference) == target


@given(s.sequences)
def test_unwrap_without_reference_is_identity(seq):
    assert unwrap(seq, None) == seq


def test_unwrap_across_the_wrap_both_ways():
    ref = SEQ_MODULUS - 1  # last sent: 2147483647
    assert unwrap(0, ref) == SEQ_MODULUS  # the next one is above, not 0
    assert unwrap(SEQ_MODULUS - 3, SEQ_MODULUS + 2) == SEQ_MODULUS - 3  # a retry from before


@given(s.extended)
def test_pulsar_ids_never_zero_and_round_trip(ext):
    assert to_pulsar(ext) >= 1
    assert from_pulsar(to_pulsar(ext)) == ext


def test_pulsar_minus_one_means_no_state():
    assert from_pulsar(-1) is None
