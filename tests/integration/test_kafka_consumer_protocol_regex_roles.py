"""A KIP-848 subscription with authentication on. By regular expression: the coordinator
matches only the topics the member's role may describe (Kafka filters the resolution by
DESCRIBE; here: produce or consume granted in Pulsar), so carol, granted consume on two
of three matching topics, is assigned those two; a superuser's member of another group,
the same expression, all three. By names: a heartbeat whose SubscribedTopicNames hold a
topic the role may not describe is TOPIC_AUTHORIZATION_FAILED (29) whole, as Kafka 4.1
answers it; compared field by field with a reference Kafka 4.1 started with an
authorizer (StandardAuthorizer, carol logging in with SASL/PLAIN, allowed READ on her
groups and DESCRIBE on one topic by ACLs)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kop_dedup.transports.kafka.schemas import ConsumerGroupHeartbeatRequest
from kop_dedup_tools.kafka_broker import LocalKafka
from kop_dedup_tools.processes import free_port
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


# -- SubscribedTopicNames: DESCRIBE on each, else 29 -------------------------------------


@dataclass
class AclKafka(LocalKafka):
    """The reference Kafka with Kafka's authorizer: PLAINTEXT for the broker itself and
    the test's admin (ANONYMOUS, a superuser), SASL_PLAINTEXT with PLAIN for carol."""

    sasl_port: int = field(default_factory=free_port)

    def server_properties(self) -> dict[str, str]:
        props = super().server_properties()
        sasl = f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
        return {
            **props,
            "listeners": f"{props['listeners']},{sasl}",
            "advertised.listeners": f"{props['advertised.listeners']},{sasl}",
            "listener.security.protocol.map": (
                f"{props['listener.security.protocol.map']},SASL_PLAINTEXT:SASL_PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                'user_carol="tok-carol";'
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
        }


@pytest.fixture(scope="module")
def acl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclKafka]:
    kafka = AclKafka.throwaway(tmp_path_factory.mktemp("acl-kafka-logs"))
    try:
        kafka.start(timeout=180)
        yield kafka
    finally:
        kafka.wipe(timeout=30)


def _carol_on_kafka(kafka: AclKafka) -> WireClient:
    c = WireClient(f"127.0.0.1:{kafka.sasl_port}")
    assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
    auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0carol\0tok-carol"), 1)
    assert auth.error_code == 0, auth
    return c


def _allow_carol(kafka: AclKafka, prefix: str, topic: str) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    def allow(kind: Any, name: str, pattern: Any, op: Any) -> Any:
        return AclBinding(kind, name, pattern, "User:carol", "*", op, AclPermissionType.ALLOW)

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    bindings = [
        allow(ResourceType.GROUP, prefix, ResourcePatternType.PREFIXED, AclOperation.READ),
        allow(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, AclOperation.DESCRIBE),
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def _coordinators(kafka: AclKafka, groups: list[str]) -> None:
    """Kafka creates its offsets topic at the first FindCoordinator (asked here as the
    superuser): until then its heartbeats answer 16."""
    with WireClient(kafka.bootstrap) as c:
        for group in groups:
            deadline = time.monotonic() + 60
            while c.call(FindCoordinatorRequest(key=group, key_type=0), 2).error_code:
                assert time.monotonic() < deadline, f"no coordinator for {group}"
                time.sleep(0.3)


def _named_beat(
    c: WireClient, group: str, names: list[str], retry: tuple[int, ...] = (14, 15, 16)
) -> tuple[Any, ...]:
    """A join subscribing to ``names``: the answer's code and message, and whether it
    has a member id, a positive epoch and interval, an assignment; asked again while
    its code is one of ``retry`` (a minute at most)."""
    deadline = time.monotonic() + 60
    while True:
        answer = c.call(
            ConsumerGroupHeartbeatRequest(
                group_id=group,
                member_id=str(uuid.uuid4())[:22],
                member_epoch=0,
                instance_id=None,
                rack_id=None,
                rebalance_timeout_ms=30_000,
                subscribed_topic_names=names,
                subscribed_topic_regex=None,
                server_assignor=None,
                topic_partitions=[],
            ),
            1,
        )
        if answer.error_code not in retry or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    return (
        answer.error_code,
        answer.error_message,
        answer.member_id is not None,
        answer.member_epoch > 0,
        answer.heartbeat_interval_ms > 0,
        answer.assignment is not None,  # its partitions: Kafka's may lag its metadata
    )


def _names_scenario(c: WireClient, prefix: str, mine: str, other: str) -> dict[str, Any]:
    return {
        # first, until Kafka's authorizer has the ACLs just created
        "described": _named_beat(c, f"{prefix}-g1", [mine], (14, 15, 16, 29, 30)),
        "one_not_described": _named_beat(c, f"{prefix}-g2", [mine, other]),
        "twice_named": _named_beat(c, f"{prefix}-g3", [mine, mine]),
    }


def test_subscribed_topic_names_the_role_may_not_describe_are_29(
    env: KafkaRoles, acl_kafka: AclKafka
) -> None:
    prefix = uniq("nmr")
    mine, other = f"{prefix}-mine", f"{prefix}-other"
    for admin in (
        AdminClient(env.conf("tok-root")),
        AdminClient({"bootstrap.servers": acl_kafka.bootstrap}),
    ):
        futures = admin.create_topics([NewTopic(mine, 2, 1), NewTopic(other, 1, 1)])
        for future in futures.values():
            future.result(timeout=30)
    env.grant("carol", ["consume"], topic=mine)
    _allow_carol(acl_kafka, prefix, mine)
    _coordinators(acl_kafka, [f"{prefix}-g{n}" for n in (1, 2, 3)])
    with logged_in(env.sc.kafka_bootstrap, "tok-carol") as carol:
        ours = _names_scenario(carol, prefix, mine, other)
    with _carol_on_kafka(acl_kafka) as carol:
        theirs = _names_scenario(carol, prefix, mine, other)
    print(f"\nlistener: {ours}\nkafka:    {theirs}")
    assert theirs["one_not_described"] == (29, None, False, False, False, False)
    assert theirs["described"][0] == 0
    assert ours == theirs
