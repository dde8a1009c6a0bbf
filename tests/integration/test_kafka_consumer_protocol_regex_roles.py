"""A KIP-848 subscription by regular expression with authentication on: the coordinator
matches only the topics the member's role may describe (Kafka filters the resolution by
DESCRIBE; here: produce or consume granted in Pulsar), so carol, granted consume on two
of three matching topics, is assigned those two; a superuser's member of another group,
the same expression, all three."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest

from kop_dedup.transports.kafka.schemas import ConsumerGroupHeartbeatRequest
from tests.helpers import uniq
from tests.kafka_wire import WireClient
from tests.pulsar_grants import KafkaRoles
from tests.roles import kafka_roles, logged_in

pytestmark = pytest.mark.integration

ROLES = "carol:tok-carol\nroot:tok-root\n"


@pytest.fixture(scope="module")
def env(pulsar: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaRoles]:
    with kafka_roles(
        pulsar, tmp_path_factory, "krx", roles=ROLES, auth_permissions_ttl_ms=1_000
    ) as e:
        yield e


def _joined(c: WireClient, group: str, regex: str, names: dict[Any, str]) -> list[Any]:
    mid = str(uuid.uuid4())[:22]
    deadline = time.monotonic() + 60
    while True:
        answer = c.call(
            ConsumerGroupHeartbeatRequest(
                group_id=group,
                member_id=mid,
                member_epoch=0,
                instance_id=None,
                rack_id=None,
                rebalance_timeout_ms=30_000,
                subscribed_topic_names=[],
                subscribed_topic_regex=regex,
                server_assignor=None,
                topic_partitions=[],
            ),
            1,
        )
        if answer.error_code not in (14, 15, 16) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert answer.error_code == 0, answer
    return sorted(
        (names[tp.topic_id], p) for tp in answer.assignment.topic_partitions for p in tp.partitions
    )


def test_regex_matches_only_the_topics_the_role_may_describe(env: KafkaRoles) -> None:
    prefix = uniq("rxr")
    topics = {f"{prefix}-a1": 2, f"{prefix}-a2": 1, f"{prefix}-b1": 1}
    admin = AdminClient(env.conf("tok-root"))
    for future in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).values():
        future.result(timeout=30)
    env.grant("carol", ["consume"], topic=f"{prefix}-a1")
    env.grant("carol", ["consume"], topic=f"{prefix}-b1")
    with (
        logged_in(env.sc.kafka_bootstrap, "tok-root") as root,
        logged_in(env.sc.kafka_bootstrap, "tok-carol") as carol,
    ):
        t = MetadataRequest.MetadataRequestTopic
        meta = root.call(MetadataRequest(topics=[t(name=n, topic_id=None) for n in topics]), 12)
        names = {m.topic_id: m.name.removeprefix(prefix) for m in meta.topics}
        regex = f"{prefix}-.*"
        assert _joined(carol, f"{prefix}-carol", regex, names) == [
            ("-a1", 0),
            ("-a1", 1),
            ("-b1", 0),
        ]
        assert _joined(root, f"{prefix}-root", regex, names) == [
            ("-a1", 0),
            ("-a1", 1),
            ("-a2", 0),
            ("-b1", 0),
        ]
