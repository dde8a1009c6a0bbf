"""Counters and a latency histogram, as JSON for REST and as Prometheus text.

The produce service calls two methods, from the event loop only:

>>> stats = Stats()
>>> stats.record("orders", 17, 0, None, records=3, seconds=0.002)
>>> stats.record("orders", 17, 0, errors.DuplicateSequenceNumber(), records=3, seconds=0.001)
>>> stats.dedup_state_lost("orders", 17, 0, first_sequence=0, last_sequence=2)
>>> stats.totals()["batches"]["duplicate"], stats.totals()["dedupStateLost"]
(1, 1)

``record`` counts one batch answer; its outcome (:data:`OUTCOMES`) is derived
from the error's class in :mod:`kop_dedup.errors`, never from a literal code.
``dedup_state_lost`` counts a resend the broker stored again because its
deduplication state for the producer name was gone.

Outcomes are counted per Kafka topic and per producer id. Prometheus gets
per-topic series only (producer ids are unbounded label values; see
:mod:`kop_dedup.observability.metrics`); the REST endpoint answers per
producer id.

Topic names come from clients, so they are bounded before they are counted:
a name that is not a valid Kafka topic is counted under :data:`INVALID_TOPIC`,
and once ``max_topics`` valid names are counted, further names are counted
under :data:`OTHER_TOPICS`. Neither label can be a Kafka topic name (``~`` is
outside Kafka's alphabet). A counted name is never dropped: a Prometheus
counter that vanished and came back would read as a reset.

Producer ids are REST-only, so they are bounded differently: the counters of
the ``max_producers`` most recently used ids are kept (a batch counted or a
lookup by ``/v1/stats/producers`` uses them; the least recently used is
evicted first, see :class:`~kop_dedup.bounded.BoundedMap`); evictions are
counted in ``producersEvicted``. An evicted id that comes back starts from
zero.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.bounded import BoundedMap
from kop_dedup.pulsar.naming import validate_topic

__all__ = [
    "INVALID_TOPIC",
    "OTHER_TOPICS",
    "OUTCOMES",
    "Counters",
    "ProducerCounters",
    "Stats",
    "outcome_for",
]

INVALID_TOPIC = "~invalid"
"""The one topic label under which batches to invalid topic names are counted."""
OTHER_TOPICS = "~other"
"""The topic label for valid names beyond ``max_topics``."""
_FIXED_LABELS = frozenset({INVALID_TOPIC, OTHER_TOPICS})
_EPOCH_PROVEN = frozenset({"accepted", "duplicate"})  # outcomes where the epoch was in use

OUTCOMES = ("accepted", "duplicate", "out_of_order", "fenced", "invalid", "failed")
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# Which outcome an error class falls in; a subclass falls where its nearest listed
# ancestor does, anything unlisted is "failed".
_OUTCOME_OF: dict[type[errors.KafkaError], str] = {
    errors.DuplicateSequenceNumber: "duplicate",
    errors.OutOfOrderSequenceNumber: "out_of_order",
    errors.InvalidProducerEpoch: "fenced",
    errors.ProducerFenced: "fenced",
    errors.InvalidRecord: "invalid",
    errors.MessageTooLarge: "invalid",
    errors.InvalidTopic: "invalid",
    errors.UnknownTopicOrPartition: "invalid",
    errors.InvalidRequest: "invalid",
}


def outcome_for(error: errors.KafkaError | None) -> str:
    """Which counter an answer falls in: ``None`` (stored) is "accepted".

    >>> outcome_for(errors.ProducerFenced())
    'fenced'
    """
    if error is None:
        return "accepted"
    for cls in type(error).__mro__:
        outcome = _OUTCOME_OF.get(cls)
        if outcome is not None:
            return outcome
    return "failed"


@dataclass(slots=True)
class Counters:
    batches: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    dedup_state_lost: int = 0
    """Resends the broker stored again (see :meth:`Stats.dedup_state_lost`)."""

    def add(self, outcome: str, records: int) -> None:
        self.batches[outcome] += 1
        self.records[outcome] += records

    def to_dict(self) -> dict[str, object]:
        return {
            "batches": dict(self.batches),
            "records": dict(self.records),
            "dedupStateLost": self.dedup_state_lost,
        }


@dataclass(slots=True)
class ProducerCounters(Counters):
    highest_epoch: int | None = None
    """The highest epoch among this id's batches that were stored or answered duplicate
    here. A refused batch proves nothing about the producer's epoch (a batch at epoch
    32767 answered 87 must not show as the producer's epoch), so it does not count."""


class Stats:
    def __init__(self, *, max_topics: int = 1_000, max_producers: int = 10_000) -> None:
        self.started = time.time()
        self.max_topics, self.max_producers = max_topics, max_producers
        self.total = Counters()
        self.by_topic: dict[str, Counters] = {}
        """Counters by topic label: at most ``max_topics`` names and the two fixed labels."""
        self._named_topics = 0
        self.by_producer = BoundedMap[int, ProducerCounters](max_producers)
        """Counters by producer id, least recently used first, at most ``max_producers``."""
        self._latency_counts = [0] * (len(_BUCKETS_S) + 1)
        self.latency_sum = 0.0
        self.last_dedup_state_lost: dict[str, object] | None = None

    def topic_label(self, topic: str) -> str | None:
        """The label ``topic`` is (or would be) counted under; None: not counted yet.

        Pure lookup: counts nothing.
        """
        if topic in self.by_topic and topic not in _FIXED_LABELS:
            return topic
        try:
            validate_topic(topic)
        except errors.InvalidTopic:
            return INVALID_TOPIC
        return OTHER_TOPICS if self._named_topics >= self.max_topics else None

    def _topic(self, topic: str) -> Counters:
        counters = self.by_topic.get(topic)
        if counters is not None and topic not in _FIXED_LABELS:
            return counters
        label = self.topic_label(topic)
        if label is None:
            label = topic
            self._named_topics += 1
        return self.by_topic.setdefault(label, Counters())

    @property
    def producers_evicted(self) -> int:
        """Producer ids whose counters were dropped to keep ``max_producers``."""
        return self.by_producer.dropped

    def _producer(self, producer_id: int) -> ProducerCounters:
        """The id's counters, now the most recently used; evicts the least if full."""
        counters = self.by_producer.get(producer_id)
        if counters is None:
            counters = self.by_producer[producer_id] = ProducerCounters()
        return counters

    def record(
        self,
        topic: str,
        producer_id: int,
        producer_epoch: int,
        error: errors.KafkaError | None,
        records: int,
        seconds: float,
    ) -> None:
        """Count one batch answer: ``error`` None when it was stored.

        ``topic`` is the name as the client sent it, valid or not (see the module
        docstring for how names are bounded); ``producer_id`` < 0 (a non-idempotent
        batch) counts in no producer's stats.
        """
        outcome = outcome_for(error)
        self.total.add(outcome, records)
        self._topic(topic).add(outcome, records)
        if producer_id >= 0:
            producer = self._producer(producer_id)
            producer.add(outcome, records)
            if outcome in _EPOCH_PROVEN and (
                producer.highest_epoch is None or producer_epoch > producer.highest_epoch
            ):
                producer.highest_epoch = producer_epoch
        self._latency_counts[bisect.bisect_left(_BUCKETS_S, seconds)] += 1
        self.latency_sum += seconds

    def dedup_state_lost(
        self,
        topic: str,
        producer_id: int,
        producer_epoch: int,
        first_sequence: int,
        last_sequence: int,
    ) -> None:
        """Count a resend the broker stored again: its dedup state for the name was gone.

        The caller logs the ERROR line; this counts it in the totals, the topic's
        counters and the producer's, and keeps the latest one for ``/v1/stats``.
        """
        self.last_dedup_state_lost = {
            "topic": topic if self.topic_label(topic) != INVALID_TOPIC else INVALID_TOPIC,
            "producerId": producer_id,
            "producerEpoch": producer_epoch,
            "firstSequence": first_sequence,
            "lastSequence": last_sequence,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self.total.dedup_state_lost += 1
        self._topic(topic).dedup_state_lost += 1
        if producer_id >= 0:
            self._producer(producer_id).dedup_state_lost += 1

    def latency_buckets(self) -> list[tuple[str, int]]:
        """(upper bound as the text format writes it, count in that bucket alone)."""
        bounds = [repr(b) for b in _BUCKETS_S] + ["+Inf"]
        return list(zip(bounds, self._latency_counts, strict=True))

    def totals(self) -> dict[str, object]:
        return {
            "uptimeSeconds": round(time.time() - self.started, 3),
            **self.total.to_dict(),
            "topics": self._named_topics,
            "maxTopics": self.max_topics,
            "producers": len(self.by_producer),
            "maxProducers": self.max_producers,
            "producersEvicted": self.producers_evicted,
            "lastDedupStateLost": self.last_dedup_state_lost,
        }
