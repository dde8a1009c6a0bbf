"""A topic named with ``..`` or ``/`` (``../../acme/pay/ledger``: another tenant's topic
once httpx collapses the dots) in every place a topic is accepted, over HTTP and the
Kafka wire: refused, nothing stored, and no Pulsar admin call made (every admin request
line passes a recording proxy in front of the real broker's admin API)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
)
from kafka.protocol.consumer import (
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
)
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)

from kop_dedup import errors
from kop_dedup.protocol.records import rec
from tests.helpers import uniq
from tests.integration.kafka_consume import fetch_request
from tests.kafka_wire import WireClient, produce_request
from tests.sidecar import ThreadSidecar
from tests.tcp_proxy import RecordingProxy

pytestmark = pytest.mark.integration

HOSTILE = ["../../acme/pay/ledger", "..", "a/b", "%2e%2e", "x/../../y", "."]


@pytest.fixture(scope="module")
def watched(pulsar) -> Iterator[tuple[ThreadSidecar, RecordingProxy]]:
    upstream = pulsar.admin_url.removeprefix("http://").rstrip("/")
    with RecordingProxy(upstream) as proxy:
        broker = SimpleNamespace(service_url=pulsar.service_url, admin_url=proxy.url)
        with ThreadSidecar(broker, system_namespace=uniq("sys")) as sc:
            yield sc, proxy


def _no_admin_call_for(proxy: RecordingProxy, before: int) -> None:
    asked = proxy.requests[before:]
    leaked = [r for r in asked if "acme" in r or ".." in r or "%2e" in r.lower() or "/a/b" in r]
    assert leaked == [], leaked


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize("topic", HOSTILE)
def test_http_refuses_the_name_everywhere_without_an_admin_call(watched, topic):
    sc, proxy = watched
    before = len(proxy.requests)
    group = uniq("g")
    with httpx.Client(base_url=sc.url, timeout=30) as api:
        init = api.post("/v1/init-producer-id", json={"transactionalId": uniq("tx")}).json()
        assert init["errorCode"] == 0
        pid, epoch = init["producerId"], init["producerEpoch"]
        batch = {
            "topic": topic,
            "partition": 0,
            "producerId": -1,
            "producerEpoch": -1,
            "baseSequence": -1,
            "lastSequence": -1,
            "records": [{"value": _b64(b"v")}],
        }
        produced = api.post("/v1/produce", json={"batches": [batch]})
        results = produced.json().get("results") or []
        assert produced.status_code >= 400 or results[0]["errorCode"] != 0, produced.text
        offsets = [{"topic": topic, "partition": 0, "offset": 5}]
        committed = api.post(f"/v1/groups/{group}/offsets", json={"offsets": offsets})
        assert committed.status_code >= 400 or committed.json()["errorCode"] != 0
        staged = api.post(
            "/v1/txn-offset-commit",
            json={
                "transactionalId": init.get("transactionalId") or uniq("tx"),
                "producerId": pid,
                "producerEpoch": epoch,
                "groupId": group,
                "offsets": offsets,
            },
        )
        assert staged.status_code >= 400 or staged.json()["errorCode"] != 0, staged.text
        joined = api.post(f"/v1/groups/{uniq('hg')}/members", json={"topics": [topic]})
        assert joined.status_code >= 400, joined.text
        reset = api.post(f"/v1/groups/{group}/reset", json={"topic": topic, "to": "earliest"})
        assert reset.status_code >= 400, reset.text
        member = api.post(f"/v1/groups/{group}/members", json={"topics": [_real_topic(sc)]})
        assert member.status_code == 200, member.text
        member_id = member.json()["memberId"]
        commit = api.post(
            f"/v1/groups/{group}/members/{member_id}/commit",
            json={"offsets": [{"topic": topic, "partition": 0, "offset": 1}]},
        )
        assert commit.status_code >= 400 or commit.json()["errorCode"] != 0, commit.text
        stored = api.get(f"/v1/groups/{group}/offsets")
        assert topic not in stored.text  # nothing of it stored
    _no_admin_call_for(proxy, before)


_REAL: dict[str, str] = {}


def _real_topic(sc: ThreadSidecar) -> str:
    """A topic that exists (created once), for a member to join."""
    if "topic" not in _REAL:
        topic = uniq("real")
        with WireClient(sc.kafka_bootstrap) as c:
            created = CreateTopicsRequest.CreatableTopic(
                name=topic, num_partitions=1, replication_factor=1, assignments=[], configs=[]
            )
            answer = c.call(
                CreateTopicsRequest(topics=[created], timeout_ms=30000, validate_only=False), 5
            )
            assert answer.topics[0].error_code == 0
        _REAL["topic"] = topic
    return _REAL["topic"]


def _codes(answer: Any) -> list[int]:
    from kop_dedup.transports.kafka import codec

    return list(codec.error_codes(answer))


@pytest.mark.parametrize("topic", HOSTILE)
def test_the_kafka_wire_refuses_the_name_everywhere_without_an_admin_call(watched, topic):
    sc, proxy = watched
    before = len(proxy.requests)
    group, tid = uniq("g"), uniq("tx")
    with WireClient(sc.kafka_bootstrap) as c:
        init = c.call(InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60000), 1)
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        calls: list[tuple[str, Any, int]] = [
            ("Produce", produce_request(topic, 0, [rec(b"v")]), 9),
            (
                "Metadata",
                MetadataRequest(
                    topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                    allow_auto_topic_creation=True,
                ),
                9,
            ),
            (
                "Fetch",
                fetch_request(topic, {0: 0}, max_wait_ms=0, max_bytes=1 << 20),
                11,
            ),
            (
                "ListOffsets",
                ListOffsetsRequest(
                    replica_id=-1,
                    isolation_level=0,
                    topics=[
                        ListOffsetsRequest.ListOffsetsTopic(
                            name=topic,
                            partitions=[
                                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                                    partition_index=0, current_leader_epoch=-1, timestamp=-1
                                )
                            ],
                        )
                    ],
                ),
                5,
            ),
            (
                "OffsetCommit",
                OffsetCommitRequest(
                    group_id=group,
                    generation_id_or_member_epoch=-1,
                    member_id="",
                    retention_time_ms=-1,
                    topics=[
                        OffsetCommitRequest.OffsetCommitRequestTopic(
                            name=topic,
                            partitions=[
                                OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                    partition_index=0,
                                    committed_offset=5,
                                    committed_leader_epoch=-1,
                                    committed_metadata="",
                                )
                            ],
                        )
                    ],
                ),
                8,
            ),
            (
                "AddPartitionsToTxn",
                AddPartitionsToTxnRequest(
                    v3_and_below_transactional_id=tid,
                    v3_and_below_producer_id=pid,
                    v3_and_below_producer_epoch=epoch,
                    v3_and_below_topics=[
                        AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(
                            name=topic, partitions=[0]
                        )
                    ],
                ),
                0,
            ),
            (
                "TxnOffsetCommit",
                TxnOffsetCommitRequest(
                    transactional_id=tid,
                    group_id=group,
                    producer_id=pid,
                    producer_epoch=epoch,
                    topics=[
                        TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
                            name=topic,
                            partitions=[
                                TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                                    partition_index=0,
                                    committed_offset=5,
                                    committed_metadata="",
                                )
                            ],
                        )
                    ],
                ),
                0,
            ),
            (
                "CreateTopics",
                CreateTopicsRequest(
                    topics=[
                        CreateTopicsRequest.CreatableTopic(
                            name=topic,
                            num_partitions=1,
                            replication_factor=1,
                            assignments=[],
                            configs=[],
                        )
                    ],
                    timeout_ms=30000,
                    validate_only=False,
                ),
                5,
            ),
            (
                "CreatePartitions",
                CreatePartitionsRequest(
                    topics=[
                        CreatePartitionsRequest.CreatePartitionsTopic(
                            name=topic, count=3, assignments=None
                        )
                    ],
                    timeout_ms=30000,
                    validate_only=False,
                ),
                1,
            ),
            (
                "DeleteRecords",
                DeleteRecordsRequest(
                    topics=[
                        DeleteRecordsRequest.DeleteRecordsTopic(
                            name=topic,
                            partitions=[
                                DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(
                                    partition_index=0, offset=1
                                )
                            ],
                        )
                    ],
                    timeout_ms=30000,
                ),
                1,
            ),
            (
                "DescribeConfigs",
                DescribeConfigsRequest(
                    resources=[
                        DescribeConfigsRequest.DescribeConfigsResource(
                            resource_type=2, resource_name=topic, configuration_keys=None
                        )
                    ],
                    include_synonyms=False,
                ),
                1,
            ),
            (
                "AlterConfigs",
                AlterConfigsRequest(
                    resources=[
                        AlterConfigsRequest.AlterConfigsResource(
                            resource_type=2,
                            resource_name=topic,
                            configs=[
                                AlterConfigsRequest.AlterConfigsResource.AlterableConfig(
                                    name="retention.ms", value="1000"
                                )
                            ],
                        )
                    ],
                    validate_only=False,
                ),
                1,
            ),
            (
                "DeleteTopics",
                DeleteTopicsRequest(topic_names=[topic], timeout_ms=30000),
                3,
            ),
        ]
        for name, request, version in calls:
            answer = c.call(request, version)
            codes = _codes(answer)
            assert codes, f"{name}: no error code in {answer}"
            # the one topic (or partition) it names is refused
            assert any(code != errors.NONE_ERRNO for code in codes), f"{name}: {answer}"
        fetched = c.call(
            OffsetFetchRequest(
                group_id=group,
                topics=[
                    OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])
                ],
            ),
            5,
        )
        assert fetched.topics[0].partitions[0].committed_offset == -1  # nothing stored
    _no_admin_call_for(proxy, before)


@pytest.mark.parametrize("group", ["x" * 4097])
def test_a_group_id_past_the_rules_is_refused_before_anything_is_stored(watched, group):
    from tests.kafka_group_wire import commit

    sc, _ = watched
    with WireClient(sc.kafka_bootstrap) as c:
        assert commit(c, group, _real_topic(sc), "", -1) == 24  # INVALID_GROUP_ID
    with httpx.Client(base_url=sc.url, timeout=30) as api:
        path = "/v1/groups/" + quote(group, safe="")
        joined = api.post(f"{path}/members", json={"topics": [_real_topic(sc)]})
        assert joined.status_code == 400, joined.text
        assert joined.json()["errorCode"] == 24
