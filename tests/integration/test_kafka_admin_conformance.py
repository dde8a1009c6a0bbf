"""Kafka itself as the oracle for the admin APIs: the same requests, sent with a bare
wire client to the reference Kafka 4.1 broker and to the sidecar, get the same answers
(codes, values and sources where they mean the same on both; node ids, cluster ids and
producer ids are each side's own and are not compared)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.protocol.admin import DescribeGroupsRequest

from tests.integration.kafka_consume import fetch_request
from tests.kafka_admin_wire import (
    APPEND,
    BROKER,
    DELETE,
    SET,
    SUBTRACT,
    alter,
    configs_of,
    create_partitions,
    create_topic,
    delete_records,
    describe_cluster,
    describe_configs,
    describe_producers,
    describe_transactions,
    epoch_end,
    incremental,
    list_groups,
    list_offset,
    list_transactions,
)
from tests.kafka_conformance import Target
from tests.kafka_group_wire import NOT_READY, commit, member, sync
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _same(conformance: tuple[Target, Target], scenario: Any) -> None:
    kafka, sidecar = conformance
    assert scenario(kafka) == scenario(sidecar)


def _produce(target: Target, topic: str, n: int, partition: int = 0, **conf: Any) -> None:
    target.produce(topic, [(partition, None, f"v{i}".encode()) for i in range(n)], **conf)


# -- groups ---------------------------------------------------------------------------------


def test_list_groups_compares_filters_case_insensitively_and_lists_simple_groups(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.create_topic(partitions=1)
        stable, simple = target.unique("g"), target.unique("g")
        names = {stable: "stable", simple: "simple"}
        with WireClient(target.bootstrap) as c:
            me = member(c, stable)
            assert sync(c, stable, me.member_id, me.generation_id) == 0
            deadline = time.monotonic() + 30
            while (code := commit(c, simple, topic, "", -1)) in NOT_READY:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert code == 0

            def listed(states: list[str], types: list[str]) -> tuple[int, list[Any]]:
                answer = list_groups(c, states, types)
                mine = [
                    (names[g.group_id], g.group_state, g.protocol_type, g.group_type)
                    for g in answer.groups
                    if g.group_id in names
                ]
                return answer.error_code, sorted(mine)

            seen: list[Any] = [
                listed([], []),
                listed([], ["Classic", "Consumer"]),  # what kafka-consumer-groups --list sends
                listed([], ["classic"]),
                listed([], ["consumer"]),
                listed(["stable"], []),
                listed(["EMPTY"], ["CLASSIC"]),
                listed([], ["bogus"]),
            ]
            described = c.call(
                DescribeGroupsRequest(groups=[simple], include_authorized_operations=False), 5
            ).groups[0]
            seen.append((described.error_code, described.group_state, described.protocol_type))
        return seen

    _same(conformance, scenario)


# -- configs --------------------------------------------------------------------------------

_WATCHED = ["retention.ms", "retention.bytes", "cleanup.policy", "max.compaction.lag.ms"]


def test_create_topics_stores_and_answers_its_configs(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.unique("cfg")
        configs = {"retention.ms": "3600000", "cleanup.policy": "compact"}
        with WireClient(target.bootstrap) as c:
            created = create_topic(c, topic, 2, configs)
            answered = {cf.name: (cf.value, cf.config_source) for cf in created.configs}
            bad = [
                create_topic(c, target.unique("cfg"), 1, {"foo.bar": "1"}).error_code,
                create_topic(c, target.unique("cfg"), 1, {"retention.ms": "abc"}).error_code,
                create_topic(c, target.unique("cfg"), 1, {"cleanup.policy": "x"}).error_code,
                create_topic(c, target.unique("cfg"), 1, configs, validate_only=True).error_code,
                create_topic(c, topic, 1, configs).error_code,
            ]
            described = configs_of(describe_configs(c, topic, _WATCHED))
            old = create_topic(c, target.unique("cfg"), 1, configs, version=4)
        return [
            created.error_code,
            created.num_partitions,
            {k: answered[k] for k in _WATCHED},
            len(answered) >= 30,  # every topic config, as Kafka answers from v5
            bad,
            described,
            (old.error_code, len(old.configs)),
        ]

    _same(conformance, scenario)


def test_describe_configs_of_missing_topics_and_other_brokers(conformance):
    def scenario(target: Target) -> list[int]:
        with WireClient(target.bootstrap) as c:
            return [
                describe_configs(c, target.unique("nope"), wait=False).error_code,
                describe_configs(c, "7", rtype=BROKER).error_code,
                describe_configs(c, "", rtype=BROKER).error_code,
                describe_configs(c, "x", rtype=99).error_code,
            ]

    _same(conformance, scenario)


def test_incremental_and_legacy_alter_configs(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.create_topic(partitions=1)
        seen: list[Any] = []
        with WireClient(target.bootstrap) as c:
            seen.append(
                [
                    incremental(c, topic, [("retention.ms", SET, "120000")]),
                    incremental(c, topic, [("foo.bar", SET, "1")]),
                    incremental(c, topic, [("retention.ms", SET, "abc")]),
                    incremental(c, topic, [("retention.ms", SET, "-5")]),
                    incremental(c, topic, [("cleanup.policy", SET, "foo")]),
                    incremental(c, topic, [("retention.ms", APPEND, "5")]),
                    incremental(c, topic, [("retention.ms", SET, "1"), ("retention.ms", SET, "2")]),
                    incremental(c, target.unique("nope"), [("retention.ms", SET, "1")]),
                    incremental(c, topic, [("retention.ms", SET, "777")], validate_only=True),
                ]
            )
            seen.append(configs_of(describe_configs(c, topic, _WATCHED)))
            seen.append(incremental(c, topic, [("cleanup.policy", APPEND, "compact")]))
            seen.append(configs_of(describe_configs(c, topic, ["cleanup.policy"])))
            seen.append(incremental(c, topic, [("cleanup.policy", SUBTRACT, "delete")]))
            seen.append(configs_of(describe_configs(c, topic, ["cleanup.policy"])))
            seen.append(incremental(c, topic, [("retention.ms", DELETE, None)]))
            seen.append(configs_of(describe_configs(c, topic, _WATCHED)))
            # the whole set; above Pulsar's default backlog quota (10 GB), which a retention
            # size must exceed
            seen.append(alter(c, topic, {"retention.bytes": str(20 << 30)}))
            seen.append(configs_of(describe_configs(c, topic, _WATCHED)))
        return seen

    _same(conformance, scenario)


# -- partitions and records -------------------------------------------------------------------


def test_create_partitions_grows_topics_as_kafka_answers(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.create_topic(partitions=1)
        with WireClient(target.bootstrap) as c:
            codes = [
                create_partitions(c, [topic], 3, validate_only=True),
                create_partitions(c, [topic], 3),
                create_partitions(c, [topic], 3),
                create_partitions(c, [topic], 2),
                create_partitions(c, [target.unique("nope")], 3),
                create_partitions(c, [topic, topic], 5),
            ]
        deadline = time.monotonic() + 30
        while True:  # Kafka's metadata follows its controller a moment later
            meta = target.admin().list_topics(topic, timeout=30).topics[topic]
            if len(meta.partitions) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        _produce(target, topic, 1, partition=2)
        return [codes, len(meta.partitions), target.end_offsets(topic, 3)]

    _same(conformance, scenario)


def _fetch_code(c: WireClient, topic: str, offset: int) -> tuple[int, int]:
    """(code, log start offset) of a Fetch of partition 0 at ``offset``."""
    request = fetch_request(
        topic, {0: offset}, max_wait_ms=100, max_bytes=1 << 20, isolation_level=1
    )
    p = c.call(request, 11).responses[0].partitions[0]
    return p.error_code, p.log_start_offset


def test_delete_records_moves_the_log_start_that_list_offsets_and_fetch_honour(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.create_topic(partitions=2)
        _produce(target, topic, 10)
        with WireClient(target.bootstrap) as c:
            seen: list[Any] = [
                delete_records(c, topic, [(0, 4), (1, 0)]),
                delete_records(c, topic, [(0, 2)]),  # below the log start: answers it
                delete_records(c, topic, [(0, 50)]),
                delete_records(c, topic, [(5, 1)]),
                delete_records(c, target.unique("nope"), [(0, 1)]),
                list_offset(c, topic, 0, -2, 7),
                list_offset(c, topic, 0, -4, 8),
                _fetch_code(c, topic, 2),
                _fetch_code(c, topic, 4),
            ]
        seen.append([r.value for r in target.read(topic, 1)[0]])  # from the beginning
        with WireClient(target.bootstrap) as c:
            seen.append(delete_records(c, topic, [(0, -1)]))
            seen.append(list_offset(c, topic, 0, -2, 7))
        return seen

    _same(conformance, scenario)


def test_list_offsets_v8_to_v10_and_offset_for_leader_epoch(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.create_topic(partitions=1)
        _produce(target, topic, 3)
        with WireClient(target.bootstrap) as c:
            offsets = [
                list_offset(c, topic, 0, ts, v) for v in (8, 9, 10) for ts in (-1, -2, -4, -5, -6)
            ]
            epochs = [
                epoch_end(c, topic, 0, -1, 0),
                epoch_end(c, topic, 0, 0, 0),
                epoch_end(c, topic, 0, -1, 5),
                epoch_end(c, topic, 0, 3, 0),
                epoch_end(c, topic, 0, -1, -1),
                epoch_end(c, topic, 4, -1, 0)[0],
                epoch_end(c, target.unique("nope"), 0, -1, 0)[0],
            ]
        return [offsets, epochs]

    _same(conformance, scenario)


# -- cluster -----------------------------------------------------------------------------------


def test_describe_cluster_lists_the_metadata_brokers(conformance):
    def scenario(target: Target) -> list[Any]:
        host, port = target.bootstrap.rsplit(":", 1)
        seen: list[Any] = []
        with WireClient(target.bootstrap) as c:
            for version in (0, 1, 2):
                answer = describe_cluster(c, version, operations=version == 2)
                brokers = [(b.host, b.port) for b in answer.brokers]
                seen.append(
                    (
                        answer.error_code,
                        brokers == [(host, int(port))],
                        answer.controller_id in {b.broker_id for b in answer.brokers},
                        bool(answer.cluster_id),
                        answer.authorized_operations,
                    )
                )
            seen.append(describe_cluster(c, 1, endpoint=2).error_code)
        return seen

    _same(conformance, scenario)


# -- transactions and producers --------------------------------------------------------------


def test_list_and_describe_transactions(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.create_topic(partitions=2)
        tid = target.unique("tx")
        producer = target.producer(transactional_id=tid, transaction_timeout_ms=45000)
        producer.init_transactions(target.timeout)
        producer.begin_transaction()
        target.produce(topic, [(1, None, b"x"), (0, None, b"y")], producer=producer)
        seen: list[Any] = []
        with WireClient(target.bootstrap) as c:

            def mine(answer: Any) -> tuple[Any, ...]:
                listed = [
                    t.transaction_state
                    for t in answer.transaction_states
                    if t.transactional_id == tid
                ]
                return answer.error_code, list(answer.unknown_state_filters), listed

            seen.extend(mine(list_transactions(c, version)) for version in (0, 1, 2))
            seen.append(mine(list_transactions(c, 1, states=["ongoing", "Bogus"])))
            seen.append(mine(list_transactions(c, 1, states=["Ongoing"])))
            seen.append(mine(list_transactions(c, 1, duration=3_600_000)))
            seen.append(mine(list_transactions(c, 2, pattern=tid[:3] + ".*")))
            seen.append(mine(list_transactions(c, 2, pattern=tid[:3])))
            d, nope = describe_transactions(c, [tid, target.unique("nope")])
            seen.append(
                (
                    d.error_code,
                    d.transaction_state,
                    d.transaction_timeout_ms,
                    d.transaction_start_time_ms > 0,
                    d.producer_epoch,
                    sorted((t.topic == topic, sorted(t.partitions)) for t in d.topics),
                    nope.error_code,
                )
            )
            pid = d.producer_id
            seen.append(mine(list_transactions(c, 0, producer_ids=[pid])))
            producer.commit_transaction(target.timeout)
            deadline = time.monotonic() + 30
            while (d := describe_transactions(c, [tid])[0]).transaction_state != "CompleteCommit":
                assert time.monotonic() < deadline, d
                time.sleep(0.1)
            seen.append((d.transaction_state, [t.topic for t in d.topics]))
        return seen

    _same(conformance, scenario)


def test_describe_producers_of_an_idempotent_producer(conformance):
    def scenario(target: Target) -> list[Any]:
        topic = target.create_topic(partitions=1)
        _produce(target, topic, 3)  # without idempotence: no producer state
        producer = Producer(target.config(**{"enable.idempotence": True}))
        target.produce(topic, [(0, None, b"a"), (0, None, b"b")], producer=producer)
        with WireClient(target.bootstrap) as c:
            part, out_of_range = describe_producers(c, topic, [0, 3])
            (missing,) = describe_producers(c, target.unique("nope"), [0])
        return [
            part.error_code,
            sorted(
                (p.producer_epoch, p.last_sequence, p.current_txn_start_offset)
                for p in part.active_producers
            ),
            out_of_range.error_code,
            missing.error_code,
        ]

    _same(conformance, scenario)
