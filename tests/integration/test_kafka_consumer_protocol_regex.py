"""KIP-848 subscriptions by regular expression (ConsumerGroupHeartbeat v1's
SubscribedTopicRegex), the same scenario against the reference Kafka broker and the
listener, the answers compared: topics ``a1`` (2 partitions), ``a2`` and ``b1``; a member
subscribing ``<prefix>-a.*`` gets a1 and a2 whole; a topic ``a3`` created later joins its
assignment within the refresh (Kafka's 10 s, then a heartbeat); an expression that does
not compile is INVALID_REGULAR_EXPRESSION (128); ConsumerGroupDescribe shows the
expression. Heartbeats by hand first, then librdkafka (confluent-kafka 2.16, a
``^``-prefixed topic with ``group.protocol=consumer``) and Kafka's Java consumer
(``subscribe(SubscriptionPattern)``, ``tests/java/PatternConsumer.java``) as judges."""

from __future__ import annotations

import queue
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from kop_dedup.transports.kafka.schemas import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
)
from kop_dedup_tools import kafka_jars
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration]

_HB = ConsumerGroupHeartbeatRequest


def _create(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(t, n, 1) for t, n in topics.items()]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)


def _beat(c: WireClient, group: str, mid: str, epoch: int, **kw: Any) -> Any:
    return c.call(
        _HB(
            group_id=group,
            member_id=mid,
            member_epoch=epoch,
            instance_id=None,
            rack_id=None,
            rebalance_timeout_ms=30_000 if epoch == 0 else -1,
            subscribed_topic_names=kw.get("topics"),
            subscribed_topic_regex=kw.get("regex"),
            server_assignor=None,
            topic_partitions=kw.get("owned"),
        ),
        1,
    )


def _names(c: WireClient, topics: list[str]) -> dict[Any, str]:
    t = MetadataRequest.MetadataRequestTopic
    asked = [t(name=n, topic_id=None) for n in topics]
    meta = c.call(MetadataRequest(topics=asked, allow_auto_topic_creation=False), 12)
    return {m.topic_id: m.name for m in meta.topics}


def _ready(c: WireClient, group: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if c.call(FindCoordinatorRequest(key=group, key_type=0), 2).error_code == 0:
            answer = c.call(
                ConsumerGroupDescribeRequest(
                    group_ids=[group], include_authorized_operations=False
                ),
                1,
            ).groups[0]
            if answer.error_code not in (14, 15, 16):
                return
        time.sleep(0.3)
    raise AssertionError(f"no coordinator for {group}")


def _assigned(answer: Any, names: dict[Any, str]) -> set[tuple[str, int]]:
    return {
        (names.get(tp.topic_id, "?"), p)
        for tp in answer.assignment.topic_partitions
        for p in tp.partitions
    }


def wire_scenario(bootstrap: str) -> dict[str, Any]:
    """By hand: the join with a regex, the assignment it comes to, a bad regex."""
    prefix = f"rxw{uuid.uuid4().hex[:8]}"
    topics = {f"{prefix}-a1": 2, f"{prefix}-a2": 1, f"{prefix}-b1": 1}
    _create(bootstrap, topics)
    group, mid = f"{prefix}-g", str(uuid.uuid4())[:22]
    out: dict[str, Any] = {}
    with WireClient(bootstrap) as c:
        _ready(c, group)
        names = _names(c, list(topics))
        bad = _beat(c, f"{group}-bad", mid, 0, regex="a(", topics=[], owned=[])
        out["bad"] = (bad.error_code, bad.member_epoch)
        joined = _beat(c, group, mid, 0, regex=f"{prefix}-a.*", topics=[], owned=[])
        out["join"] = (joined.error_code, joined.member_epoch > 0)
        epoch, held = joined.member_epoch, _assigned(joined, names)
        deadline = time.monotonic() + 60  # Kafka resolves a new regex asynchronously
        while len(held) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            owned = [
                _HB.TopicPartitions(topic_id=tid, partitions=[p for t, p in held if t == n])
                for tid, n in names.items()
                if any(t == n for t, _ in held)
            ]
            answer = _beat(c, group, mid, epoch, owned=owned)
            assert answer.error_code == 0, answer
            epoch = answer.member_epoch
            if answer.assignment is not None:
                held = _assigned(answer, names)
        out["assigned"] = sorted(held)
        described = c.call(
            ConsumerGroupDescribeRequest(group_ids=[group], include_authorized_operations=False), 1
        ).groups[0]
        out["described"] = [
            (m.subscribed_topic_regex or "").removeprefix(prefix) for m in described.members
        ]
        out["leave"] = _beat(c, group, mid, -1).error_code
    out["assigned"] = [(t.removeprefix(prefix), p) for t, p in out["assigned"]]
    return out


def test_heartbeat_with_a_regex_answers_as_kafka(sidecar_kafka: str, kafka_reference: Any) -> None:
    ours, theirs = wire_scenario(sidecar_kafka), wire_scenario(kafka_reference.bootstrap)
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    assert theirs["bad"][0] == 128
    assert theirs["assigned"] == [("-a1", 0), ("-a1", 1), ("-a2", 0)]
    assert ours["bad"] == theirs["bad"]
    assert ours["join"] == theirs["join"]
    assert ours["assigned"] == theirs["assigned"]
    assert ours["described"] == theirs["described"] == ["-a.*"]
    assert ours["leave"] == theirs["leave"] == 0


def client_scenario(bootstrap: str) -> dict[str, Any]:
    """librdkafka subscribing ``^<prefix>-a.*``: a1 and a2, then a3 once created."""
    prefix = f"rxc{uuid.uuid4().hex[:8]}"
    _create(bootstrap, {f"{prefix}-a1": 2, f"{prefix}-a2": 1, f"{prefix}-b1": 1})
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{prefix}-g",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )

    def held() -> list[tuple[str, int]]:
        return sorted((tp.topic.removeprefix(prefix), tp.partition) for tp in consumer.assignment())

    def until(want: int, timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            consumer.poll(0.2)
            if len(held()) >= want:
                break
        return time.monotonic() - started

    try:
        consumer.subscribe([f"^{prefix}-a.*"])
        first_s = until(3, 90)
        first = held()
        _create(bootstrap, {f"{prefix}-a3": 1})
        later_s = until(4, 90)
        later = held()
    finally:
        consumer.close()
    return {"first": first, "later": later, "first_s": first_s, "later_s": later_s}


def test_confluent_kafka_regex_subscription_gets_topics_created_later_as_on_kafka(
    sidecar_kafka: str, kafka_reference: Any
) -> None:
    ours, theirs = client_scenario(sidecar_kafka), client_scenario(kafka_reference.bootstrap)
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    assert theirs["first"] == [("-a1", 0), ("-a1", 1), ("-a2", 0)]
    assert theirs["later"] == [*theirs["first"], ("-a3", 0)]
    assert (ours["first"], ours["later"]) == (theirs["first"], theirs["later"])


_PATTERN_CONSUMER = Path(__file__).parent.parent / "java" / "PatternConsumer.java"


def java_scenario(bootstrap: str) -> dict[str, Any]:
    """Kafka's Java consumer, ``subscribe(SubscriptionPattern)``: a1 and a2, then a3."""
    prefix = f"rxj{uuid.uuid4().hex[:8]}"
    _create(bootstrap, {f"{prefix}-a1": 2, f"{prefix}-a2": 1, f"{prefix}-b1": 1})
    args = [bootstrap, f"{prefix}-g", f"{prefix}-a.*", "150"]
    java = kafka_jars.java_tool("java")
    logs = f"-Dlog4j2.configurationFile={kafka_jars.tools_log_config()}"
    err = tempfile.TemporaryFile()  # noqa: SIM115 - read at the end, closed with the process
    proc = subprocess.Popen(
        [java, logs, "-cp", kafka_jars.classpath(), str(_PATTERN_CONSUMER), *args],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True)
    reader.start()

    def until(want: int, timeout: float) -> tuple[list[tuple[str, int]], float]:
        started, held = time.monotonic(), []
        while len(held) < want and time.monotonic() - started < timeout:
            try:
                line = lines.get(timeout=1).rstrip("\n")
            except queue.Empty:
                continue
            tps = [x.rsplit(":", 1) for x in line.removeprefix("assigned ").split(",") if x]
            held = sorted((t.removeprefix(prefix), int(p)) for t, p in tps)
        return held, time.monotonic() - started

    try:
        first, first_s = until(3, 120)
        _create(bootstrap, {f"{prefix}-a3": 1})
        later, later_s = until(4, 90)
    finally:
        proc.terminate()
        proc.wait(30)
        reader.join(timeout=30)  # at the end of its output once the process is gone
        if proc.stdout is not None:
            proc.stdout.close()
        err.seek(0)
        errors = err.read().decode(errors="replace").splitlines()[-20:]
        err.close()
    return {
        "first": first,
        "later": later,
        "first_s": first_s,
        "later_s": later_s,
        "stderr": errors,
    }


def test_java_consumer_subscription_pattern_gets_topics_created_later_as_on_kafka(
    sidecar_kafka: str, kafka_reference: Any
) -> None:
    ours, theirs = java_scenario(sidecar_kafka), java_scenario(kafka_reference.bootstrap)
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    assert theirs["first"] == [("-a1", 0), ("-a1", 1), ("-a2", 0)]
    assert theirs["later"] == [*theirs["first"], ("-a3", 0)]
    assert (ours["first"], ours["later"]) == (theirs["first"], theirs["later"])
