"""The Kafka-style batch and record model, sequence arithmetic and shape checks.

Kafka sequences are int32 values that wrap from 2147483647 to 0. Pulsar
deduplication needs ids that only ever grow, so a Kafka sequence is *unwrapped*
into a 64-bit "extended" sequence relative to the last one known for that
producer (:func:`unwrap`), and published as ``extended + 1`` (:func:`to_pulsar`)
so that 0 never reaches the wire: the synchronous Python client ignores
``sequence_id=0`` and assigns its own.

>>> b = KafkaBatch("orders", 0, 17, 0, 0, 2, (rec(b"a"), rec(b"b"), rec(b"c")))
>>> check_shape(b)  # raises InvalidRecord when counts and sequences disagree
>>> to_pulsar(unwrap(0, None))
1
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from kop_dedup.errors import InvalidRecord, MessageTooLarge

__all__ = [
    "NO_PRODUCER_ID",
    "SEQ_MODULUS",
    "Header",
    "KafkaBatch",
    "KafkaRecord",
    "check_shape",
    "from_pulsar",
    "last_sequence_for",
    "next_sequence",
    "rec",
    "to_pulsar",
    "unwrap",
]

SEQ_MODULUS = 1 << 31
"""Kafka sequences live in [0, 2**31) and wrap to 0 after 2**31 - 1."""
_HALF = SEQ_MODULUS // 2
NO_PRODUCER_ID = -1
MAX_EPOCH = 32767
MAX_PRODUCER_ID = (1 << 63) - 1


Int16 = Annotated[int, Meta(ge=-(1 << 15), le=(1 << 15) - 1)]
Int32 = Annotated[int, Meta(ge=-(1 << 31), le=(1 << 31) - 1)]
Int64 = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
_REQUIRED: Any = object()
"""Default of ``KafkaRecord.value`` that ``__post_init__`` refuses: ``value`` must be
given (``None`` for a tombstone) but comes after the optional ``key``."""


# The three record types are frozen msgspec Structs, so that the HTTP edge decodes a
# produce body straight into them in one pass (rename: camelCase on the wire; unknown
# fields refused; integer bounds are Kafka's field widths). Python construction is as
# with a frozen dataclass: positional or by name, immutable, hashable, compared by
# value. gc=False: they hold only str, bytes, ints and tuples of each other, so they
# can take part in no reference cycle, and the collector need not track them.
class Header(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    key: Annotated[str, Meta(max_length=32_767)]
    value: bytes | None


class KafkaRecord(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    key: bytes | None = None
    value: bytes | None = _REQUIRED
    headers: tuple[Header, ...] = ()
    timestamp: Int64 | None = None

    def __post_init__(self) -> None:
        if self.value is _REQUIRED:
            raise TypeError("Object missing required field `value` (None for a tombstone)")

    @property
    def size(self) -> int:
        """Payload bytes counted against the batch size limit."""
        n = len(self.key or b"") + len(self.value or b"")
        for h in self.headers:
            n += len(h.key) + len(h.value or b"")
        return n


def rec(value: bytes | None, key: bytes | None = None) -> KafkaRecord:
    """A record with no headers or timestamp (handy in tests and docs)."""
    return KafkaRecord(key=key, value=value)


class KafkaBatch(Struct, frozen=True, rename="camel", forbid_unknown_fields=True, gc=False):
    topic: Annotated[str, Meta(max_length=1000)]
    partition: Int32
    producer_id: Int64
    producer_epoch: Int16
    base_sequence: Int32
    last_sequence: Int32
    records: tuple[KafkaRecord, ...]

    @property
    def idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def size(self) -> int:
        return sum(r.size for r in self.records)


def next_sequence(seq: int) -> int:
    """The sequence after ``seq``, wrapping from 2**31 - 1 to 0."""
    return (seq + 1) % SEQ_MODULUS


def last_sequence_for(base: int, count: int) -> int:
    """``lastSequence`` Kafka expects for ``count`` records from ``base``."""
    return (base + count - 1) % SEQ_MODULUS


def check_shape(
    batch: KafkaBatch, *, max_records: int | None = None, max_bytes: int | None = None
) -> None:
    """Raise :class:`InvalidRecord` (or MessageTooLarge) for a malformed batch.

    Checks Kafka's broker applies before any sequence rule: at least one
    record; for an idempotent batch, sequences in [0, 2**31), an epoch in
    [0, 32767] and ``lastSequence == baseSequence + count - 1`` modulo 2**31.
    """
    n = len(batch.records)
    if n == 0:
        raise InvalidRecord("batch has no records; a batch must carry at least one record")
    if max_records is not None and n > max_records:
        raise MessageTooLarge(f"batch has {n} records; the limit is {max_records}")
    if max_bytes is not None and (size := batch.size) > max_bytes:
        raise MessageTooLarge(f"batch payload is {size} bytes; the limit is {max_bytes}")
    if batch.idempotent:
        _check_idempotence_fields(batch)


def _check_idempotence_fields(batch: KafkaBatch) -> None:
    n = len(batch.records)
    if not 0 <= batch.producer_id <= MAX_PRODUCER_ID:
        raise InvalidRecord(f"producerId {batch.producer_id} is out of range (-1 or 0..2^63-1)")
    if not 0 <= batch.producer_epoch <= MAX_EPOCH:
        raise InvalidRecord(f"producerEpoch {batch.producer_epoch} is out of range (0..32767)")
    fields = (("baseSequence", batch.base_sequence), ("lastSequence", batch.last_sequence))
    for name, value in fields:
        if not 0 <= value < SEQ_MODULUS:
            raise InvalidRecord(f"{name} {value} is out of range (0..2147483647)")
    expected = last_sequence_for(batch.base_sequence, n)
    if batch.last_sequence != expected:
        raise InvalidRecord(
            f"lastSequence {batch.last_sequence} does not match baseSequence "
            f"{batch.base_sequence} + {n} records - 1 = {expected} (mod 2^31)"
        )


def unwrap(seq: int, reference: int | None) -> int:
    """Extend a 31-bit Kafka sequence to the 64-bit value nearest ``reference``.

    ``reference`` is an extended sequence already known for the producer
    (the last one sent or persisted) or None when there is none, in which case
    the sequence is taken as is. The result is within 2**30 of the reference,
    and never negative: a sequence just past a wrap maps above the reference,
    a retry of one just before it maps below.
    """
    if reference is None or reference < 0:
        return seq
    base = reference - (reference % SEQ_MODULUS)
    candidate = base + seq
    if candidate - reference > _HALF and candidate >= SEQ_MODULUS:
        candidate -= SEQ_MODULUS
    elif reference - candidate > _HALF:
        candidate += SEQ_MODULUS
    return candidate


def to_pulsar(extended: int) -> int:
    """The Pulsar sequence id for an extended Kafka sequence (never 0)."""
    return extended + 1


def from_pulsar(sequence_id: int) -> int | None:
    """The extended Kafka sequence behind a Pulsar sequence id; None for -1 (none)."""
    return None if sequence_id < 1 else sequence_id - 1
