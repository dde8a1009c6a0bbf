"""Pydantic models at the HTTP edge: the documented schema, and its slow decoder.

They are what the OpenAPI document shows, and they read every body but the
produce bodies the one-pass decoder accepts (produce.py: it decodes straight
into KafkaBatch and must accept nothing these refuse, see
tests/unit/test_produce_decoding.py): init-producer-id, the 422's field paths,
and a produce body with bad base64, whose batches ``to_batch`` converts one by
one.

JSON field names are Kafka's (camelCase). Keys, values and header values are
base64 strings or null. Every field Kafka's RecordBatch always carries is
required (a non-idempotent batch sends producerId, producerEpoch, baseSequence
and lastSequence as -1), and so is a record's ``value`` (``null`` is a
tombstone and must be sent as such); a record's ``key``, ``headers`` and
``timestamp`` may be left out. Types are strict: ``1.0`` or ``true`` is not an
integer. Shape problems that Kafka reports per batch (bad base64, bad counts)
are converted into per-batch errors by ``to_batch``, not into a 422 for the
whole request.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from kop_dedup.errors import InvalidRecord
from kop_dedup.protocol.records import Header, KafkaBatch, KafkaRecord

__all__ = [
    "BatchIn",
    "BatchOut",
    "EndTxnIn",
    "HeaderIn",
    "InitProducerIdIn",
    "InitProducerIdOut",
    "KafkaAnswer",
    "Model",
    "Offset",
    "OffsetCommitIn",
    "OffsetIn",
    "PartitionIndex",
    "ProduceIn",
    "ProduceOut",
    "RecordIn",
    "TxnOffsetCommitIn",
    "to_batch",
]

Int64 = Annotated[int, Field(ge=-(1 << 63), le=(1 << 63) - 1)]
Int32 = Annotated[int, Field(ge=-(1 << 31), le=(1 << 31) - 1)]
Int16 = Annotated[int, Field(ge=-(1 << 15), le=(1 << 15) - 1)]
# An Annotated bound wins over a Field(ge=...) given beside it: the non-negative kinds
# carry their own bounds (a negative offset or partition is a 422 naming the field).
PartitionIndex = Annotated[int, Field(ge=0, le=(1 << 31) - 1)]
Offset = Annotated[int, Field(ge=0, le=(1 << 63) - 1, description="the next record to read")]
B64 = Annotated[str | None, Field(description="base64, or null", examples=["aGVsbG8="])]
_PLAIN = "; -1 for a non-idempotent batch"


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class HeaderIn(Model):
    key: str = Field(max_length=32_767)
    value: B64 = Field(description="base64, or null (required: send null for no value)")


class RecordIn(Model):
    key: B64 = Field(default=None, description="base64, or null; absent means null")
    value: B64 = Field(description="base64, or null for a tombstone (required: send null)")
    headers: list[HeaderIn] = Field(default_factory=list, description="absent means none")
    timestamp: Int64 | None = Field(
        default=None, description="epoch milliseconds; absent or null means none"
    )


class BatchIn(Model):
    topic: str = Field(max_length=1000, examples=["orders"])
    partition: Int32 = Field(examples=[0])
    producerId: Int64 = Field(examples=[17], description="from init-producer-id" + _PLAIN)  # noqa: N815
    producerEpoch: Int16 = Field(examples=[0], description="from init-producer-id" + _PLAIN)  # noqa: N815
    baseSequence: Int32 = Field(examples=[0], description="the first record's" + _PLAIN)  # noqa: N815
    lastSequence: Int32 = Field(  # noqa: N815
        examples=[0], description="baseSequence + records - 1 (mod 2^31)" + _PLAIN
    )
    records: list[RecordIn]


TransactionalId = Annotated[str, Field(min_length=1, max_length=32_767)]
TransactionToken = Annotated[str, Field(min_length=1, max_length=256)]
_BINDS = (
    "(a string the client picks when it begins a transaction: the first request binds "
    "it; a request with another token never joins, stages into or ends it, and is "
    "answered 48, or from history when it names a complete transaction: KIP-890's "
    "protection over HTTP)"
)


class ProduceIn(Model):
    timeoutMs: int | None = Field(  # noqa: N815
        default=None,
        ge=1,
        le=(1 << 63) - 1,
        description="per-request deadline, milliseconds; at most KOP_DEDUP_MAX_TIMEOUT_MS "
        "(the document's maximum is the setting's value)",
    )
    transactionalId: TransactionalId | None = Field(  # noqa: N815
        default=None,
        description="every batch of the request is part of this transactional id's open "
        "transaction (the first batch starts one); answer 0 means durably journaled, "
        "visible once the transaction commits",
    )
    transactionToken: TransactionToken | None = Field(  # noqa: N815
        default=None,
        description="with transactionalId: the transaction the batches belong to " + _BINDS,
    )
    batches: list[BatchIn] = Field(min_length=1)


class BatchOut(BaseModel):
    topic: str
    partition: int
    errorCode: int  # noqa: N815
    error: str
    messageId: str | None  # noqa: N815
    errorMessage: str | None  # noqa: N815


class ProduceOut(BaseModel):
    results: list[BatchOut]


class InitProducerIdIn(Model):
    transactionalId: TransactionalId | None = None  # noqa: N815
    transactionTimeoutMs: Int32 | None = Field(  # noqa: N815
        default=None, description="default 60000; at most KOP_DEDUP_MAX_TRANSACTION_TIMEOUT_MS"
    )
    checkBackUrl: str | None = Field(  # noqa: N815
        default=None,
        min_length=1,
        max_length=4096,
        pattern=r"^https?://",
        description="asked (POST) whether to commit when a transaction of this id times out",
    )


class OffsetIn(Model):
    topic: str = Field(min_length=1, max_length=1000)
    partition: PartitionIndex
    offset: Offset
    metadata: str | None = Field(default=None, max_length=32_767)


class TxnOffsetCommitIn(Model):
    transactionalId: TransactionalId  # noqa: N815
    producerId: Int64  # noqa: N815
    producerEpoch: Int16  # noqa: N815
    groupId: str = Field(min_length=1, max_length=32_767)  # noqa: N815
    offsets: list[OffsetIn] = Field(min_length=1)
    transactionToken: TransactionToken | None = Field(  # noqa: N815
        default=None, description="the transaction the offsets belong to " + _BINDS
    )
    memberId: str | None = Field(  # noqa: N815
        default=None,
        min_length=1,
        max_length=1000,
        description="KIP-447: the group member the offsets are committed for; checked as "
        "its own commit is (25 UNKNOWN_MEMBER_ID)",
    )
    generation: Int32 | None = Field(
        default=None,
        description="KIP-447: the generation that member knows (22 ILLEGAL_GENERATION when "
        "stale); without memberId and generation nothing is checked",
    )


class EndTxnIn(Model):
    transactionalId: TransactionalId  # noqa: N815
    producerId: Int64  # noqa: N815
    producerEpoch: Int16  # noqa: N815
    commit: bool
    transactionToken: TransactionToken | None = Field(  # noqa: N815
        default=None, description="the transaction to end " + _BINDS
    )


class OffsetCommitIn(Model):
    offsets: list[OffsetIn] = Field(min_length=1)


class KafkaAnswer(BaseModel):
    """The answer of a call that succeeds or fails as a whole."""

    errorCode: int  # noqa: N815
    error: str
    errorMessage: str | None = None  # noqa: N815


class InitProducerIdOut(BaseModel):
    errorCode: int  # noqa: N815
    error: str
    producerId: int  # noqa: N815
    producerEpoch: int  # noqa: N815
    errorMessage: str | None = None  # noqa: N815


def _b64(value: str | None, what: str) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRecord(f"{what} is not valid base64: {exc}") from exc


def to_batch(b: BatchIn) -> KafkaBatch:
    """The domain batch; raises InvalidRecord for payloads that are not base64."""
    records = tuple(
        KafkaRecord(
            key=_b64(r.key, f"records[{i}].key"),
            value=_b64(r.value, f"records[{i}].value"),
            headers=tuple(
                Header(h.key, _b64(h.value, f"records[{i}].headers[{j}].value"))
                for j, h in enumerate(r.headers)
            ),
            timestamp=r.timestamp,
        )
        for i, r in enumerate(b.records)
    )
    return KafkaBatch(
        topic=b.topic,
        partition=b.partition,
        producer_id=b.producerId,
        producer_epoch=b.producerEpoch,
        base_sequence=b.baseSequence,
        last_sequence=b.lastSequence,
        records=records,
    )
