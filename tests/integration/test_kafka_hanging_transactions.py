"""``kafka-transactions find-hanging`` and ``abort`` (KIP-664, Kafka 4.1's own tool run
from its jars) against the sidecar's listener.

A hanging transaction, here: a commit decided whose copy cannot complete as the
decision counted it (the journal holds another number of its batches), so it stays
PrepareCommit, holds the partition's last stable offset, and is reported
``unresolved``: the coordinator no longer expects to finish it by itself. The test
makes one by having the decision count one batch more than was journaled in one topic
(as a journal trimmed by its retention would look)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import WriteTxnMarkersRequest

from kop_dedup.protocol.transactions import Partition, Transaction
from tests.helpers import uniq, wait_until
from tests.integration.kafka_consume import create, produce
from tests.integration.kafka_txn import read_committed, transactional_producer
from tests.kafka_cli import TRANSACTIONS, run_tools
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def count_one_too_many(sc: ThreadSidecar, topic: str) -> Callable[[], None]:
    """Decisions of the sidecar count one batch more in ``topic`` than was journaled,
    until the function answered is called."""
    copier = sc.runtime.copier
    counted = copier.decision_end

    async def one_too_many(txn: Transaction, part: Partition) -> tuple[str | None, int]:
        end, n = await counted(txn, part)
        return end, n + 1 if part.topic == topic else n

    copier.decision_end = one_too_many

    def restore() -> None:
        copier.decision_end = counted

    return restore


def state_of(
    api: httpx.Client, tid: str, until: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = api.get(f"/v1/transactions/{tid}").json()
        if until(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_find_hanging_names_a_commit_whose_copy_cannot_complete_and_abort_ends_it(
    pulsar: Any, tmp_path: Any
) -> None:
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        b = sc.kafka_bootstrap
        stuck, fine = create(b, stem="stuck"), create(b, stem="fine")
        produce(b, stuck, [(0, None, b"before-0"), (0, None, b"before-1")])
        restore = count_one_too_many(sc, stuck)
        tid = uniq("tx-hanging")
        producer = transactional_producer(b, tid)
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(3):
            producer.produce(stuck, value=f"s{i}".encode(), partition=0)
            producer.produce(fine, value=f"f{i}".encode(), partition=0)
        producer.commit_transaction(30)
        body = state_of(api, tid, lambda t: bool(t.get("unresolved")))
        assert body["state"] == "PrepareCommit", body
        assert body["unresolved"], body
        pid, epoch = body["producerId"], body["producerEpoch"]
        restore()
        s = ("--bootstrap-server", b)
        abort = (TRANSACTIONS, [*s, "abort", "--topic", stuck, "--partition", "0"])
        hanging, waiting, described, unknown, aborted, again = run_tools(
            [
                (TRANSACTIONS, [*s, "find-hanging", "--topic", stuck, "--max-transaction-timeout", "0"]),
                (TRANSACTIONS, [*s, "find-hanging", "--topic", fine, "--max-transaction-timeout", "0"]),
                (TRANSACTIONS, [*s, "describe-producers", "--topic", stuck, "--partition", "0"]),
                (abort[0], [*abort[1], "--start-offset", "7"]),
                (abort[0], [*abort[1], "--start-offset", "2"]),
                (TRANSACTIONS, [*s, "find-hanging", "--topic", stuck, "--max-transaction-timeout", "0"]),
            ],
            tmp_path,
        )  # fmt: skip
        assert hanging.exit == 0, (hanging.text, hanging.error_text)
        rows = [line.split() for line in hanging.lines[1:]]
        # Topic Partition ProducerId ProducerEpoch CoordinatorEpoch StartOffset LastTimestamp
        assert [r[:4] + r[5:6] for r in rows] == [[stuck, "0", str(pid), str(epoch), "2"]], (
            hanging.text
        )
        # the commit's other partition waits for it, but its copy is expected to complete
        assert waiting.exit == 0, waiting.error_text
        assert waiting.lines[1:] == (), waiting.text
        assert described.exit == 0, described.error_text
        assert any(
            line.split()[:2] == [str(pid), str(epoch)] and line.split()[-1] == "2"
            for line in described.lines[1:]
        ), described.text
        assert unknown.exit == 1
        assert (
            f"Could not find any open transactions starting at offset 7 on partition {stuck}-0"
            in unknown.error_text + unknown.text
        ), (unknown.text, unknown.error_text)
        assert aborted.exit == 0, (aborted.text, aborted.error_text)
        assert again.exit == 0, again.error_text
        assert again.lines[1:] == (), again.text  # nothing hangs once aborted

        # the rest of the commit lands; nothing of it in the aborted partition
        body = state_of(api, tid, lambda t: t["state"] == "CompleteCommit")
        assert body["state"] == "CompleteCommit", body
        got = read_committed(b, fine, 1, 3, timeout=30)
        assert [g.value for g in got] == [b"f0", b"f1", b"f2"]
        got = read_committed(b, stuck, 1, 2, timeout=30)
        assert [g.value for g in got] == [b"before-0", b"before-1"]
        # and the transactional id is usable again
        producer.begin_transaction()
        producer.produce(stuck, value=b"after", partition=0)
        producer.commit_transaction(30)
        got = read_committed(b, stuck, 1, 3, timeout=30)
        assert [g.value for g in got] == [b"before-0", b"before-1", b"after"]


def test_an_abort_sent_to_the_partition_leader_is_decided_by_the_ids_coordinator(
    pulsar: Any, tmp_path: Any
) -> None:
    """Two nodes: the transactional id is coordinated by A, the partition led by B, so the
    tool's WriteTxnMarkers reaches B, which forwards it to A."""
    with (
        ThreadSidecar(pulsar, system_namespace=uniq("sys")) as a,
        ThreadSidecar(pulsar, cluster_of=a) as b,
        httpx.Client(base_url=a.url, timeout=60) as api,
    ):
        wait_until(
            "A and B to list each other",
            lambda: all(len(n.runtime.cluster.members) == 2 for n in (a, b)),
        )
        cluster, b_id = a.runtime.cluster, b.runtime.cluster.me.node_id
        tid = next(
            t
            for t in (uniq("tx-hanging") for _ in range(1000))
            if cluster.is_me(cluster.txn_coordinator(t))
        )
        stuck = next(
            n
            for n in (uniq("stuck") for _ in range(1000))
            if cluster.leader(n, 0, 1).node_id == b_id
        )
        admin = AdminClient({"bootstrap.servers": a.kafka_bootstrap})
        admin.create_topics([NewTopic(stuck, 1)])[stuck].result(30)
        produce(a.kafka_bootstrap, stuck, [(0, None, b"before-0"), (0, None, b"before-1")])
        restore = count_one_too_many(a, stuck)
        producer = transactional_producer(a.kafka_bootstrap, tid)
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(stuck, value=b"s0", partition=0)
        producer.commit_transaction(30)
        assert state_of(api, tid, lambda t: bool(t.get("unresolved")))["unresolved"]
        restore()
        forwarded = b.runtime.cluster.stats.forwarded
        s = ("--bootstrap-server", b.kafka_bootstrap)
        (aborted,) = run_tools(
            [(TRANSACTIONS, [*s, "abort", "--topic", stuck, "--partition", "0", "--start-offset", "2"])],
            tmp_path,
        )  # fmt: skip
        assert aborted.exit == 0, (aborted.text, aborted.error_text)
        assert b.runtime.cluster.stats.forwarded > forwarded
        body = state_of(api, tid, lambda t: t["state"] == "CompleteCommit")
        assert body["state"] == "CompleteCommit", body
        got = read_committed(a.kafka_bootstrap, stuck, 1, 2, timeout=30)
        assert [g.value for g in got] == [b"before-0", b"before-1"]
        producer.flush(5)


def _markers(c: WireClient, version: int, *markers: tuple[int, int, bool, str, int]) -> list[Any]:
    """(partition, error code) of each marker (producer id, epoch, commit, topic, partition)."""
    r = WriteTxnMarkersRequest
    request = r(
        markers=[
            r.WritableTxnMarker(
                producer_id=pid,
                producer_epoch=epoch,
                transaction_result=commit,
                topics=[r.WritableTxnMarker.WritableTxnMarkerTopic(name=t, partition_indexes=[p])],
                coordinator_epoch=0,
            )
            for pid, epoch, commit, t, p in markers
        ]
    )
    answer = c.call(request, version)
    return [
        (m.producer_id, [(t.name, [(p.partition_index, p.error_code) for p in t.partitions])
                         for t in m.topics])
        for m in answer.markers
    ]  # fmt: skip


def test_write_txn_markers_answers_what_it_cannot_do_with_kafkas_codes(sidecar_kafka):
    """A commit marker is 48; a producer with nothing there 0 (nothing to abort); a
    partition that does not exist 3; each marker answered on its own, v1 and v2."""
    topic = create(sidecar_kafka, stem="markers")
    with WireClient(sidecar_kafka) as c:
        for version in (1, 2):
            assert _markers(
                c,
                version,
                (123456789, 0, True, topic, 0),
                (123456789, 0, False, topic, 0),
                (123456789, 0, False, topic, 5),
                (123456789, 0, False, uniq("nope"), 0),
            ) == [
                (123456789, [(topic, [(0, 48)])]),
                (123456789, [(topic, [(0, 0)])]),
                (123456789, [(topic, [(5, 3)])]),
                (123456789, [(mock.ANY, [(0, 3)])]),
            ]
