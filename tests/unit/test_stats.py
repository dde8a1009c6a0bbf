"""Stats: outcomes from the error classes, lost dedup state, Prometheus text."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.observability.stats import OUTCOMES, Stats, outcome_for


def test_stats_count_outcomes_and_render_prometheus():
    stats = Stats()
    stats.record("t", 1, 0, None, 3, 0.002)
    stats.record("t", 1, 0, errors.DuplicateSequenceNumber(), 3, 0.001)
    stats.record("t", -1, 0, errors.RequestTimedOut(), 1, 0.5)
    assert stats.total.batches["accepted"] == 1
    assert stats.by_producer[1].records["duplicate"] == 3
    assert -1 not in stats.by_producer
    text = stats.prometheus({"open_producers": 2})
    assert 'kop_dedup_batches_total{topic="t",outcome="failed"} 1' in text
    assert "kop_dedup_batch_latency_seconds_count 3" in text
    assert "kop_dedup_open_producers 2" in text


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, "accepted"),
        (errors.DuplicateSequenceNumber(), "duplicate"),
        (errors.OutOfOrderSequenceNumber(), "out_of_order"),
        (errors.InvalidProducerEpoch(), "fenced"),
        (errors.ProducerFenced(), "fenced"),
        (errors.InvalidRecord(), "invalid"),
        (errors.MessageTooLarge(), "invalid"),
        (errors.InvalidTopic(), "invalid"),
        (errors.UnknownTopicOrPartition(), "invalid"),
        (errors.InvalidRequest(), "invalid"),
        (errors.NotEnoughReplicas(), "failed"),
        (errors.KafkaStorageError(), "failed"),
        (errors.KafkaError(), "failed"),
    ],
)
def test_outcome_is_read_from_the_error_class(error, outcome):
    assert outcome_for(error) == outcome


def test_a_subclass_of_a_listed_error_falls_where_its_parent_does():
    class HeldTooLong(errors.OutOfOrderSequenceNumber):
        pass

    assert outcome_for(HeldTooLong("gap not filled")) == "out_of_order"


def test_every_error_class_has_an_outcome_among_the_counted_ones():
    for cls in errors.BY_CODE.values():
        assert outcome_for(cls()) in OUTCOMES


def test_lost_dedup_state_is_counted_in_totals_topic_producer_and_metrics():
    stats = Stats()
    stats.record("orders", 17, 0, None, 3, 0.002)
    stats.dedup_state_lost("orders", 17, 0, 0, 2)
    stats.dedup_state_lost("orders", 17, 0, 3, 5)
    stats.dedup_state_lost("other", -1, 0, 0, 0)
    assert stats.totals()["dedupStateLost"] == 3
    assert stats.by_topic["orders"].to_dict()["dedupStateLost"] == 2
    assert stats.by_producer[17].dedup_state_lost == 2
    text = stats.prometheus({})
    assert 'kop_dedup_dedup_state_lost_total{topic="orders"} 2' in text
    assert 'kop_dedup_dedup_state_lost_total{topic="other"} 1' in text
    assert "# TYPE kop_dedup_dedup_state_lost_total counter" in text


def test_the_latest_lost_dedup_state_names_producer_topic_and_sequences():
    stats = Stats()
    assert stats.totals()["lastDedupStateLost"] is None
    stats.dedup_state_lost("orders", 17, 2, 10, 14)
    last = stats.totals()["lastDedupStateLost"]
    assert {k: last[k] for k in ("topic", "producerId", "producerEpoch")} == {
        "topic": "orders",
        "producerId": 17,
        "producerEpoch": 2,
    }
    assert (last["firstSequence"], last["lastSequence"]) == (10, 14)
