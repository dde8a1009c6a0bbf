"""A data topic deleted between a commit's decision and its copy, against the real
broker through one sidecar's Kafka listener: the deleted partitions are dropped from
the copy (Kafka drops the markers of a deleted partition), the rest of the
transaction lands, the transactional id moves on (CompleteCommit; InitProducerId
answers 0) and the deleted topic stays deleted.

Both ways a broker can treat a copy producer on a partition that no longer exists are
tried, in a data namespace of the test's own: auto-creation off (the producer is
refused: the copy was retried forever, and InitProducerId answered 51), and on (the
broker made the partition again as a topic of its own, holding the copy).

The sidecar applies its decisions 3 s late (``txn_apply_delay_ms``): the topic is
deleted in that window, before any copy begins."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tests.helpers import delete_namespace, uniq
from tests.integration.kafka_consume import confluent_consumer, create
from tests.integration.kafka_txn import (
    committed_offsets,
    read_committed,
    transactional_producer,
)
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


@pytest.fixture(params=[False, True], ids=["auto-creation-off", "auto-creation-on"])
def data_namespace(request: pytest.FixtureRequest, pulsar: Any) -> Iterator[str]:
    """A data namespace of the test's own, with deduplication, and the broker's
    auto-creation of topics on use as the parameter says."""
    name = uniq("data-deleted")
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        assert admin.put(f"/admin/v2/namespaces/public/{name}").status_code < 300
        r = admin.post(
            f"/admin/v2/namespaces/public/{name}/autoTopicCreation",
            json={"allowAutoTopicCreation": request.param, "topicType": "non-partitioned"},
        )
        assert r.status_code < 300, r.text
    yield name
    delete_namespace(pulsar.admin_url, f"public/{name}")


def init_answer(api: httpx.Client, tid: str) -> int:
    r = api.post("/v1/init-producer-id", json={"transactionalId": tid})
    assert r.status_code == 200, r.text
    return int(r.json()["errorCode"])


def pulsar_topics(pulsar: Any, namespace: str) -> list[str]:
    """Every topic of the namespace, partitions and non-partitioned ones."""
    r = httpx.get(f"{pulsar.admin_url}/admin/v2/namespaces/public/{namespace}/topics", timeout=30)
    assert r.status_code == 200, r.text
    return [str(t) for t in r.json()]


def test_commit_into_a_topic_deleted_before_its_copy_completes_without_it(
    pulsar: Any, data_namespace: str
) -> None:
    with (
        ThreadSidecar(
            pulsar,
            namespace=data_namespace,
            txn_apply_delay_ms=3_000,
            system_namespace=uniq("sys"),
        ) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        b = sc.kafka_bootstrap
        kept, gone = create(b, stem="kept"), create(b, stem="gone")
        tid = uniq("tx-deleted")
        producer = transactional_producer(b, tid)
        producer.init_transactions(30)
        group = uniq("g-deleted")
        consumer = confluent_consumer(b, **{"group.id": group})
        producer.begin_transaction()
        for i in range(3):
            producer.produce(kept, value=f"k{i}".encode(), partition=0)
            producer.produce(gone, value=f"g{i}".encode(), partition=0)
        producer.send_offsets_to_transaction(
            [TopicPartition(kept, 0, 5)], consumer.consumer_group_metadata(), 30
        )
        consumer.close()
        producer.commit_transaction(30)  # answered once decided: the copy waits 3 s
        admin = AdminClient({"bootstrap.servers": b})
        admin.delete_topics([gone], operation_timeout=30)[gone].result(30)

        answers: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answers.append(init_answer(api, tid))
            if answers[-1] == 0:
                break
            time.sleep(0.5)
        assert answers[-1] == 0, f"InitProducerId answered {sorted(set(answers))} for 30 s"
        body = api.get(f"/v1/transactions/{tid}").json()
        assert body["state"] == "CompleteCommit", body
        got = read_committed(b, kept, 1, 3, timeout=30)
        assert [g.value for g in got] == [b"k0", b"k1", b"k2"]
        assert committed_offsets(b, group, kept, 1) == {0: 5}  # not pending (88) for good
        # the deleted topic stays deleted: no partition of it was made again
        assert [t for t in pulsar_topics(pulsar, data_namespace) if gone in t] == []
        assert gone not in admin.list_topics(timeout=30).topics
        stats = api.get("/v1/stats").json()
        assert stats["transactions"]["copyPartitionsDropped"] == 1, stats["transactions"]
        producer.flush(5)


def test_a_topic_deleted_while_a_copy_producer_is_open_on_it_stays_deleted(pulsar: Any) -> None:
    """DeleteTopics closes the copy producers on the topic first: one still open (a commit
    just copied) would be disconnected by the delete, reconnect, and make the partition
    again on a broker that creates topics on use. A commit into it afterwards drops it."""
    namespace = uniq("data-deleted")
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin_api:
        assert admin_api.put(f"/admin/v2/namespaces/public/{namespace}").status_code < 300
    try:
        with (
            ThreadSidecar(pulsar, namespace=namespace, system_namespace=uniq("sys")) as sc,
            httpx.Client(base_url=sc.url, timeout=60) as api,
        ):
            b = sc.kafka_bootstrap
            gone = create(b, stem="gone")
            tid = uniq("tx-deleted")
            producer = transactional_producer(b, tid)
            producer.init_transactions(30)
            producer.begin_transaction()
            producer.produce(gone, value=b"g0", partition=0)
            producer.commit_transaction(30)
            deadline = time.monotonic() + 30
            while api.get(f"/v1/transactions/{tid}").json()["state"] != "CompleteCommit":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert sc.runtime.copier.open_producers() == 1  # pooled for the next commit
            admin = AdminClient({"bootstrap.servers": b})
            admin.delete_topics([gone], operation_timeout=30)[gone].result(30)
            time.sleep(3)  # the client's reconnect comes within a second or two
            assert [t for t in pulsar_topics(pulsar, namespace) if gone in t] == []
            producer.flush(5)
    finally:
        delete_namespace(pulsar.admin_url, f"public/{namespace}")
