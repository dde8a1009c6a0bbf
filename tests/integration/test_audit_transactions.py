"""End to end, transactions: committed ones whole and aborted ones invisible to the
Spark audit, and each way a transaction can be broken around the sidecar found by it
(the idempotent audits are in test_audit.py)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import httpx
import pulsar as pulsar_client
import pytest

from kop_dedup_tools.topics import create_topic
from tests.audit_copies import send_copy
from tests.helpers import (
    batch,
    delete_namespace,
    init_txn,
    new_pid,
    raw_producer,
    read_all,
    uniq,
    wait_until,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    # PySpark 3.5's DataFrame.collect() never closes the socket it reads the rows from
    # (pyspark/rdd.py _create_local_socket keeps only the socket's file): each collect
    # leaves one to the garbage collector, which warns. Only that leak is let through.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]


RETRIABLE = {16, 51}  # NOT_COORDINATOR, CONCURRENT_TRANSACTIONS: a Kafka client retries


@pytest.fixture(scope="module")
def txn_sidecar(pulsar):
    """A sidecar with a system namespace of its own: its transaction log, journals and
    decisions are out of reach of other sidecars sharing the broker (which would take
    its log partitions over, and with them the applying of its decisions)."""
    from tests.sidecar import ThreadSidecar

    namespace = uniq("kop-dedup-audit")
    with ThreadSidecar(pulsar, reorder_window_ms=1500, system_namespace=namespace) as sc:
        yield sc
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


@pytest.fixture
def txn_api(txn_sidecar):
    with httpx.Client(base_url=txn_sidecar.url, timeout=60) as client:
        yield client


def system_namespace(sidecar) -> str:
    return sidecar.settings.system_namespace


def post(api: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST, retrying the answers a Kafka client retries."""
    deadline = time.monotonic() + 60
    while True:
        r = api.post(path, json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        codes = {a["errorCode"] for a in answer.get("results", [answer])}
        if not codes & RETRIABLE or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def transaction(
    api: httpx.Client, tid: str, batches: list[dict[str, Any]], *, commit: bool
) -> None:
    """Produce ``batches`` in one transaction of ``tid`` and wait until it is decided and
    applied (CompleteCommit / CompleteAbort)."""
    results = post(api, "/v1/produce", {"transactionalId": tid, "batches": batches})
    assert [r["errorCode"] for r in results["results"]] == [0] * len(batches), results
    head = batches[0]
    body = {
        "transactionalId": tid,
        "producerId": head["producerId"],
        "producerEpoch": head["producerEpoch"],
        "commit": commit,
    }
    assert post(api, "/v1/end-txn", body)["errorCode"] == 0
    done = "CompleteCommit" if commit else "CompleteAbort"
    wait_until(done, lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == done, 30)


def test_audit_proves_committed_transactions_whole_and_aborted_ones_invisible(
    spark, pulsar, txn_sidecar, txn_api
):
    from kop_dedup.spark.audit import audit

    api = txn_api

    a, b, elsewhere = uniq("txa"), uniq("txb"), uniq("txc")
    for t in (a, b, elsewhere):
        create_topic(pulsar.admin_url, t, partitions=2)
    tid, other = uniq("tid"), uniq("tid")
    pid, epoch = init_txn(api, tid)
    # three transactions over 2 topics x 2 partitions; the middle one aborts, leaving a
    # hole in the producer's sequences that is no gap
    for k, commit in enumerate([True, False, True]):
        batches = [
            batch(t, pid, k * 3, 3, epoch=epoch, partition=p, tag=f"t{k}")
            for t in (a, b)
            for p in (0, 1)
        ]
        transaction(api, tid, batches, commit=commit)
    # one that also writes to a topic this audit does not read: partly audited
    opid, oepoch = init_txn(api, other)
    transaction(
        api,
        other,
        [batch(a, opid, 0, 2, epoch=oepoch), batch(elsewhere, opid, 0, 2, epoch=oepoch)],
        commit=True,
    )
    plain = new_pid(api)  # idempotent records beside them, still gap-checked
    assert (
        api.post("/v1/produce", json={"batches": [batch(a, plain, 0, 4)]}).json()["results"][0][
            "errorCode"
        ]
        == 0
    )

    namespace = system_namespace(txn_sidecar)
    report = audit(
        spark,
        [a, b],
        service_url=pulsar.service_url,
        admin_url=pulsar.admin_url,
        system_namespace=namespace,
        progress=False,
    )
    print(report.render())
    assert report.decisions_topic == f"persistent://public/{namespace}/transaction-decisions"
    assert report.records == 2 * 4 * 3 + 2 + 4
    assert report.txn_records == 2 * 4 * 3 + 2
    assert (report.duplicates, report.missing) == (0, 0)
    assert (report.txn_committed, report.txn_aborted) == (3, 1)
    assert report.txn_incomplete == 0
    assert report.txn_aborted_visible == 0
    assert report.txn_undecided_visible == 0
    assert report.txn_partly_audited == 1
    [partly] = report.txn_examples
    assert (partly["kind"], partly["transactionalId"]) == ("partly-audited", other)
    assert report.ok
    assert "txn incomplete      0" in report.render()


@pytest.fixture(scope="module")
def broken_transactions(spark, pulsar, txn_sidecar):
    """Four transactional faults planted around the sidecar, on topics of their own, and
    one audit of them all (one Spark run for four tests)."""
    from kop_dedup.spark.audit import audit

    topics = {k: uniq(k) for k in ("aborted", "short", "dup", "undecided")}
    for k, t in topics.items():
        create_topic(pulsar.admin_url, t, partitions=2 if k == "short" else 1)
    tids = {k: uniq(f"tid-{k}") for k in topics}
    client = pulsar_client.Client(pulsar.service_url)
    try:
        with httpx.Client(base_url=txn_sidecar.url, timeout=60) as api:
            # an aborted transaction, then one of its records written straight to the topic
            pid, epoch = init_txn(api, tids["aborted"])
            transaction(
                api,
                tids["aborted"],
                [batch(topics["aborted"], pid, 0, 3, epoch=epoch)],
                commit=False,
            )
            rogue = raw_producer(client, topics["aborted"], uniq("rogue"))
            send_copy(
                rogue,
                pid=pid,
                seq=1,
                partition=0,
                tid=tids["aborted"],
                ordinal=1,
                records=3,
                partitions=1,
            )
            rogue.close()

            # a committed transaction whose copied record (sequence 1) is then copied again
            pid, epoch = init_txn(api, tids["dup"])
            transaction(
                api, tids["dup"], [batch(topics["dup"], pid, 0, 3, epoch=epoch)], commit=True
            )
            copies = read_all(
                client, f"persistent://public/kafka/{topics['dup']}-partition-0", expect=3
            )
            again = raw_producer(client, topics["dup"], uniq("rogue"))
            again.send(
                copies[1].data(),
                properties=copies[1].properties(),
                partition_key=copies[1].partition_key(),
            )
            again.close()
            dup_pid = pid

        # a COMMIT of 3 + 3 records over 2 partitions, copied without one record
        short_pid = 900_000_000 + random.randrange(1_000_000)
        for partition in (0, 1):
            p = client.create_producer(
                f"persistent://public/kafka/{topics['short']}-partition-{partition}",
                producer_name=uniq("copy"),
                batching_enabled=False,
            )
            for seq in range(3):
                if (partition, seq) != (1, 2):
                    send_copy(
                        p,
                        pid=short_pid,
                        seq=seq,
                        partition=partition,
                        tid=tids["short"],
                        ordinal=1,
                        records=3,
                        partitions=2,
                    )
            p.close()
        decision = {
            "transactionalId": tids["short"],
            "ordinal": 1,
            "producerId": short_pid,
            "producerEpoch": 0,
            "decision": "COMMIT",
            "partitions": [
                {"topic": topics["short"], "partition": p, "records": 3} for p in (0, 1)
            ],
            "groups": [],
            "at": int(time.time() * 1000),
        }
        namespace = system_namespace(txn_sidecar)
        decisions = client.create_producer(
            f"persistent://public/{namespace}/transaction-decisions-partition-0"
        )
        decisions.send(json.dumps(decision).encode(), partition_key=f"{tids['short']}/1")
        decisions.close()

        # a transactional record no decision speaks of
        p = raw_producer(client, topics["undecided"], uniq("rogue"))
        send_copy(
            p,
            pid=short_pid + 1,
            seq=0,
            partition=0,
            tid=tids["undecided"],
            ordinal=1,
            records=1,
            partitions=1,
        )
        p.close()
    finally:
        client.close()

    report = audit(
        spark,
        list(topics.values()),
        service_url=pulsar.service_url,
        admin_url=pulsar.admin_url,
        system_namespace=system_namespace(txn_sidecar),
        progress=False,
    )
    print(report.render())
    examples = {}
    for ex in report.txn_examples:
        examples.setdefault(ex["transactionalId"], []).append(ex)
    return {
        "report": report,
        "topics": topics,
        "tids": tids,
        "examples": examples,
        "dup_pid": dup_pid,
    }


def test_audit_finds_a_record_of_an_aborted_transaction_written_around_the_sidecar(
    broken_transactions,
):
    report, tids = broken_transactions["report"], broken_transactions["tids"]
    assert report.txn_aborted == 1
    assert report.txn_aborted_visible == 1
    [example] = broken_transactions["examples"][tids["aborted"]]
    assert (example["kind"], example["decision"], example["visible"]) == (
        "aborted-visible",
        "ABORT",
        1,
    )
    assert report.missing == 0  # its sequences are checked by transaction, not as gaps
    assert not report.ok


def test_audit_finds_a_committed_transaction_with_a_copied_record_missing(broken_transactions):
    report, tids = broken_transactions["report"], broken_transactions["tids"]
    topic = broken_transactions["topics"]["short"]
    assert report.txn_incomplete == 1
    [example] = broken_transactions["examples"][tids["short"]]
    assert (example["kind"], example["decision"], example["visible"]) == ("incomplete", "COMMIT", 5)
    assert example["partitions"] == [
        {"topic": topic, "partition": 0, "visible": 3, "expected": 3},
        {"topic": topic, "partition": 1, "visible": 2, "expected": 3},
    ]
    assert not report.ok


def test_audit_finds_a_duplicated_copy_of_a_committed_transaction(broken_transactions):
    report, tids = broken_transactions["report"], broken_transactions["tids"]
    assert report.duplicates == 1
    [dup] = report.duplicate_examples
    assert (dup["producer_id"], dup["sequence"], dup["copies"]) == (
        broken_transactions["dup_pid"],
        1,
        2,
    )
    # counted once: the transaction itself is wholly present, no more
    assert tids["dup"] not in broken_transactions["examples"]
    assert report.txn_committed == 2  # the duplicated one and the short one
    assert not report.ok


def test_audit_finds_transactional_records_without_a_decision(broken_transactions):
    report, tids = broken_transactions["report"], broken_transactions["tids"]
    assert report.txn_undecided_visible == 1
    [example] = broken_transactions["examples"][tids["undecided"]]
    assert (example["kind"], example["decision"], example["visible"]) == (
        "undecided-visible",
        None,
        1,
    )
    as_json = json.loads(json.dumps(report.to_dict(), default=str))
    assert (as_json["ok"], as_json["txn_undecided_visible"]) == (False, 1)


def test_without_a_decisions_topic_the_markers_still_catch_a_short_transaction(
    spark, pulsar, broken_transactions
):
    from kop_dedup.spark.audit import check, kafka_records, read_topics
    from kop_dedup.spark.transactions import read_decisions

    assert (
        read_decisions(
            spark,
            service_url=pulsar.service_url,
            admin_url=pulsar.admin_url,
            system_namespace=uniq("no-such-namespace"),
        )
        is None
    )
    topics = broken_transactions["topics"]
    records = kafka_records(
        read_topics(
            spark,
            [topics["short"], topics["undecided"]],
            service_url=pulsar.service_url,
            admin_url=pulsar.admin_url,
        )
    )
    report = check(records)  # no decisions
    assert report.decisions_topic is None
    assert (report.txn_committed, report.txn_aborted) == (2, 0)
    assert report.txn_undecided_visible == 0  # nothing to tell decided from undecided
    assert report.txn_incomplete == 1  # partition 1 holds 2 of its kafka.txn.records=3
    [example] = report.txn_examples
    assert (example["transactionalId"], example["kind"]) == (
        broken_transactions["tids"]["short"],
        "incomplete",
    )
    assert not report.ok


def test_a_transaction_copied_before_the_oldest_decision_kept_is_checked_by_its_markers(spark):
    """The decisions topic keeps a day by default: a transaction older than its oldest
    decision may have lost its decision to retention. Pure logic on Spark rows."""
    from datetime import UTC, datetime

    from kop_dedup.spark.transactions import check_transactions

    def ms(t: int) -> datetime:
        return datetime.fromtimestamp(t / 1000, tz=UTC)

    records = spark.createDataFrame(
        [
            ("t", 0, 7, 0, 0, "old", 1, 2, 1, ms(1_000)),
            ("t", 0, 7, 0, 1, "old", 1, 2, 1, ms(1_000)),
            ("t", 0, 8, 0, 0, "old-short", 1, 2, 1, ms(1_500)),  # 1 of its 2 records
            ("t", 0, 9, 0, 0, "new", 1, 1, 1, ms(5_000)),  # after the oldest decision kept
        ],
        "topic string, partition int, producer_id long, epoch int, sequence long, "
        "txn_id string, txn_ordinal long, txn_records long, txn_partitions int, "
        "publish_time timestamp",
    )
    decisions = spark.createDataFrame(
        [("other", 99, 1, "COMMIT", 3_000, "elsewhere", 0, 4)],
        "txn_id string, producer_id long, txn_ordinal long, decision string, at long, "
        "topic string, partition int, records long",
    )
    summary = check_transactions(records, decisions, {"t"}, source="decisions")
    assert summary.decision_expired == 2
    assert summary.undecided_visible == 1
    assert summary.committed == 2  # the expired ones, as their markers say
    assert summary.incomplete == 1  # the markers alone still catch the short one
    assert {(e["transactionalId"], e["kind"]) for e in summary.examples} == {
        ("old", "decision-expired"),
        ("old-short", "decision-expired"),
        ("old-short", "incomplete"),
        ("new", "undecided-visible"),
    }
