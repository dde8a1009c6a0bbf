"""What each Kafka request is checked for (issue 30, item 2): the names the checks read
are the request classes' own (a misspelt field would fail only for a non-superuser)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.protocol.admin import DeleteTopicsRequest, DescribeConfigsRequest
from kafka.protocol.consumer import FetchRequest, OffsetFetchRequest
from kafka.protocol.producer import AddPartitionsToTxnRequest, TxnOffsetCommitRequest

from kop_dedup import errors
from kop_dedup.protocol.records import rec
from kop_dedup.security.identity import ANONYMOUS, Identity
from kop_dedup.transports.kafka.authorize import authorize
from kop_dedup.transports.kafka.schemas import ConsumerGroupHeartbeatRequest
from tests.kafka_wire import produce_request

ALICE = Identity("alice")


class Recorder:
    """An authorizer that records every question and allows all but ``refuse``."""

    def __init__(self, refuse: str = "") -> None:
        self.asked: list[tuple[Any, ...]] = []
        self.refuse = refuse

    async def require(self, who, action, topics):
        topics = list(topics)
        self.asked.append(("topics", action, topics))
        if self.refuse in topics:
            raise errors.TopicAuthorizationFailed(self.refuse)

    async def may_each(self, who, action, topics):
        topics = list(topics)
        self.asked.append(("each", action, topics))
        return {t: t != self.refuse for t in topics}

    async def require_txn(self, who, tid, *, claim=True):
        self.asked.append(("txn", tid, claim))

    async def require_group(self, who, group, *, claim=True):
        self.asked.append(("group", group, claim))

    async def require_producers(self, who, pids):
        self.asked.append(("pids", sorted(pids)))

    async def require_admin(self, who, what, error):
        self.asked.append(("admin", what))
        raise error(what)


def check(key: int, request: Any, version: int = 0, who: Identity = ALICE, **kw: Any) -> Recorder:
    recorder = Recorder(**kw)
    session = SimpleNamespace(
        identity=who, forwarded=False, runtime=SimpleNamespace(authorizer=recorder)
    )
    asyncio.run(authorize(session, key, request, version))  # type: ignore[arg-type]
    return recorder


def test_produce_checks_the_transactional_id_every_topic_and_the_batches_producer_ids():
    request = produce_request("a", 0, [rec(b"v")], producer_id=7, epoch=0, base_sequence=0)
    request.transactional_id = "tx"
    assert check(0, request, 9).asked == [
        ("txn", "tx", True),
        ("topics", "produce", ["a"]),
        ("pids", [7]),
    ]


def test_fetch_needs_consume_on_its_topics():
    request = FetchRequest(topics=[FetchRequest.FetchTopic(topic="t", partitions=[])])
    assert check(1, request, 12).asked == [("topics", "consume", ["t"])]


def test_offset_fetch_of_several_groups_looks_at_each_without_claiming():
    group = OffsetFetchRequest.OffsetFetchRequestGroup
    request = OffsetFetchRequest(
        groups=[
            group(
                group_id="g",
                topics=[group.OffsetFetchRequestTopics(name="t", partition_indexes=[0])],
            )
        ]
    )
    assert check(9, request, 8).asked == [("group", "g", False), ("topics", "consume", ["t"])]


def test_add_partitions_and_txn_offset_commit_name_their_id_group_and_topics():
    add = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="tx",
        v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[
            AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="a", partitions=[0])
        ],
    )
    assert check(24, add, 3).asked == [("txn", "tx", True), ("topics", "produce", ["a"])]
    commit = TxnOffsetCommitRequest(
        transactional_id="tx",
        group_id="g",
        producer_id=1,
        producer_epoch=0,
        topics=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name="a", partitions=[])],
    )
    assert check(28, commit, 3).asked == [
        ("txn", "tx", True),
        ("group", "g", True),
        ("topics", "consume", ["a"]),
    ]


def test_deleting_topics_needs_the_admin_role_in_both_layouts():
    old = DeleteTopicsRequest(topic_names=["a"], timeout_ms=1000)
    new = DeleteTopicsRequest(topics=[DeleteTopicsRequest.DeleteTopicState(name="a")])
    for request, version in ((old, 5), (new, 6)):
        with pytest.raises(errors.TopicAuthorizationFailed):
            check(20, request, version)


def test_describe_configs_needs_to_see_the_topic_not_the_broker():
    resource = DescribeConfigsRequest.DescribeConfigsResource
    request = DescribeConfigsRequest(
        resources=[
            resource(resource_type=2, resource_name="t"),
            resource(resource_type=4, resource_name="0"),
        ]
    )
    assert check(32, request).asked == [("topics", "describe", ["t"])]


def test_a_superuser_or_a_forwarded_request_is_not_asked():
    request = FetchRequest(topics=[FetchRequest.FetchTopic(topic="t", partitions=[])])
    assert check(1, request, 12, who=ANONYMOUS).asked == []


def _heartbeat(names: list[str] | None, regex: str | None = None) -> Any:
    return ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="m",
        member_epoch=0,
        instance_id=None,
        rack_id=None,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=names,
        subscribed_topic_regex=regex,
        server_assignor=None,
        topic_partitions=[],
    )


def test_consumer_group_heartbeat_needs_describe_on_each_subscribed_name():
    """Kafka 4.1's ``handleConsumerGroupHeartbeat``: the group first, then DESCRIBE on
    the set of a non-empty SubscribedTopicNames, one refused: 29 for the heartbeat."""
    assert check(68, _heartbeat(["b", "a", "b"])).asked == [
        ("group", "g", True),
        ("each", "describe", ["a", "b"]),
    ]
    with pytest.raises(errors.TopicAuthorizationFailed):
        check(68, _heartbeat(["a", "secret"]), refuse="secret")


def test_consumer_group_heartbeat_without_names_asks_only_for_the_group():
    for request in (_heartbeat(None), _heartbeat([]), _heartbeat([], regex="s.*")):
        assert check(68, request).asked == [("group", "g", True)]
