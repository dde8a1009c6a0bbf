"""Coordinators: state kept in Pulsar with one writer per state partition.

Both transports (HTTP in :mod:`kop_dedup.transports.http`, the Kafka listener in
:mod:`kop_dedup.transports.kafka`) call the same coordinators, through the
:class:`~kop_dedup.runtime.Runtime` that owns them. The coordinators speak neither
transport: typed requests and answers (frozen dataclasses) in, Kafka error classes
(:mod:`kop_dedup.errors`, each with its code and whether it is retriable) raised or
carried in answers. The produce path itself (idempotent batches) is
:class:`kop_dedup.produce.service.ProduceService`, not a coordinator.

**The surface the transports call**, and nothing more (a unit test checks that each
name below exists, so this list stays true):

Registries (``runtime.registry``, :class:`~.registry.Registry`; :mod:`.producer_ids`,
:mod:`.epochs`, :mod:`.transactional_ids`):

- ``ProducerIdAllocator.allocate() -> int``: a producer id for an idempotent producer
  (InitProducerId without a transactional id, both transports).
- ``EpochRegistry.highest(producer_id) -> int | None``: the highest epoch recorded for a
  producer id through any sidecar (for GET /v1/producers/{id}).

Transactions (``runtime.transactions``,
:class:`~.transactions.coordinator.TransactionCoordinator`; requests and answers in
:mod:`.transactions.requests`; the calls, their answers and error codes are written
down in :mod:`kop_dedup.coordination.transactions`):

- ``init_producer_id(InitProducerId) -> ProducerIdAndEpoch``;
  ``check_timeout(timeout_ms) -> int`` (50 INVALID_TRANSACTION_TIMEOUT)
- ``add_partitions(transactional_id, producer_id, epoch, partitions)
  -> {partition: KafkaError | None}``; ``add_offsets(transactional_id, producer_id,
  epoch, group)``
- ``produce(transactional_id, batches, deadline, token, *, join) -> [ProduceAnswer]``
- ``stage_offsets(StageOffsets)``; ``end(EndTxn)``
- ``describe(transactional_id) -> Transaction | None``; ``open_transactions()
  -> [Transaction]``; ``owned_open() -> int`` and ``stats`` for /metrics and /stats

Errors: 49 INVALID_PRODUCER_ID_MAPPING, 47 INVALID_PRODUCER_EPOCH (produce) or 90
PRODUCER_FENCED (the transaction calls), 48 INVALID_TXN_STATE, 51
CONCURRENT_TRANSACTIONS (retry), 50 INVALID_TRANSACTION_TIMEOUT, 22/25 for a group
member's staged offsets (KIP-447), NOT_COORDINATOR and the broker's failures
(retriable).

Consumer groups (``runtime.groups``, :class:`~.groups.coordinator.GroupCoordinator`;
requests and answers in :mod:`.groups.api`; the calls and their errors are written
down in :mod:`kop_dedup.coordination.groups`):

- ``configure``, ``describe``, ``join``, ``heartbeat``, ``leave``, ``pull``,
  ``commit``, ``reset``, ``reset_status``; ``pulls_in_flight`` for /metrics
- ``runtime.group_lag`` (:class:`~.groups.lag.GroupLag`): ``lag(group)``, ``rows``
- ``runtime.offsets`` (:class:`~.groups.store.GroupStore`): ``commit(group, offsets)``,
  ``fetch(group, require_stable=)``
- :mod:`.groups.simple` (the Kafka listener's OffsetCommit and OffsetFetch for
  consumers that assign their partitions): ``commit``, ``fetch``

Errors: ``StaleMember`` (22 ILLEGAL_GENERATION, 25 UNKNOWN_MEMBER_ID), 69
GROUP_ID_NOT_FOUND, 42 INVALID_REQUEST, 1 OFFSET_OUT_OF_RANGE, 88
UNSTABLE_OFFSET_COMMIT (a fetch that requires stable offsets while a transaction's are
pending), NOT_COORDINATOR and the broker's failures (retriable).

Everything else here (the state managers, applier, journal, stores, readers, sweeps)
is internal: a transport never calls it.
"""

from __future__ import annotations

__all__: list[str] = []
