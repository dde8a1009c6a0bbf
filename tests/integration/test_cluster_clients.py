"""Real Kafka clients against a cluster of three sidecar processes, the way users run
them: behind a round-robin TCP load balancer as ``bootstrap.servers`` (librdkafka learns
the real brokers from Metadata and connects to them directly), and a steady workload of a
consumer group and transactional copiers whose members each bootstrap to a different
node, during which no state partition moves.

The steady run lasts :data:`RUN_S` seconds of input (20 by default, for CI); the
documented long run (docs/operations/cluster.md) sets ``KOP_DEDUP_CLUSTER_RUN_S=60``::

    KOP_DEDUP_CLUSTER_RUN_S=60 pytest tests/integration/test_cluster_clients.py -k steady -s
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from kop_dedup_tools.soak_check import aborted_reads, copy_counts
from kop_dedup_tools.soak_copiers import CopierProcess, rdkafka_copier
from kop_dedup_tools.soak_watch import KafkaSide, read_committed
from kop_dedup_tools.topics import create_topic
from tests.cluster_nodes import Nodes
from tests.helpers import uniq
from tests.tcp_proxy import RoundRobinProxy

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

RUN_S = float(os.environ.get("KOP_DEDUP_CLUSTER_RUN_S", "20"))
"""Seconds of input in the steady run."""
RATE = 100
"""Input records per second in the steady run."""
PARTITIONS = 6


@pytest.fixture(scope="module")
def trio(pulsar: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Three sidecar processes (nodes 1, 2, 3) of one cluster of their own."""
    nodes = Nodes(pulsar, tmp_path_factory.mktemp("trio")).start()
    nodes.write_every_state_partition()  # see there: what a side-by-side start leaves
    try:
        yield nodes
    finally:
        nodes.stop()


def _consume_all(consumers: list[Consumer], want: int, timeout: float) -> list[list[str]]:
    """Poll every consumer in turn (committing each record before the next poll) until
    they have read ``want`` records between them; what each read."""
    seen: list[list[str]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout
    while sum(len(s) for s in seen) < want and time.monotonic() < deadline:
        for i, consumer in enumerate(consumers):
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            seen[i].append(msg.value().decode())
            consumer.commit(message=msg, asynchronous=False)
    return seen


def test_librdkafka_clients_work_through_a_round_robin_proxy_in_front_of_three_nodes(trio, pulsar):
    """``bootstrap.servers`` is one address that hands each connection to the next node:
    an idempotent producer, a transactional producer (a commit and an abort) and a
    two-member read_committed group all work, every committed record read once."""
    topic = uniq("proxied")
    create_topic(pulsar.admin_url, topic, partitions=PARTITIONS)
    with RoundRobinProxy([sc.kafka_bootstrap for sc in trio]) as proxy:
        base = {"bootstrap.servers": proxy.address}
        producer = Producer({**base, "enable.idempotence": True, "linger.ms": 5})
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        for i in range(300):
            producer.produce(
                topic, f"i{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered
            )
        assert producer.flush(60) == 0
        assert failed == []

        txp = Producer({**base, "transactional.id": uniq("tid")})
        txp.init_transactions(60)
        txp.begin_transaction()
        for i in range(60):
            txp.produce(topic, f"c{i}".encode(), partition=i % PARTITIONS)
        txp.commit_transaction(60)
        txp.begin_transaction()
        for i in range(20):
            txp.produce(topic, f"a{i}".encode(), partition=i % PARTITIONS)
        txp.abort_transaction(60)

        group = uniq("g")
        consumers = [
            Consumer(
                {
                    **base,
                    "group.id": group,
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
            for _ in range(2)
        ]
        try:
            for consumer in consumers:
                consumer.subscribe([topic])
            seen = _consume_all(consumers, 360, timeout=120)
        finally:
            for consumer in consumers:
                consumer.close()
        upstreams = dict(proxy.connections)
    everything = Counter(v for s in seen for v in s)
    print(f"\nCLUSTER proxy {json.dumps({'proxied': upstreams, 'read': [len(s) for s in seen]})}")
    assert set(everything) == {f"i{i}" for i in range(300)} | {f"c{i}" for i in range(60)}
    assert max(everything.values()) == 1  # once, across the members
    assert all(seen)  # both members had partitions
    assert len(upstreams) >= 2  # the proxy spread its connections over the nodes


class Reader(threading.Thread):
    """A member of a read_committed group, bootstrapped to one node, committing what it
    read after each poll."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "session.timeout.ms": 10_000,
            }
        )
        self.topic = topic
        self.values: list[str] = []
        self.assigned = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=lambda _c, _ps: self.assigned.set())
        try:
            while not self.stop.is_set():
                msgs = [m for m in self.consumer.consume(200, 0.5) if m.error() is None]
                if msgs:
                    self.values += [m.value().decode() for m in msgs]
                    self.consumer.commit(asynchronous=False)
        finally:
            self.consumer.close()


def _cluster_counters(nodes: Nodes) -> dict[int, dict[str, int]]:
    out = {}
    for i in nodes.ids:
        d = nodes.described(i)
        out[i] = {
            "moves": nodes.moves(i),
            "membershipChanges": d["membershipChanges"],
            "forwarded": d["forwarded"],
            "refused6": d["refusedNotLeader"],
            "refused16": d["refusedNotCoordinator"],
        }
    return out


def _seed(bootstrap: str, topic: str, seconds: float, stop: threading.Event) -> list[str]:
    """``RATE`` records a second for ``seconds`` (values ``s<n>``, round the partitions);
    the values acknowledged."""
    acked: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked.append(msg.value().decode())

    began, n = time.monotonic(), 0
    while time.monotonic() - began < seconds and not stop.is_set():
        while n < (time.monotonic() - began) * RATE:
            value = f"s{n}".encode()
            producer.produce(topic, value, value, partition=n % PARTITIONS, on_delivery=delivered)
            n += 1
        producer.poll(0.05)
    assert producer.flush(60) == 0
    return acked


def _warm(copiers: list[CopierProcess], readers: list[Reader]) -> None:
    """Until every copier has committed a transaction and every reader has partitions."""
    deadline = time.monotonic() + 120
    while not (
        all(any(e.get("e") == "committed" for e in c.events()) for c in copiers)
        and all(r.assigned.is_set() for r in readers)
    ):
        assert time.monotonic() < deadline, [c.last_line() for c in copiers]
        assert all(c.running() for c in copiers), [c.last_words() for c in copiers]
        time.sleep(0.2)


def _drained(side: KafkaSide, copiers: list[CopierProcess], group: str, source: str) -> None:
    """Until the copiers' group has committed the input's end on every partition."""
    ends = side.ends({source: PARTITIONS}, committed=False)
    want = {p: ends[(source, p)] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 120
    while (got := side.committed(group, source, PARTITIONS)) != want:
        assert time.monotonic() < deadline, (got, want)
        assert all(c.running() for c in copiers), [c.last_words() for c in copiers]
        time.sleep(0.5)


def _checks(
    seeded: list[str], output: list[Any], copiers: list[CopierProcess]
) -> tuple[dict[str, Any], int, int]:
    """soak_check's duplicates, lost, order and aborted of the output; the transactions
    asked to commit and those aborted on purpose."""
    inputs: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for value in sorted(seeded, key=lambda v: int(v[1:])):
        inputs[int(value[1:]) % PARTITIONS].append(value)
    checks: dict[str, Any] = copy_counts(inputs, output, reader="read_committed")
    begun = {str(e["a"]) for c in copiers for e in c.events() if e.get("e") == "begin"}
    asked = {str(e["a"]) for c in copiers for e in c.events() if e.get("e") == "commit"}
    checks["aborted"] = aborted_reads(output, begun - asked, reader="read_committed")
    return checks, len(asked), len(begun - asked)


def test_a_steady_group_and_three_copiers_across_nodes_move_no_partition(trio, pulsar, tmp_path):
    """Three librdkafka transactional copiers (one consumer group, each bootstrapped to a
    different node, with random aborts) copy an input topic while a three-member
    read_committed group (each member on a different node) reads the output. After the
    warm-up no node loads or releases a state partition (cluster_ownership_moves_total
    stays), and every input record is copied once, in order, and read once by the group."""
    source, out = uniq("steady-in"), uniq("steady-out")
    for topic in (source, out):
        create_topic(pulsar.admin_url, topic, partitions=PARTITIONS)
    bootstraps = [sc.kafka_bootstrap for sc in trio]
    copy_group, read_group = uniq("copiers"), uniq("readers")
    copiers: list[CopierProcess] = [
        rdkafka_copier(
            uniq(f"copier-{i}"),
            bootstrap=bootstrap,
            group=copy_group,
            input_topic=source,
            output_topic=out,
            log_dir=tmp_path,
            transaction_size=50,
            batch_records=10,
            abort_rate=0.1,
            seed=i,
        )
        for i, bootstrap in enumerate(bootstraps)
    ]
    readers = [Reader(b, read_group, out) for b in bootstraps]
    side = KafkaSide(",".join(bootstraps), log)
    stop = threading.Event()
    seeded: list[str] = []
    try:
        for copier in copiers:
            copier.start()
        for reader in readers:
            reader.start()
        seeder = threading.Thread(
            target=lambda: seeded.extend(_seed(bootstraps[0], source, RUN_S, stop)), daemon=True
        )
        seeder.start()
        _warm(copiers, readers)
        warm, warm_at = _cluster_counters(trio), time.monotonic()
        seeder.join(timeout=RUN_S + 120)
        _drained(side, copiers, copy_group, source)
        out_ends = side.ends({out: PARTITIONS}, committed=True)
        deadline = time.monotonic() + 60
        while sum(len(r.values) for r in readers) < len(seeded) and time.monotonic() < deadline:
            time.sleep(0.2)
        after, steady_s = _cluster_counters(trio), round(time.monotonic() - warm_at, 1)
    finally:
        stop.set()
        for copier in copiers:
            copier.stop()
        for reader in readers:
            reader.stop.set()
        for reader in readers:
            reader.join(timeout=30)
    output = read_committed(side, out, {p: out_ends[(out, p)] for p in range(PARTITIONS)})
    side.close()
    checks, transactions, aborted = _checks(seeded, output, copiers)
    group_read = Counter(v for r in readers for v in r.values)
    figures = {
        "run_s": RUN_S,
        "steady_s": steady_s,
        "input": len(seeded),
        "output_committed": sum(out_ends.values()),
        "transactions": transactions,
        "aborted_on_purpose": aborted,
        "group_read": sum(group_read.values()),
        "group_read_twice": sum(n - 1 for n in group_read.values() if n > 1),
        "checks": {k: (c.violations, c.examples[:2]) for k, c in checks.items()},
        "warm": warm,
        "after": after,
    }
    print(f"\nCLUSTER steady {json.dumps(figures)}")
    assert all(c.ok for c in checks.values()), figures
    assert {i: c["moves"] for i, c in after.items()} == {i: c["moves"] for i, c in warm.items()}
    assert {i: c["membershipChanges"] for i, c in after.items()} == {
        i: c["membershipChanges"] for i, c in warm.items()
    }
    assert set(group_read) == set(seeded), figures  # the readers read every copy
    assert figures["group_read_twice"] == 0, figures
    assert transactions > RUN_S, figures  # the copiers worked all along
