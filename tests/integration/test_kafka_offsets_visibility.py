"""OffsetFetch of every topic shows only the topics the caller may read (issue 36, item 9).

Kafka answers OffsetFetch without topics (all of the group's offsets) with the topics
the caller is authorized on and leaves the others out; a role that may consume one
topic must not learn the offsets a superuser committed in its group on another.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from tests.helpers import delete_namespace, uniq
from tests.kafka_wire import WireClient
from tests.pulsar_grants import KafkaRoles
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

ROLES = "carol:tok-carol\nroot:tok-root\n"


Env = KafkaRoles


@pytest.fixture(scope="module")
def env(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    roles: Path = tmp_path_factory.mktemp("offroles") / "roles"
    roles.write_text(ROLES)
    namespace = uniq("koffv")
    with (
        httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin,
        ThreadSidecar(
            pulsar,
            namespace=namespace,
            system_namespace=uniq("sys"),
            auth_roles_file=roles,
            superuser_roles="root",
            auth_permissions_ttl_ms=500,
        ) as sc,
    ):
        yield Env(sc, f"public/{namespace}", admin)
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


def _created(env: Env, topic: str) -> None:
    root = Producer(env.conf("tok-root"))
    outcome: list[Any] = []
    root.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
    root.flush(30)
    assert outcome == [None]


def _commit(admin: AdminClient, group: str, tp: TopicPartition) -> None:
    (future,) = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [tp])]
    ).values()
    future.result(30)


def _offsets(admin: AdminClient, group: str) -> dict[str, int]:
    (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    return {tp.topic: tp.offset for tp in future.result(30).topic_partitions}


def _wire_offsets(env: Env, token: str, group: str, version: int) -> set[str]:
    """The topics an OffsetFetch without topics answers, at ``version`` (v1-7: one group
    at the top level; v8+: per group)."""
    with WireClient(env.sc.kafka_bootstrap) as c:
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0u\0" + token.encode()), 1)
        assert auth.error_code == 0
        if version >= 8:
            g = OffsetFetchRequest[version].OffsetFetchRequestGroup(group_id=group, topics=None)
            answer = c.call(OffsetFetchRequest[version](groups=[g], require_stable=False), version)
            (one,) = answer.groups
            return {t.name for t in one.topics}
        answer = c.call(
            OffsetFetchRequest[version](group_id=group, topics=None, require_stable=False), version
        )
        return {t.name for t in answer.topics}


def test_offsets_of_every_topic_leave_out_the_topics_the_role_may_not_consume(env):
    readable, hidden, group = uniq("kov"), uniq("koh"), uniq("kog")
    _created(env, readable)
    _created(env, hidden)
    env.grant("carol", ["consume"], topic=readable)
    carol, root = AdminClient(env.conf("tok-carol")), AdminClient(env.conf("tok-root"))
    _commit(carol, group, TopicPartition(readable, 0, 1))  # carol's group from now on
    _commit(root, group, TopicPartition(hidden, 0, 2))  # a superuser commits in it
    assert _offsets(root, group) == {readable: 1, hidden: 2}
    assert _offsets(carol, group) == {readable: 1}
    for version in (2, 7, 8):
        assert _wire_offsets(env, "tok-carol", group, version) == {readable}, version
    assert _wire_offsets(env, "tok-root", group, 7) == {readable, hidden}
