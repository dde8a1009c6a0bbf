"""Smoke tests of the Kafka test tooling against the reference broker only: real Kafka
clients (confluent-kafka) and Kafka's own Java tools produce, copy and read back on a
real Apache Kafka 4.1 node. They prove the tooling works, and they are the templates
for the same checks against the sidecar's Kafka listener (point the ``Target`` or the
bootstrap address at it)."""

from __future__ import annotations

import signal
import time

import pytest

from kop_dedup_tools.launcher import free_port
from tests.kafka_conformance import (
    Target,
    by_partition,
    commit_then_abort,
    keys_values,
    observe_both,
    records,
)
from tests.kafka_copier import copy_exactly_once_through_aborts
from tests.kafka_perf_copier import run_producer_performance
from tests.kafka_tools import (
    ToolTimeout,
    producer_report,
    run_verifiable_consumer,
    run_verifiable_producer,
    start_verifiable_producer,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def kafka(kafka_reference) -> Target:
    return Target("kafka", kafka_reference.bootstrap)


def test_idempotent_producer_with_five_in_flight_is_read_back_once_in_order(kafka):
    topic = kafka.create_topic(partitions=3)
    sent = records(3, 1000)
    reports = kafka.produce(
        topic,
        sent,
        enable_idempotence=True,
        acks="all",
        max_in_flight_requests_per_connection=5,
        linger_ms=1,
        batch_num_messages=50,  # many small batches, so several are in flight at once
    )
    assert [r.error_name for r in reports if r.error] == []
    seen = kafka.read(topic, 3)
    assert keys_values(seen) == by_partition(sent)
    # Kafka's offsets are dense from 0, and the delivery reports named them
    assert {p: [r.offset for r in recs] for p, recs in seen.items()} == {
        p: list(range(1000)) for p in range(3)
    }
    assert sorted((r.partition, r.offset) for r in reports) == sorted(
        (p, r.offset) for p, recs in seen.items() for r in recs
    )


def test_read_committed_consumer_sees_the_committed_transaction_and_not_the_aborted_one(kafka):
    seen = commit_then_abort(kafka, isolation_levels=("read_committed", "read_uncommitted"))
    assert seen["errors"] == ["NONE"]
    committed, aborted = by_partition(records(2, 20, "c-")), by_partition(records(2, 20, "a-"))
    assert seen["read_committed"] == committed
    # the aborted records were written: a read_uncommitted consumer of Kafka sees them
    assert seen["read_uncommitted"] == {p: committed[p] + aborted[p] for p in range(2)}


def test_a_scenario_observed_twice_on_kafka_is_equal_and_tells_commit_from_abort(kafka):
    twice = observe_both(commit_then_abort, kafka=kafka, sidecar=kafka)
    assert twice.kafka == twice.sidecar  # nothing per-run (topic names, times) leaks in
    assert commit_then_abort(kafka, abort_second=False) != twice.kafka


def test_verifiable_producer_acked_records_are_what_a_consumer_reads(kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    produced = run_verifiable_producer(kafka.bootstrap, topic, tmp_path, max_messages=1000)
    assert produced.run.returncode == 0, produced.run.stderr_tail()
    assert produced.failed == ()
    assert produced.sent == produced.acked_count == len(produced.acked) == 1000
    assert sorted(int(r.value) for r in produced.acked) == list(range(1000))

    consumed = run_verifiable_consumer(
        kafka.bootstrap, topic, kafka.unique("g"), tmp_path, max_messages=1000
    )
    assert consumed.run.returncode == 0, consumed.run.stderr_tail()
    assert consumed.consumed == len(consumed.records) == 1000
    assert sorted((r.partition, r.offset, r.value) for r in consumed.records) == sorted(
        (r.partition, r.offset, r.value) for r in produced.acked
    )
    assert sum(kafka.end_offsets(topic, 2).values()) == 1000  # nothing beyond what was acked


def test_producer_performance_counts_what_the_topic_holds(kafka, tmp_path):
    topic = kafka.create_topic(partitions=1)
    perf = run_producer_performance(
        kafka.bootstrap,
        topic,
        tmp_path,
        num_records=5000,
        record_size=100,
        props={"enable.idempotence": "true", "max.in.flight.requests.per.connection": 5},
    )
    assert perf.run.returncode == 0, perf.run.stderr_tail()
    assert perf.total is not None, perf.run.other_lines
    assert perf.total.records == 5000
    assert perf.total.records_per_sec > 0
    assert kafka.end_offsets(topic, 1) == {0: 5000}


def test_transactional_message_copier_copies_a_topic_exactly_once_through_aborts(kafka, tmp_path):
    copy_exactly_once_through_aborts(kafka, tmp_path, timeout=120)


def test_a_tool_past_its_deadline_is_killed_and_says_what_it_printed(tmp_path):
    """No broker at the address: the producer waits for metadata until killed."""
    with start_verifiable_producer(
        f"127.0.0.1:{free_port()}", "nowhere", tmp_path, max_messages=10
    ) as tool:
        deadline = time.monotonic() + 120  # a JVM starts slowly on a busy machine
        while not tool.events() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert tool.events()[0]["name"] == "startup_complete", tool.stderr_path.read_text()
        with pytest.raises(ToolTimeout) as caught:
            tool.wait(timeout=2)
        assert not tool.running()
    partial = caught.value.partial
    assert partial.returncode == -signal.SIGKILL
    assert [e["name"] for e in partial.events] == ["startup_complete"]
    assert producer_report(partial.events).acked_count is None
