"""read_committed sees a transaction whole (issue 25): a committed transaction is copied
into its data partition batch by batch after EndTxn is answered, and no read_committed
answer may lie inside it while it is being copied.

Two sidecar processes of one cluster: node 1 coordinates the transaction (it copies),
node 2 leads the partition (it answers the watchers). A librdkafka transactional
producer sends 300 single-record batches to one partition and commits, while two
ListOffsets(READ_COMMITTED) loops (the bare wire client) and a read_committed
confluent-kafka consumer watch node 2, and a Pulsar reader of the partition times each
copied record's arrival (the copy's clock). No answer lies strictly inside the
transaction's span, answers given while the copy was half done stand at its first
record, and every time the consumer reaches the end it has seen all 300 records or
none. The same with node 1 SIGKILLed as soon as the first copied record is in: node 2
holds the LSO at the transaction's first record until its recovery (3 s later, by
``txn_apply_delay_ms``) finished the copy, then shows the whole transaction once.
Both fail on the build before the LSO (answers inside the span).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pulsar as pulsar_client
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from tests.helpers import batch, uniq, wait_until
from tests.integration.groups import commit, configure, join, lag, offsets, poll, pull, values
from tests.integration.kafka_consume import create, list_offsets_request, produce
from tests.integration.kafka_txn import transactional_producer, txn_id
from tests.kafka_wire import WireClient
from tests.sidecar import ProcessSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]

RECORDS = 300
RATE = 150
PLAIN = 5
"""Plain records before the transaction: its first offset is not 0 (an answer of 0
could not lie inside it)."""


@dataclass
class Watch:
    """ListOffsets(READ_COMMITTED) answers, a read_committed consumer's ends, and when
    each copied record reached the partition (a Pulsar reader of it, pushed to: the
    copy's clock), while they run."""

    bootstrap: str
    topic: str
    reader: Any
    """A Pulsar reader of the data partition from its end."""
    committed: list[tuple[float, float, int]] = field(default_factory=list)
    """(asked at, answered at, offset)."""
    ends: list[tuple[int, int]] = field(default_factory=list)
    """(offset, transaction records seen so far) at each end the consumer reached."""
    values: list[tuple[int, str]] = field(default_factory=list)
    copied: list[float] = field(default_factory=list)
    """When each copied record reached the partition."""
    errors: list[str] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # three askers, each on its own connection: a copy of 300 batches takes about a
        # hundred milliseconds or more, an answer a few (tens to a hundred meanwhile)
        self._threads = [
            *(threading.Thread(target=self._ask, daemon=True) for _ in range(3)),
            threading.Thread(target=self._consume, daemon=True),
            threading.Thread(target=self._clock, daemon=True),
        ]

    def start(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.halt.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def seen(self) -> int:
        return sum(1 for _, v in self.values if v.startswith("txn-"))

    def answered_between(self, after: float, before: float) -> list[int]:
        """The answers asked after ``after`` and answered before ``before``."""
        return [
            offset
            for asked, answered, offset in self.committed
            if after < asked and answered < before
        ]

    def _ask(self) -> None:
        request = list_offsets_request(self.topic, {0: -1}, 1)
        while not self.halt.is_set():
            try:
                with WireClient(self.bootstrap, timeout=10) as c:
                    while not self.halt.is_set():
                        asked = time.monotonic()
                        [p] = c.call(request, 5).topics[0].partitions
                        if p.error_code == 0:
                            self.committed.append((asked, time.monotonic(), p.offset))
            except (OSError, ConnectionError) as exc:  # a sidecar killed under it
                self.errors.append(repr(exc))
                time.sleep(0.2)

    def _clock(self) -> None:
        while not self.halt.is_set():
            try:
                msg = self.reader.read_next(200)
            except pulsar_client.Timeout:
                continue
            if "kafka.txn.ordinal" in msg.properties():  # a copied record
                self.copied.append(time.monotonic())

    def _consume(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"lso-{uuid.uuid4().hex[:8]}",  # assigned, never joins
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        try:
            while not self.halt.is_set():
                for msg in consumer.consume(1000, 0.2):
                    err = msg.error()
                    if err is None:
                        self.values.append((int(msg.offset() or 0), msg.value().decode()))
                    elif err.code() == KafkaError._PARTITION_EOF:
                        self.ends.append((int(msg.offset() or 0), self.seen()))
        finally:
            consumer.close()


def inside(answers: list[int], first: int) -> list[int]:
    """The answers strictly inside the transaction's span first .. first+RECORDS-1."""
    return [a for a in answers if first < a <= first + RECORDS - 1]


def send_transaction(bootstrap: str, topic: str, tid: str) -> None:
    """300 single-record batches to partition 0 in one transaction, committed."""
    producer = transactional_producer(
        bootstrap, tid, **{"linger.ms": 0, "batch.num.messages": 1, "enable.idempotence": True}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(RECORDS):
        producer.produce(topic, value=f"txn-{i}".encode(), partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    producer.commit_transaction(60)
    assert producer.errors == []


def check(watch: Watch, first: int) -> None:
    got = [(o, v) for o, v in watch.values if v.startswith("txn-")]
    assert got == [(first + i, f"txn-{i}") for i in range(RECORDS)]  # once, in order
    assert inside([offset for _, _, offset in watch.committed], first) == []
    assert [e for e in watch.ends if e[1] not in (0, RECORDS)] == []
    assert inside([offset for offset, _ in watch.ends], first) == []


@pytest.fixture(scope="module")
def pair(pulsar: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ProcessSidecar]]:
    """Two sidecar processes of one cluster (nodes 1 and 2, their own system namespace).
    Node 2 recovers a decision 3 s after it takes it over (``txn_apply_delay_ms``): the
    window in which a copy cut short by a crash stays in part in its partition."""
    logs, ns = tmp_path_factory.mktemp("lso"), uniq("lso")
    common = {"system_namespace": ns, "cluster_refresh_ms": 300, "log_level": "INFO"}
    nodes = [
        ProcessSidecar(pulsar, logs, node_id=1, **common),
        ProcessSidecar(pulsar, logs, node_id=2, txn_apply_delay_ms=3_000, **common),
    ]
    try:
        for node in nodes:
            node.start()
        wait_until("both nodes to list two members", lambda: len(_brokers(nodes[0])) == 2)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _metadata(node: ProcessSidecar, topic: str | None) -> Any:
    topics = None if topic is None else [MetadataRequest[9].MetadataRequestTopic(name=topic)]
    with WireClient(node.kafka_bootstrap) as c:
        return c.call(
            MetadataRequest[9](
                topics=topics,
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            ),
            9,
        )


def _brokers(node: ProcessSidecar) -> list[int]:
    return sorted(b.node_id for b in _metadata(node, None).brokers)


def _leader(node: ProcessSidecar, topic: str) -> int:
    (t,) = _metadata(node, topic).topics
    (p,) = t.partitions
    return int(p.leader_id)


def _coordinator(node: ProcessSidecar, tid: str) -> int:
    with WireClient(node.kafka_bootstrap) as c:
        answer = c.call(FindCoordinatorRequest[2](key=tid, key_type=1), 2)
    assert answer.error_code == 0, answer
    return int(answer.node_id)


def _placed(pair: list[ProcessSidecar], admin_url: str) -> tuple[str, str]:
    """A topic of one partition led by node 2 (it answers the watchers) and a
    transactional id coordinated by node 1 (it copies), with PLAIN records in it."""
    leader = pair[1]
    topic = next(
        t
        for t in (create(leader.kafka_bootstrap, 1, "lso") for _ in range(20))
        if _leader(leader, t) == 2
    )
    tid = next(t for t in (txn_id("lso") for _ in range(200)) if _coordinator(leader, t) == 1)
    produce(leader.kafka_bootstrap, topic, [(0, None, f"plain-{i}".encode()) for i in range(PLAIN)])
    # the broker lets RATE messages a second into the partition: a copy of 300 takes
    # about 2 s, so the watchers see it in progress, and a crash cuts it in the middle
    r = httpx.post(
        f"{admin_url}/admin/v2/persistent/public/kafka/{topic}/publishRate",
        json={"publishThrottlingRateInMsg": RATE, "publishThrottlingRateInByte": -1},
        timeout=30,
    )
    assert r.status_code == 204, r.text
    return topic, tid


def _both(pair: list[ProcessSidecar]) -> str:
    return ",".join(n.kafka_bootstrap for n in pair)


def _watch(pair: list[ProcessSidecar], topic: str, client: Any) -> Watch:
    reader = client.create_reader(
        f"persistent://public/kafka/{topic}-partition-0", pulsar_client.MessageId.latest
    )
    return Watch(pair[1].kafka_bootstrap, topic, reader).start()


def test_read_committed_answers_never_lie_inside_a_transaction_being_copied(
    pair, pulsar, pulsar_reader_client
):
    topic, tid = _placed(pair, pulsar.admin_url)
    watch = _watch(pair, topic, pulsar_reader_client)
    try:
        send_transaction(_both(pair), topic, tid)
        wait_until("the consumer to see the transaction", lambda: watch.seen() == RECORDS, 60)
        time.sleep(0.3)  # a few answers after the copy
    finally:
        watch.stop()
        watch.reader.close()
    check(watch, PLAIN)
    # answers asked once the copy's first record was in and given before its last 30
    # were (at RATE a second: the copy was not complete): the LSO held at the
    # transaction's first record meanwhile
    during = watch.answered_between(watch.copied[0], watch.copied[-30])
    assert during
    assert set(during) == {PLAIN}
    assert watch.committed[-1][2] == PLAIN + RECORDS


def test_a_copy_cut_short_by_a_crash_holds_the_lso_until_another_sidecar_finishes_it(
    pair, pulsar, pulsar_reader_client
):
    """Node 1 coordinates the transaction (and copies it), node 2 leads the partition:
    node 1 is SIGKILLed as soon as the first copied record is in the partition, node 2
    takes the transaction over and finishes the copy 3 s later. Meanwhile part of the
    transaction is in the partition, and node 2's read_committed answers stop before it."""
    copier, leader = pair
    topic, tid = _placed(pair, pulsar.admin_url)
    watch = _watch(pair, topic, pulsar_reader_client)
    killer = threading.Thread(target=_kill_once_copying, args=(watch, copier), daemon=True)
    try:
        killer.start()
        send_transaction(_both(pair), topic, tid)
        killer.join(timeout=60)
        assert not copier.running()
        wait_until("node 2 to finish the copy", lambda: watch.seen() == RECORDS, 90)
        time.sleep(0.3)
    finally:
        watch.stop()
        watch.reader.close()
    check(watch, PLAIN)
    # the crash cut the copy: node 2's recovery copied the rest after a gap of 3 s
    gaps = [b - a for a, b in itertools.pairwise(watch.copied)]
    cut = gaps.index(max(gaps)) + 1
    assert 0 < cut < RECORDS, cut
    assert max(gaps) > 2.5, max(gaps)
    # answers while part of the copy stood alone held at the transaction's first record
    assert PLAIN in watch.answered_between(watch.copied[cut - 1], watch.copied[cut])
    assert (PLAIN, 0) in watch.ends  # the consumer reached the end there, none of it seen
    log = leader.log_path.read_text()
    assert f"recovering transaction 1 of {tid!r}" in log
    assert f"transaction 1 of {tid!r}: CompleteCommit" in log


def _kill_once_copying(watch: Watch, copier: ProcessSidecar) -> None:
    """SIGKILL the copying sidecar as soon as the first copied record is in the data
    partition: the commit was answered, the copy is under way."""
    deadline = time.monotonic() + 60
    while not watch.copied and time.monotonic() < deadline:
        time.sleep(0.001)
    copier.kill()


def test_a_group_pull_never_hands_out_part_of_a_transaction_and_its_lag_counts_to_the_lso(
    pair, pulsar, pulsar_reader_client
):
    """The same crash through the HTTP API: a transaction of 300 single-record batches
    committed through node 1, node 1 killed at its first copied record; a group member
    pulling through node 2 gets the records before the transaction and nothing of it
    while part of it stands alone, the group's lag ends at its first record; once node 2
    finished the copy, the member gets all 300 once, in order."""
    copier, leader = pair
    if not copier.running():  # the crash test before this one killed it
        copier.start()
        wait_until("both nodes to list two members", lambda: len(_brokers(leader)) == 2)
    topic, tid = _placed(pair, pulsar.admin_url)
    group = uniq("g")
    with (
        httpx.Client(base_url=leader.url, timeout=60) as api,
        httpx.Client(base_url=copier.url, timeout=60) as coordinator,
    ):
        configure(api, group)
        member = join(api, group, [topic])["memberId"]
        assert offsets(pull(api, group, member, 100)) == list(range(PLAIN))
        commit(api, group, member)
        pid, epoch = _http_transaction(coordinator, tid, topic, RECORDS)
        watch = _watch(pair, topic, pulsar_reader_client)
        killer = threading.Thread(target=_kill_once_copying, args=(watch, copier), daemon=True)
        try:
            killer.start()
            end = coordinator.post(
                "/v1/end-txn",
                json={
                    "transactionalId": tid,
                    "producerId": pid,
                    "producerEpoch": epoch,
                    "commit": True,
                },
            )
            assert end.json()["errorCode"] == 0, end.text
            killer.join(timeout=60)
            stood_alone = _settled_count(watch)  # what node 1 had sent lands meanwhile
            assert 0 < stood_alone < RECORDS
            got = pull(api, group, member, 100, wait_ms=500)  # while part of it stands alone
            rows = lag(api, group)[topic, 0]
            assert len(watch.copied) == stood_alone, "the recovery ran before the checks"
        finally:
            watch.stop()
            watch.reader.close()
        assert got["records"] == []
        assert (rows["end"], rows["lag"]) == (PLAIN, 0)
        done = poll(
            "the recovery to finish the copy", lambda: pull(api, group, member, 1000)["records"], 60
        )
        answer = {"records": done}
        assert offsets(answer) == list(range(PLAIN, PLAIN + RECORDS))
        assert values(answer) == [str(i) for i in range(RECORDS)]
        commit(api, group, member)
        # the log says complete a moment after the last copied record is in
        poll("the lag to end after it", lambda: lag(api, group)[topic, 0]["end"] == PLAIN + RECORDS)


def _http_transaction(api: httpx.Client, tid: str, topic: str, n: int) -> tuple[int, int]:
    """Journal ``n`` single-record batches of a transaction of ``tid`` (not committed)."""
    body = api.post("/v1/init-producer-id", json={"transactionalId": tid}).json()
    assert body["errorCode"] == 0, body
    pid, epoch = body["producerId"], body["producerEpoch"]
    batches = [batch(topic, pid, i, 1, epoch=epoch) for i in range(n)]
    answer = api.post("/v1/produce", json={"transactionalId": tid, "batches": batches}).json()
    assert [r["errorCode"] for r in answer["results"]] == [0] * n, answer
    return pid, epoch


def _settled_count(watch: Watch) -> int:
    """The copied records in once no more came for half a second."""
    count = -1
    while count != len(watch.copied):
        count = len(watch.copied)
        time.sleep(0.5)
    return count
