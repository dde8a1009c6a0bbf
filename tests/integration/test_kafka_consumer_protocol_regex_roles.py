"""A KIP-848 subscription by regular expression with authentication on: the coordinator
matches only the topics the member's role may describe (Kafka filters the resolution by
DESCRIBE; here: produce or consume granted in Pulsar), so carol, granted consume on two
of three matching topics, is assigned those two; a superuser's member of another group,
the same expression, all three."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kop_dedup.transports.kafka.schemas import ConsumerGroupHeartbeatRequest
from tests.helpers import delete_namespace, uniq
from tests.kafka_wire import WireClient
from tests.pulsar_grants import KafkaRoles
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

ROLES = "carol:tok-carol\nroot:tok-root\n"


@pytest.fixture(scope="module")
def env(pulsar: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaRoles]:
    roles: Path = tmp_path_factory.mktemp("rxroles") / "roles"
    roles.write_text(ROLES)
    namespace = uniq("krx")
    with (
        httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin,
        ThreadSidecar(
            pulsar,
            namespace=namespace,
            system_namespace=uniq("sys"),
            auth_roles_file=roles,
            superuser_roles="root",
            auth_permissions_ttl_ms=1_000,
        ) as sc,
    ):
        yield KafkaRoles(sc, f"public/{namespace}", admin)
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


def _login(env: KafkaRoles, token: str) -> WireClient:
    c = WireClient(env.sc.kafka_bootstrap)
    assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
    assert c.call(SaslAuthenticateRequest(auth_bytes=b"\0u\0" + token.encode()), 1).error_code == 0
    return c


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
    with _login(env, "tok-root") as root, _login(env, "tok-carol") as carol:
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
