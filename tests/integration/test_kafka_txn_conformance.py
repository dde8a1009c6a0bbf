"""Kafka itself as the oracle for the transactional flow: the error codes each API
answers (at the versions librdkafka, aiokafka and the Java client send) and what a
read_committed consumer sees, the same scenario against the reference broker and the
sidecar's Kafka listener (bare requests: ``tests/kafka_txn_wire.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kop_dedup.protocol.records import rec
from tests.kafka_conformance import Target, keys_values
from tests.kafka_txn_wire import TxnWire

pytestmark = pytest.mark.kafka


def _named(codes: dict[tuple[str, int], int], names: dict[str, str]) -> dict[str, int]:
    """Per-partition codes keyed by a name that is the same on both targets."""
    return {f"{names[t]}-{p}": c for (t, p), c in sorted(codes.items())}


def fencing(target: Target) -> dict[str, Any]:
    """A second instance initialises the id while the first has a transaction open:
    every call of the first is fenced, at each version, and its records never show."""
    topic = target.create_topic(partitions=2)
    tid = target.unique("tx")
    seen: dict[str, Any] = {}
    with TxnWire(target.bootstrap, tid) as old, TxnWire(target.bootstrap, tid) as new:
        seen["init"] = old.init()
        seen["add"] = old.add_partitions_retried({topic: [0, 1]})
        seen["produce"] = old.produce(topic, 0, [rec(b"zombie")])
        seen["second init, first answer"] = new.init_once().error_code
        seen["second init"] = new.init()
        seen["epoch moved by"] = new.epoch - old.epoch
        seen["same producer id"] = new.pid == old.pid
        seen["fenced produce v9"] = old.produce(topic, 0, [rec(b"late")], 9)
        seen["fenced produce v11"] = old.produce(topic, 1, [rec(b"late")], 11)
        seen["fenced add v0"] = old.add_partitions({topic: [1]}, 0)[topic, 1]
        seen["fenced add v3"] = old.add_partitions({topic: [1]}, 3)[topic, 1]
        seen["fenced add offsets v0"] = old.add_offsets("g", 0)
        seen["fenced add offsets v3"] = old.add_offsets("g", 3)
        old.find_coordinator(0, "g")
        seen["fenced txn offset commit v3"] = list(
            old.commit_offsets("g", {(topic, 0): 1}).values()
        )
        seen["fenced end v1"] = old.end_once(True, 1)
        seen["fenced end v3"] = old.end_once(False, 3)
        seen["fenced init v3 (KIP-360)"] = old.init_once(3, current=(old.pid, old.epoch)).error_code
        seen["fenced init v4 (KIP-360)"] = old.init_once(4, current=(old.pid, old.epoch)).error_code
    seen["read_committed"] = keys_values(target.read(topic, 2))
    return seen


def ending(target: Target) -> dict[str, Any]:
    """EndTxn with nothing open, a commit, the same commit again, an abort after it."""
    topic = target.create_topic(partitions=1)
    seen: dict[str, Any] = {}
    with TxnWire(target.bootstrap, target.unique("tx")) as t:
        seen["init"] = t.init()
        seen["commit with nothing open v1"] = t.end_once(True, 1)
        seen["abort with nothing open v3"] = t.end_once(False, 3)
        seen["add"] = t.add_partitions_retried({topic: [0]})
        seen["produce"] = t.produce(topic, 0, [rec(b"c", key=b"k")])
        seen["commit"] = t.end(True)
        seen["commit again"] = t.end(True)
        seen["abort after the commit"] = t.end_once(False)
    seen["read_committed"] = keys_values(target.read(topic, 1))
    return seen


def adding(target: Target) -> dict[str, Any]:
    """AddPartitionsToTxn naming a topic that does not exist, or a partition past the
    last: nothing is added (the others: 55 OPERATION_NOT_ATTEMPTED)."""
    topic = target.create_topic(partitions=2)
    missing = target.unique("missing")
    names = {topic: "topic", missing: "missing"}
    seen: dict[str, Any] = {}
    with TxnWire(target.bootstrap, target.unique("tx")) as t:
        seen["init"] = t.init()
        seen["unknown topic v3"] = _named(t.add_partitions({topic: [0, 1], missing: [0]}, 3), names)
        seen["unknown partition v0"] = _named(t.add_partitions({topic: [0, 7]}, 0), names)
        seen["end, nothing added"] = t.end_once(True)
    return seen


def verifying(target: Target) -> dict[str, Any]:
    """Transactional batches for a partition not added, with an epoch never handed out,
    and for a transactional id nobody initialised; then the commit of what was added."""
    topic = target.create_topic(partitions=3)
    seen: dict[str, Any] = {}
    with TxnWire(target.bootstrap, target.unique("tx")) as t:
        seen["init"] = t.init()
        seen["add"] = t.add_partitions_retried({topic: [0]})
        seen["added"] = t.produce(topic, 0, [rec(b"in", key=b"k")])
        seen["not added v9"] = t.produce(topic, 1, [rec(b"out")], 9)
        seen["not added v11"] = t.produce(topic, 2, [rec(b"out")], 11)
        seen["epoch from the future"] = t.produce(topic, 0, [rec(b"out")], epoch=t.epoch + 3)
        seen["commit"] = t.end(True)
    with TxnWire(target.bootstrap, target.unique("nobody")) as u:
        u.pid, u.epoch = 4242, 0
        seen["unknown transactional id"] = u.produce(topic, 0, [rec(b"out")])
    seen["read_committed"] = keys_values(target.read(topic, 3))
    return seen


def offsets(target: Target) -> dict[str, Any]:
    """sendOffsetsToTransaction by hand: AddOffsetsToTxn, TxnOffsetCommit (v3 without
    group metadata, v0; a topic that does not exist; a member of no group), then commit
    or abort: what the group has committed after."""
    topic = target.create_topic(partitions=2)
    missing = target.unique("missing")
    names = {topic: "topic", missing: "missing"}
    group = target.unique("g")
    seen: dict[str, Any] = {}
    with TxnWire(target.bootstrap, target.unique("tx")) as t:
        seen["init"] = t.init()
        seen["add offsets"] = t.add_offsets(group)
        seen["find group coordinator"] = t.find_coordinator(0, group)
        staged = {(topic, 0): 5, (topic, 1): 6, (missing, 0): 1}
        seen["txn offset commit v3"] = _named(t.commit_offsets(group, staged), names)
        seen["member of no group"] = _named(
            t.commit_offsets(group, {(topic, 1): 9}, member="m-1", generation=3), names
        )
        seen["commit"] = t.end(True)
        seen["add offsets again"] = t.add_offsets(group)
        seen["txn offset commit v0"] = _named(t.commit_offsets(group, {(topic, 0): 50}, 0), names)
        seen["abort"] = t.end(False)
    consumer = target.consumer(group_id=group)
    try:
        parts = [TopicPartition(topic, p) for p in range(2)]
        committed = consumer.committed(parts, timeout=target.timeout)
    finally:
        consumer.close()
    seen["committed"] = {tp.partition: tp.offset for tp in committed}
    return seen


def test_a_second_instance_fences_the_first_alike(observe_both):
    seen = observe_both(fencing)
    assert seen.kafka == seen.sidecar


def test_ending_a_transaction_answers_alike(observe_both):
    seen = observe_both(ending)
    assert seen.kafka == seen.sidecar


def test_adding_partitions_that_do_not_exist_answers_alike(observe_both):
    seen = observe_both(adding)
    assert seen.kafka == seen.sidecar


def test_offsets_sent_to_a_transaction_answer_and_commit_alike(observe_both):
    seen = observe_both(offsets)
    assert seen.kafka == seen.sidecar


def test_batches_outside_the_transaction_are_refused_alike(observe_both):
    seen = observe_both(verifying)
    assert seen.kafka == seen.sidecar
