"""The typed requests and answers of the transaction coordinator's surface (see the
package docstring): what a transport (HTTP, the Kafka listener) builds from its wire
format and reads back. No transport types; errors travel as Kafka error classes
(:mod:`kop_dedup.errors`), raised or carried in an answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from kop_dedup import errors

__all__ = [
    "EndTxn",
    "InitProducerId",
    "ProduceAnswer",
    "ProducerIdAndEpoch",
    "StageOffsets",
    "TxnOffset",
]


@dataclass(frozen=True, slots=True)
class InitProducerId:
    """Kafka's InitProducerId for a transactional id.

    ``timeout_ms`` None: the default transaction timeout. ``producer_id`` and
    ``producer_epoch`` (KIP-360, both or neither): the caller's current ones; when they
    are the id's current ones the epoch is bumped, when they are the ones the last
    bump replaced the answer repeats it, otherwise PRODUCER_FENCED."""

    transactional_id: str
    timeout_ms: int | None = None
    check_back_url: str | None = None
    producer_id: int | None = None
    producer_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class TxnOffset:
    """One consumer-group offset to stage (the next record to read)."""

    topic: str
    partition: int
    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class StageOffsets:
    """Kafka's TxnOffsetCommit. ``member_id`` and ``generation`` (KIP-447, both or
    neither): checked against the group as a member's commit is, with ``instance_id``
    (a static member's, KIP-345) when given. ``token``: the transaction the caller
    means (see the package docstring)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group: str
    offsets: tuple[TxnOffset, ...]
    member_id: str | None = None
    generation: int | None = None
    token: str | None = None
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class EndTxn:
    """Kafka's EndTxn. ``token``: the transaction the caller means."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    token: str | None = None


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    """One transactional batch's answer: ``error`` None when durably journaled (visible
    once the transaction commits); ``message_id`` the journal position when known;
    ``counted``: the produce path answered (and counted) it, else the coordinator
    refused it before journaling."""

    error: errors.KafkaError | None
    message_id: str | None = None
    counted: bool = False
