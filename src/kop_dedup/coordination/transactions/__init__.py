"""Kafka-style transactions by double journaling with a local copy.

Kafka's coordinator split, one concept per module:

=================  ==================================================================
``coordinator``    decides (Kafka's TransactionCoordinator): init, the partitions and
                   offsets a transaction begins with, staged offsets, end, timeouts
``state``          persists and loads each id's state in the transaction log
                   (TransactionStateManager), under the partitions' one failure rule
``applier``        drives decisions to completion (TransactionMarkerChannelManager):
                   copies, decision record, offsets, Complete*
``admission``      transactional produce: which batches are journaled, into which
                   transaction; the partitions they join; end-txn's gate
``checkback``      asks the application about transactions in doubt
``copier``         copies a committed transaction's batches idempotently, from
                   ``local_copy`` (what this sidecar journaled) or the ``journal``;
                   ``ordering`` keeps copies into one partition in decision order
``log``            the log's record format and the in-memory view of it
``deleted``        a data topic deleted under a commit: dropped from its copy
``hanging``        an operator's abort of a commit whose copy cannot complete
                   (WriteTxnMarkers, ``kafka-transactions abort``)
=================  ==================================================================

The transitions themselves are pure data in :mod:`kop_dedup.protocol.transactions`.

**The surface transports call** (HTTP and the Kafka listener; every coordinator's is
listed in :mod:`kop_dedup.coordination`). Typed requests and answers
(:mod:`.requests`, frozen dataclasses), Kafka error classes (:mod:`kop_dedup.errors`)
raised or carried in answers, no transport types.
``coordinator`` is a :class:`~.coordinator.TransactionCoordinator`::

    ids = await coordinator.init_producer_id(InitProducerId("app", timeout_ms=60_000))
    # -> ProducerIdAndEpoch; 51 while an open transaction is fenced and aborted (retry),
    #    50 for a timeout out of range, 90 for a KIP-360 caller naming a stale epoch
    errs = await coordinator.add_partitions("app", pid, epoch, [("orders", 0)])
    # -> {("orders", 0): None} (AddPartitionsToTxn: begins the transaction, Ongoing;
    #    per partition 49, 90, 51 while a decision is being applied)
    await coordinator.add_offsets("app", pid, epoch, "group")   # AddOffsetsToTxn: begins it
    answers = await coordinator.produce("app", batches, deadline, token=None)
    # -> [ProduceAnswer(error, message_id, counted)], one per batch, in order; a
    #    partition not in the transaction joins it (join=False: 48 instead, Kafka's v1)
    await coordinator.stage_offsets(StageOffsets("app", pid, epoch, "group", offsets))
    await coordinator.end(EndTxn("app", pid, epoch, commit=True))
    # answered once the decision is durable; 0 for the same decision again after it
    # completed, 48 for the other one or nothing open, 51 while it is applied
    await coordinator.describe("app")            # -> Transaction | None
    await coordinator.open_transactions()        # -> [Transaction], oldest first
    await coordinator.pending_is_live("app", ordinal, marked_ms)   # for the group store

A Kafka client that calls AddPartitionsToTxn and then EndTxn(abort) without producing
gets 0 (its transaction is Ongoing), as from Kafka.

**Tokens** (``token`` on produce, ``StageOffsets``, ``EndTxn``): an optional string a
client picks when it begins a transaction, the way to get KIP-890's protection over
HTTP. The first request of a transaction binds it. A request whose token differs from
the open transaction's never joins, stages into or ends it: it is answered from
history when the token names a transaction of the id that completed (an end-txn of
the same decision: 0; anything else: 48 INVALID_TXN_STATE), and refused with 48
otherwise. Requests without a token behave as before (a late end-txn of a transaction
can then end the next one).

**Group fencing of transactional offsets** (KIP-447, ``member_id`` and
``generation`` on :class:`~.requests.StageOffsets`): checked as a member's commit
is (22 ILLEGAL_GENERATION, 25 UNKNOWN_MEMBER_ID); nothing is staged then.
"""
