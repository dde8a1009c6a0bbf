"""The audit and the last stable offset (LSO): a committed transaction whose copy is in
progress while the audit reads is reported *not yet stable*, with the records at or
after its partition's LSO, instead of incomplete or undecided; what lies before the LSO
is checked as ever.

A sidecar of its own decides a commit and waits a minute before copying it
(``txn_apply_delay_ms``); the first of the transaction's three records is then written
into the partition as its copy would be (the copy begun, cut short), between plain
records. On the build before the LSO the audit failed that transaction as undecided
(visible, no decision appended yet) and, had its decision been there, incomplete.
"""

from __future__ import annotations

import httpx
import pulsar as pulsar_client
import pytest

from kop_dedup_tools.topics import create_topic
from tests.audit_copies import send_copy
from tests.helpers import batch, delete_namespace, init_txn, new_pid, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.filterwarnings(  # PySpark 3.5's collect() socket, as in test_audit.py
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]


def test_a_copy_in_progress_is_not_yet_stable_and_what_lies_before_is_checked(spark, pulsar):
    from kop_dedup.spark.audit import audit

    namespace = uniq("kop-dedup-lso")
    topic = uniq("lso")
    create_topic(pulsar.admin_url, topic, partitions=1)
    with (
        ThreadSidecar(pulsar, system_namespace=namespace, txn_apply_delay_ms=60_000) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        plain = new_pid(api)
        before = api.post("/v1/produce", json={"batches": [batch(topic, plain, 0, 2)]}).json()
        assert before["results"][0]["errorCode"] == 0
        tid = uniq("tid")
        pid, epoch = init_txn(api, tid)
        journaled = api.post(
            "/v1/produce",
            json={"transactionalId": tid, "batches": [batch(topic, pid, 0, 3, epoch=epoch)]},
        ).json()
        assert journaled["results"][0]["errorCode"] == 0
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": True}
        assert api.post("/v1/end-txn", json=end).json()["errorCode"] == 0
        wait_until("the decision", lambda: api.get(f"/v1/transactions/{tid}").json()["state"], 30)
        assert api.get(f"/v1/transactions/{tid}").json()["state"] == "PrepareCommit"
        # the copy begun: its first batch (one record of three) is in the partition
        client = pulsar_client.Client(pulsar.service_url)
        try:
            copy = client.create_producer(
                f"persistent://public/kafka/{topic}-partition-0",
                producer_name=uniq("copy"),
                batching_enabled=False,
            )
            send_copy(
                copy, pid=pid, seq=0, partition=0, tid=tid, ordinal=1, records=3, partitions=1
            )
            copy.close()
        finally:
            client.close()
        after = api.post("/v1/produce", json={"batches": [batch(topic, plain, 2, 2)]}).json()
        assert after["results"][0]["errorCode"] == 0

        report = audit(
            spark,
            [topic],
            service_url=pulsar.service_url,
            admin_url=pulsar.admin_url,
            system_namespace=namespace,
            progress=False,
        )
    delete_namespace(pulsar.admin_url, f"public/{namespace}")
    print(report.render())
    assert report.ok
    assert (report.txn_undecided_visible, report.txn_incomplete) == (0, 0)
    assert report.txn_not_yet_stable == 1
    assert report.not_yet_stable_records == 1 + 2  # the copy's record and what came after
    assert report.records == 2 + 1 + 2
    assert (report.duplicates, report.missing) == (0, 0)
    [example] = report.txn_examples
    assert (example["kind"], example["transactionalId"]) == ("not-yet-stable", tid)
    assert "not yet stable      1 transactions, 3 records" in report.render()
