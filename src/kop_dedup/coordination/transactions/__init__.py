"""Kafka-style transactions by double journaling with a local copy.

``log`` keeps each transactional id's state in the partitioned, compacted transaction
log; ``journal`` names and bounds the journal topics transactional batches are written
to; ``copier`` applies a committed transaction by copying its journaled batches into
the data topics idempotently (from ``local_copy``, the batches this sidecar journaled,
kept in memory, else from the journal; ``ordering`` keeps copies into one partition in
decision order); ``checkback`` asks the application about transactions in
doubt; ``coordinator`` decides (Kafka's TransactionCoordinator split: decide here,
persist and load in ``log``, transitions as pure data in
:mod:`kop_dedup.protocol.transactions`).
"""
