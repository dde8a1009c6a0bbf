"""Kafka itself as the oracle for the read side: ListOffsets, Fetch at and past the end,
out-of-range offsets under each ``auto.offset.reset``, OffsetFetch and OffsetCommit.
Each scenario runs against the reference broker and the sidecar's listener (its own
topics on each) and must observe the same."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition

from tests.integration.kafka_consume import (
    batches,
    fetch_request,
    list_offsets_request,
    offset_commit_request,
    offset_fetch_request,
)
from tests.kafka_conformance import Target, keys_values, records
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

BASE = 1_500_000_000_000


def _stamped(target: Target, topic: str, n: int) -> None:
    """``n`` records on partition 0 with timestamps BASE, BASE + 100, ... (idempotent)."""
    producer = Producer(target.config(**{"enable.idempotence": True, "linger.ms": 5}))
    for i in range(n):
        producer.produce(
            topic, value=f"v{i}".encode(), key=b"k", partition=0, timestamp=BASE + 100 * i
        )
    assert producer.flush(target.timeout) == 0


def list_offsets_scenario(target: Target) -> dict[str, Any]:
    topic = target.create_topic(partitions=2)
    _stamped(target, topic, 10)
    queries = {
        "earliest": -2,
        "latest": -1,
        "before all": BASE - 1,
        "exact": BASE + 300,
        "between": BASE + 450,
        "last": BASE + 900,
        "after all": BASE + 901,
    }
    seen: dict[str, Any] = {}
    with WireClient(target.bootstrap) as c:
        for name, ts in queries.items():
            answer = c.call(list_offsets_request(topic, {0: ts, 1: ts}), 7)
            seen[name] = sorted(
                (p.partition_index, p.error_code, p.offset, p.timestamp)
                for p in answer.topics[0].partitions
            )
        seen["max timestamp"] = sorted(
            (p.partition_index, p.error_code, p.offset, p.timestamp)
            for p in c.call(list_offsets_request(topic, {0: -3, 1: -3}), 7).topics[0].partitions
        )
        seen["unknown partition"] = [
            p.error_code
            for p in c.call(list_offsets_request(topic, {5: -1}), 7).topics[0].partitions
        ]
    return seen


def test_list_offsets_answer_alike(observe_both):
    seen = observe_both(list_offsets_scenario)
    assert seen.sidecar == seen.kafka


def fetch_edges_scenario(target: Target) -> dict[str, Any]:
    topic = target.create_topic(partitions=1)
    target.produce(topic, records(1, 5), enable_idempotence=True)
    seen: dict[str, Any] = {}
    with WireClient(target.bootstrap) as c:
        for name, offset in {"at end": 5, "past end": 6, "negative": -1, "middle": 2}.items():
            answer = c.call(fetch_request(topic, {0: offset}, max_wait_ms=200), 12)
            part = answer.responses[0].partitions[0]
            got = [r.offset for b in batches(part.records) for r in b if r.offset >= offset]
            seen[name] = (
                answer.error_code,
                answer.session_id,
                part.error_code,
                part.high_watermark,
                part.last_stable_offset,
                part.log_start_offset,
                got,
            )
        answer = c.call(fetch_request("no-such-" + topic, {0: 0}, max_wait_ms=200), 12)
        seen["unknown topic"] = answer.responses[0].partitions[0].error_code
    return seen


def test_fetch_at_past_and_before_the_end_answer_alike(observe_both):
    seen = observe_both(fetch_edges_scenario)
    assert seen.sidecar == seen.kafka


def _consume(consumer: Any, want: int, polls: int = 20) -> tuple[list[int], list[int]]:
    """(offsets read, error codes seen) over at most ``polls`` polls of 0.5 s, stopping
    once ``want`` records came."""
    offsets: list[int] = []
    codes: list[int] = []
    for _ in range(polls):
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error() is not None:
            if msg.error().code() != KafkaError._PARTITION_EOF:
                codes.append(msg.error().code())
            continue
        offsets.append(msg.offset())
        if len(offsets) >= want:
            break
    return offsets, sorted(set(codes))


def out_of_range_scenario(target: Target) -> dict[str, Any]:
    topic = target.create_topic(partitions=1)
    target.produce(topic, records(1, 5), enable_idempotence=True)
    seen: dict[str, Any] = {}
    for reset in ("earliest", "latest", "error"):
        consumer = target.consumer(auto_offset_reset=reset)
        try:
            consumer.assign([TopicPartition(topic, 0, 50)])
            read, codes = _consume(consumer, 5, polls=6)
            if reset == "latest":
                target.produce(topic, [(0, b"k", b"late")], enable_idempotence=True)
                more, more_codes = _consume(consumer, 1)
                read, codes = read + more, codes + more_codes
            seen[reset] = (read, codes)
        finally:
            consumer.close()
    return seen


def test_an_out_of_range_offset_resets_as_auto_offset_reset_says(observe_both):
    seen = observe_both(out_of_range_scenario)
    assert seen.kafka == {
        "earliest": ([0, 1, 2, 3, 4], []),
        "latest": ([5], []),
        "error": ([], [KafkaError._AUTO_OFFSET_RESET]),
    }
    assert seen.sidecar == seen.kafka


def offsets_scenario(target: Target) -> dict[str, Any]:
    topic = target.create_topic(partitions=2)
    group = target.unique("g")
    seen: dict[str, Any] = {}
    with WireClient(target.bootstrap) as c:

        def fetched(version: int = 7, topic_name: str | None = topic) -> Any:
            answer = c.call(offset_fetch_request(group, topic_name, [0, 1]), version)
            return (
                getattr(answer, "error_code", 0),
                sorted(
                    (p.partition_index, p.committed_offset, p.metadata, p.error_code)
                    for t in answer.topics
                    for p in t.partitions
                ),
            )

        seen["nothing committed"] = fetched()
        seen["nothing committed, all topics"] = fetched(topic_name=None)
        commit = c.call(offset_commit_request(group, topic, {0: 3, 1: 0}, metadata="m"), 8)
        seen["commit"] = [p.error_code for t in commit.topics for p in t.partitions]
        seen["committed v1"] = fetched(1)
        seen["committed v7"] = fetched(7)
        seen["committed, all topics"] = fetched(topic_name=None)
        bad = c.call(offset_commit_request(group, topic, {7: 1}), 8)
        seen["unknown partition"] = [p.error_code for t in bad.topics for p in t.partitions]
        big = c.call(offset_commit_request(group, topic, {0: 9}, metadata="x" * 5000), 8)
        seen["metadata too large"] = [p.error_code for t in big.topics for p in t.partitions]
        ghost = c.call(
            offset_commit_request(group + "-x", topic, {0: 1}, generation=2, member="m"), 8
        )
        seen["generation of no group"] = [p.error_code for t in ghost.topics for p in t.partitions]
        seen["after refusals"] = fetched()
    return seen


def test_offset_commit_and_fetch_answer_alike(observe_both):
    seen = observe_both(offsets_scenario)
    assert seen.sidecar == seen.kafka


def read_both_levels_scenario(target: Target) -> dict[str, Any]:
    topic = target.create_topic(partitions=2)
    target.produce(topic, records(2, 30), enable_idempotence=True, linger_ms=5)
    return {
        level: keys_values(target.read(topic, 2, isolation=level))
        for level in ("read_committed", "read_uncommitted")
    }


def test_an_idempotent_producers_records_read_alike_at_both_isolation_levels(observe_both):
    seen = observe_both(read_both_levels_scenario)
    assert seen.sidecar["read_committed"] == seen.sidecar["read_uncommitted"]
    assert seen.sidecar == seen.kafka
