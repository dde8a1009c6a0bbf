"""Server-side resets (RIP-48) of Kafka groups, asked over HTTP while the members run:
the reset becomes the group's committed offsets and forces a rebalance that fences the
generation it interrupts (22), so a running confluent-kafka consumer re-reads from the
target without a restart, and a commit of a pre-reset position is refused."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaException
from kafka.protocol.consumer import HeartbeatRequest, LeaveGroupRequest, SyncGroupRequest

from tests.integration.kafka_consume import (
    create,
    offset_commit_request,
    offset_fetch_request,
    produce,
)
from tests.integration.kafka_members import wait_until
from tests.kafka_group_wire import join
from tests.kafka_group_wire import member as new_member
from tests.kafka_txn_wire import TxnWire
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

RECORDS = 100


class Reader:
    """One confluent-kafka group member on a thread, never restarted: ``seen`` holds each
    record's offset (partition 0) in the order read; it commits after each batch while
    ``committing`` is set, and pauses once it has read up to ``hold_at`` (until its next
    assignment, when the rebalance a reset forces gives it one)."""

    def __init__(self, bootstrap: str, topic: str, group: str, assignor: str) -> None:
        self.seen: list[int] = []
        self.assignments = 0
        self.errors: list[BaseException] = []
        self.committing = threading.Event()
        self.committing.set()
        self.hold_at: int | None = None
        self._stop = threading.Event()
        self._reassigned = False
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 3000,
                "heartbeat.interval.ms": 200,
                "partition.assignment.strategy": assignor,
            }
        )
        self._consumer.subscribe([topic], on_assign=self._assigned)
        self._thread = threading.Thread(target=self._run, daemon=True, name="reset-reader")
        self._thread.start()

    def _assigned(self, consumer: Consumer, partitions: list[Any]) -> None:
        self.assignments += 1
        self._reassigned = True  # a held reader reads again in its new assignment

    def _run(self) -> None:
        c = self._consumer
        try:
            while not self._stop.is_set():
                if self._reassigned:
                    self._reassigned = False
                    c.resume(c.assignment())
                hold = self.hold_at
                msgs = c.consume(1 if hold is not None else 100, 0.1)
                got = [m.offset() for m in msgs if m.error() is None]
                self.seen.extend(got)
                if got and self.committing.is_set():
                    try:
                        c.commit(asynchronous=False)
                    except KafkaException as exc:  # a commit racing a rebalance: retried
                        self.errors.append(exc)
                if got and hold is not None and got[-1] + 1 >= hold:
                    c.pause(c.assignment())
        finally:
            c.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def _reset(http: httpx.Client, group: str, topic: str, to: str, value: int | None = None) -> Any:
    body: dict[str, Any] = {"topic": topic, "to": to}
    if value is not None:
        body["value"] = value
    answer = http.post(f"/v1/groups/{group}/reset", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _lag(http: httpx.Client, group: str) -> tuple[int | None, int | None]:
    answer = http.get(f"/v1/groups/{group}/lag")
    assert answer.status_code == 200, answer.text
    rows = answer.json()["partitions"]  # none before the first commit
    return (rows[0]["committed"], rows[0]["lag"]) if rows else (None, None)


def _sync(c: WireClient, group: str, member: str, generation: int) -> int:
    mine = SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=b"mine")
    sync = SyncGroupRequest(
        group_id=group,
        generation_id=generation,
        member_id=member,
        group_instance_id=None,
        assignments=[mine],
    )
    return int(c.call(sync, 3).error_code)


def _fetched(c: WireClient, group: str, topic: str) -> int:
    answer = c.call(offset_fetch_request(group, topic, [0]), 5)
    return int(answer.topics[0].partitions[0].committed_offset)


@pytest.mark.parametrize(
    "assignor",
    [
        "range,roundrobin",  # librdkafka's default: eager, every partition revoked
        "cooperative-sticky",  # keeps its partitions across a rebalance: 22 makes it drop them
    ],
)
def test_a_reset_over_http_rewinds_and_skips_a_running_kafka_consumer(
    kg: ThreadSidecar, assignor: str
):
    bootstrap = kg.kafka_bootstrap
    topic = create(bootstrap, 1, "krr")
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [(0, None, f"r-{i}".encode()) for i in range(RECORDS)])
    reader = Reader(bootstrap, topic, group, assignor)
    with httpx.Client(base_url=kg.url, timeout=60) as http:
        try:
            wait_until(lambda: len(reader.seen) >= RECORDS, what="the first read")
            wait_until(lambda: _lag(http, group) == (RECORDS, 0), what="all committed")
            assert reader.seen == list(range(RECORDS))

            # backward: to the earliest, while it polls; it re-reads from 0 (and holds at 30)
            reader.committing.clear()
            reader.hold_at = 30
            mark, assigned = len(reader.seen), reader.assignments
            (row,) = _reset(http, group, topic, "earliest")["resolved"]
            wait_until(lambda: len(reader.seen) >= mark + 30, what="the re-read after the reset")
            assert reader.seen[mark:] == list(range(30))
            assert reader.assignments > assigned  # a rebalance, not a restart
            assert _lag(http, group) == (0, RECORDS)  # the committed offsets are the reset
            assert (row["offset"], row["appliedAt"]) == (0, "rebalance")
            assert row["fencedBelowGeneration"] >= 2
            statuses = http.get(f"/v1/groups/{group}/reset").json()["resets"]
            assert {s for r in statuses for s in r["members"].values()} == {"applied"}

            # forward: to offset 70, ahead of where it holds; it skips 30..69
            mark = len(reader.seen)
            reader.hold_at = None
            (row,) = _reset(http, group, topic, "offset", 70)["resolved"]
            wait_until(lambda: len(reader.seen) >= mark + 30, what="the read after 70")
            assert reader.seen[mark:] == list(range(70, RECORDS))
            assert _lag(http, group) == (70, RECORDS - 70)
            assert (row["offset"], row["appliedAt"]) == (70, "rebalance")

            # it commits again at the generation the rebalance gave it
            reader.committing.set()
            produce(bootstrap, topic, [(0, None, b"last")])
            wait_until(lambda: _lag(http, group) == (RECORDS + 1, 0), what="a commit after")
            assert reader.alive
        finally:
            reader.stop()


def test_a_commit_at_the_generation_a_reset_fenced_is_refused_and_keeps_the_reset(
    kg: ThreadSidecar,
):
    """The reset and a member's stale position meet: the member committed 100 at its
    generation, the reset lands, the same member commits its old position again (as a
    consumer does while it has not heard of the rebalance): 22, and the reset stays."""
    bootstrap = kg.kafka_bootstrap
    topic = create(bootstrap, 1, "krf")
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [(0, None, f"f-{i}".encode()) for i in range(RECORDS)])
    with httpx.Client(base_url=kg.url, timeout=60) as http, WireClient(bootstrap) as c:
        joined = new_member(c, group, session_ms=30_000, retry=False)
        member, generation = joined.member_id, joined.generation_id
        assert _sync(c, group, member, generation) == 0
        commit = offset_commit_request(
            group, topic, {0: RECORDS}, generation=generation, member=member
        )
        assert c.call(commit, 8).topics[0].partitions[0].error_code == 0

        (row,) = _reset(http, group, topic, "earliest")["resolved"]
        assert c.call(commit, 8).topics[0].partitions[0].error_code == 22
        assert _fetched(c, group, topic) == 0
        assert row["fencedBelowGeneration"] == generation + 1
        beat = HeartbeatRequest(
            group_id=group, generation_id=generation, member_id=member, group_instance_id=None
        )
        assert c.call(beat, 3).error_code == 22
        with TxnWire(bootstrap, f"tx-{uuid.uuid4().hex[:8]}") as txn:  # KIP-447's check too
            assert txn.init() == 0
            assert txn.add_offsets(group) == 0
            codes = txn.commit_offsets(
                group, {(topic, 0): RECORDS}, member=member, generation=generation
            )
            assert codes == {(topic, 0): 22}
        assert _lag(http, group) == (0, RECORDS)

        # it rejoins (the rebalance completes), fetches the reset and commits again
        again = join(c, group, member, session_ms=30_000, retry=False)
        assert (again.error_code, again.generation_id) == (0, generation + 1)
        assert _sync(c, group, member, generation + 1) == 0
        assert _fetched(c, group, topic) == 0
        fresh = offset_commit_request(
            group, topic, {0: 5}, generation=generation + 1, member=member
        )
        assert c.call(fresh, 8).topics[0].partitions[0].error_code == 0

        # an Empty Kafka group: the reset is its committed offset, nothing to fence
        left = LeaveGroupRequest(group_id=group, member_id=member)
        assert c.call(left, 0).error_code == 0
        (row,) = _reset(http, group, topic, "offset", 40)["resolved"]
        assert (row["appliedAt"], row["fencedBelowGeneration"]) == ("committed", None)
        assert _fetched(c, group, topic) == 40
