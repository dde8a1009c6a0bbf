"""Roles and Pulsar's permissions on the Kafka listener, through librdkafka.

SASL/PLAIN with a role's token as the password; alice may produce and consume the
data namespace, bob only consume it; root is a superuser. librdkafka raises the
authorization errors to the application (29, 30, 53).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import ListTransactionsRequest
from kafka.protocol.producer import AddOffsetsToTxnRequest, EndTxnRequest, InitProducerIdRequest

from kop_dedup.protocol.records import rec
from tests.helpers import uniq, wait_until
from tests.kafka_admin_wire import list_transactions
from tests.kafka_wire import WireClient, produce_request
from tests.pulsar_grants import KafkaRoles
from tests.roles import ROLES as BASE_ROLES
from tests.roles import kafka_roles, logged_in
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

TTL_MS = 1_000
ROLES = BASE_ROLES + "kop-test-ops:tok-ops\n"


Env = KafkaRoles


@pytest.fixture(scope="module")
def env(pulsar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with kafka_roles(
        pulsar, tmp_path_factory, "ksec", roles=ROLES, auth_permissions_ttl_ms=TTL_MS
    ) as e:
        e.grant("alice", ["produce", "consume"])
        e.grant("bob", ["consume"])
        yield e


def _deliver(producer: Producer, topic: str, value: bytes = b"v") -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    producer.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def _created(env: Env, topic: str) -> None:
    root = Producer(env.conf("tok-root"))
    assert _deliver(root, topic) is None


def test_produce_needs_the_produce_permission(env):
    topic = uniq("kp")
    _created(env, topic)
    alice = Producer(env.conf("tok-alice", **{"enable.idempotence": True}))
    assert _deliver(alice, topic) is None
    bob = Producer(env.conf("tok-bob", **{"message.timeout.ms": 10_000}))
    err = _deliver(bob, topic)
    assert err is not None
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err


def test_another_role_cannot_take_over_a_transactional_id(env):
    tid, topic = uniq("ktx"), uniq("kt")
    _created(env, topic)
    alice = Producer(env.conf("tok-alice", **{"transactional.id": tid}))
    alice.init_transactions(30)
    alice.begin_transaction()
    alice.produce(topic, b"a")
    alice.flush(30)
    bob = Producer(env.conf("tok-bob", **{"transactional.id": tid}))
    with pytest.raises(KafkaException) as raised:
        bob.init_transactions(30)
    assert raised.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    alice.commit_transaction(30)  # not fenced: bob's init did nothing
    root = Producer(env.conf("tok-root", **{"transactional.id": tid}))
    root.init_transactions(30)  # a superuser may fence it


def alice_pid(env: Env, tid: str, url: str | None = None) -> int:
    """The producer id of ``tid``'s transaction, as its owner sees it described."""
    with httpx.Client(
        base_url=url or env.sc.url, headers={"Authorization": "Bearer tok-alice"}, timeout=30
    ) as api:
        return int(api.get(f"/v1/transactions/{tid}").json()["producerId"])


def _wire(env: Env, token: str, bootstrap: str | None = None) -> WireClient:
    return logged_in(bootstrap or env.sc.kafka_bootstrap, token)


def test_another_role_cannot_list_stage_into_or_end_an_open_transaction(env):
    tid, topic = uniq("kwt"), uniq("kwt")
    _created(env, topic)
    path = f"/admin/v2/persistent/{env.namespace}/{topic}/permissions/bob"
    env.admin.post(path, json=["produce"]).raise_for_status()  # bob may produce here
    alice = Producer(env.conf("tok-alice", **{"transactional.id": tid}))
    alice.init_transactions(30)
    alice.begin_transaction()
    alice.produce(topic, b"open")
    alice.flush(30)
    with _wire(env, "tok-bob") as bob, _wire(env, "tok-root") as root:
        listed = list_transactions(bob, version=0).transaction_states
        assert tid not in {t.transactional_id for t in listed}
        listed = list_transactions(root, version=0).transaction_states
        assert tid in {t.transactional_id for t in listed}
        end = EndTxnRequest(transactional_id=tid, producer_id=0, producer_epoch=0, committed=False)
        assert bob.call(end, 1).error_code == 53
        # nor fence it with a batch of its producer id at the highest epoch
        pid = alice_pid(env, tid)
        fence = produce_request(
            topic, 0, [rec(b"x")], producer_id=pid, epoch=32767, base_sequence=0
        )
        answer = bob.call(fence, 9)
        assert answer.responses[0].partition_responses[0].error_code == 31
        stage = AddOffsetsToTxnRequest(
            transactional_id=tid, producer_id=0, producer_epoch=0, group_id=uniq("g")
        )
        assert bob.call(stage, 1).error_code == 53
    alice.commit_transaction(30)  # untouched by bob


def test_a_producer_id_not_yet_handed_out_is_refused(env):
    """Producer ids are handed out in order: a role given N may not write as N+1 (the next
    role given N+1 would have its first records answered 46 and dropped), nor as an id
    far above any handed out."""
    topic = uniq("kforge")
    _created(env, topic)
    with _wire(env, "tok-alice") as alice:
        init = alice.call(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1), 4)
        assert init.error_code == 0
        codes = []
        for pid in (init.producer_id + 1, init.producer_id + 5_000):
            forged = produce_request(
                topic, 0, [rec(b"x")], producer_id=pid, epoch=0, base_sequence=0
            )
            codes.append(alice.call(forged, 9).responses[0].partition_responses[0].error_code)
        assert codes == [59, 59]
        mine = produce_request(
            topic, 0, [rec(b"x")], producer_id=init.producer_id, epoch=0, base_sequence=0
        )
        assert alice.call(mine, 9).responses[0].partition_responses[0].error_code == 0


def test_another_role_cannot_join_or_reset_a_group(env):
    group, topic = uniq("kg"), uniq("kgt")
    _created(env, topic)
    alice = Consumer(env.conf("tok-alice", **{"group.id": group, "auto.offset.reset": "earliest"}))
    alice.subscribe([topic])
    wait_until("alice's record", lambda: _polled(alice), timeout=30)
    alice.commit(asynchronous=False)
    bob = Consumer(env.conf("tok-bob", **{"group.id": group, "auto.offset.reset": "earliest"}))
    bob.subscribe([topic])
    err = wait_until("bob's refusal", lambda: _error_of(bob), timeout=30)
    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, err
    with pytest.raises(KafkaException) as raised:  # a reset is an offset commit
        bob.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    assert raised.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    bob.close()
    for token, sees in (("tok-bob", False), ("tok-alice", True), ("tok-root", True)):
        admin = AdminClient(env.conf(token))
        groups = admin.list_consumer_groups().result(30)
        assert (group in {g.group_id for g in groups.valid}) is sees, token
    alice.close()


def _polled(consumer: Consumer) -> bool:
    msg = consumer.poll(0.5)
    return msg is not None and msg.error() is None


def _error_of(consumer: Consumer) -> KafkaError | None:
    try:
        msg = consumer.poll(0.5)
    except KafkaException as exc:
        return exc.args[0]
    return msg.error() if msg is not None and msg.error() is not None else None


def test_deleting_a_topic_needs_the_admin_role(env):
    topic = uniq("kd")
    _created(env, topic)
    alice, root = AdminClient(env.conf("tok-alice")), AdminClient(env.conf("tok-root"))
    with pytest.raises(KafkaException) as raised:
        alice.delete_topics([topic], operation_timeout=30)[topic].result(30)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    root.delete_topics([topic], operation_timeout=30)[topic].result(30)


def test_the_tenants_admin_role_administers_topics(env):
    topic = uniq("ka")
    tenant = env.admin.get("/admin/v2/tenants/public").json()
    admins = tenant.get("adminRoles") or []
    update = {**tenant, "adminRoles": [*admins, "kop-test-ops"]}
    env.admin.post("/admin/v2/tenants/public", json=update).raise_for_status()
    try:
        ops = AdminClient(env.conf("tok-ops"))
        wait_until("the admin role", lambda: _create(ops, topic), timeout=TTL_MS / 1000 + 10)
        ops.delete_topics([topic], operation_timeout=30)[topic].result(30)
    finally:
        env.admin.post("/admin/v2/tenants/public", json=tenant).raise_for_status()


def _create(admin: AdminClient, topic: str) -> bool:
    """Whether ``admin`` may create ``topic`` (29 while its role is not known as admin)."""
    try:
        admin.create_topics([NewTopic(topic, 2)], operation_timeout=30)[topic].result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise
        return False
    return True


def test_offsets_go_into_a_transaction_only_for_the_groups_owner(env):
    group, topic = uniq("kog"), uniq("kot")
    _created(env, topic)
    alice_in = Consumer(
        env.conf(
            "tok-alice",
            **{"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False},
        )
    )
    alice_in.subscribe([topic])
    wait_until("alice's record", lambda: _polled(alice_in), timeout=30)
    offsets = [TopicPartition(topic, 0, 1)]
    alice = Producer(env.conf("tok-alice", **{"transactional.id": uniq("kot")}))
    alice.init_transactions(30)
    alice.begin_transaction()
    alice.send_offsets_to_transaction(offsets, alice_in.consumer_group_metadata(), 30)
    alice.commit_transaction(30)
    committed = alice_in.committed([TopicPartition(topic, 0)], timeout=30)
    assert committed[0].offset == 1
    bob = Producer(env.conf("tok-bob", **{"transactional.id": uniq("kob")}))
    bob.init_transactions(30)
    bob.begin_transaction()
    with pytest.raises(KafkaException) as raised:
        bob.send_offsets_to_transaction(offsets, alice_in.consumer_group_metadata(), 30)
    assert raised.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    alice_in.close()


def test_a_revoked_grant_refuses_produce_within_the_staleness(env):
    topic = uniq("kr")
    _created(env, topic)
    env.revoke("alice")  # granted again at the end: the last test of the module
    started = time.monotonic()
    producer = Producer(env.conf("tok-alice", **{"message.timeout.ms": 5_000}))

    def refused() -> bool:
        err = _deliver(producer, topic)
        return err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    try:
        wait_until("the revocation", refused, timeout=TTL_MS / 1000 + 10)
        assert time.monotonic() - started < TTL_MS / 1000 + 6
    finally:
        env.grant("alice", ["produce", "consume"])


def test_a_producer_id_handed_out_by_a_forwarded_init_is_its_callers(pulsar, env, tmp_path):
    """Two nodes in sidecar mode: alice's InitProducerId, sent to node 1, is forwarded to
    node 2 (its transactional id's coordinator). The producer id is alice's all the same:
    her transaction commits, and bob may not write as it, nor as the id after it (not
    handed out yet), through either node."""
    roles = tmp_path / "roles"
    roles.write_text(ROLES)
    common: dict[str, Any] = {
        "namespace": env.namespace.split("/", 1)[1],
        "auth_roles_file": roles,
        "auth_tokens": ["tok-nodes"],
        "superuser_roles": "root",
        "auth_permissions_ttl_ms": TTL_MS,
        "cluster_mode": "sidecar",
        "cluster_refresh_ms": 300,
    }
    with ThreadSidecar(pulsar, system_namespace=uniq("sys"), node_id=1, **common) as one:
        with ThreadSidecar(pulsar, cluster_of=one, node_id=2, **common) as two:
            wait_until("two members", lambda: len(one.runtime.cluster.members) == 2)
            wait_until("two members", lambda: len(two.runtime.cluster.members) == 2)
            cluster = one.runtime.cluster
            tid = uniq("kfw")
            while cluster.is_me(cluster.txn_coordinator(tid)):
                tid = uniq("kfw")
            topic = uniq("kfw")
            root = Producer({**env.conf("tok-root"), "bootstrap.servers": one.kafka_bootstrap})
            assert _deliver(root, topic) is None
            env.admin.post(
                f"/admin/v2/persistent/{env.namespace}/{topic}/permissions/bob", json=["produce"]
            ).raise_for_status()
            forwarded = cluster.stats.forwarded
            alice = Producer(
                {
                    **env.conf("tok-alice"),
                    "bootstrap.servers": one.kafka_bootstrap,
                    "transactional.id": tid,
                }
            )
            alice.init_transactions(30)
            assert cluster.stats.forwarded > forwarded  # the init went to node 2
            alice.begin_transaction()
            alice.produce(topic, b"a")
            alice.commit_transaction(30)
            pid = alice_pid(env, tid, one.url)
            codes = []
            for node in (one, two):
                with _wire(env, "tok-bob", node.kafka_bootstrap) as bob:
                    for forged, epoch in ((pid, 32767), (pid + 1, 0)):
                        batch = produce_request(
                            topic, 0, [rec(b"x")], producer_id=forged, epoch=epoch, base_sequence=0
                        )
                        answer = bob.call(batch, 9)
                        codes.append(answer.responses[0].partition_responses[0].error_code)
            del alice, root  # their clients stop before the nodes do
    assert codes == [31, 59] * 2


def test_a_pathological_transactional_id_pattern_stalls_no_client(env):
    # (a+)+b against 27 characters: seconds of backtracking on a backtracking engine,
    # on the listener's event loop (every connection waits), before the owner filter
    tid = "a" * 27
    alice = Producer(env.conf("tok-alice", **{"transactional.id": tid}))
    alice.init_transactions(30)
    evil = ListTransactionsRequest(
        state_filters=[],
        producer_id_filters=[],
        duration_filter=-1,
        transactional_id_pattern="(a+)+b",
    )
    with _wire(env, "tok-root") as root, _wire(env, "tok-bob") as bob:
        started = time.monotonic()
        root.send(evil, 2)
        listed = list_transactions(bob, 2, pattern="(a+)+b")  # another client meanwhile
        assert time.monotonic() - started < 1.0, "a client waited for another's pattern"
        assert (listed.error_code, listed.transaction_states) == (0, [])
        _, answer = root.receive(evil, 2)
        assert time.monotonic() - started < 1.0
        assert (answer.error_code, answer.transaction_states) == (0, [])
        listed = list_transactions(root, 2, pattern="(a+)+")
        assert tid in {t.transactional_id for t in listed.transaction_states}
        lookbehind = list_transactions(root, 2, pattern="(?<=a)a+")
        assert lookbehind.error_code == 42  # INVALID_REQUEST: RE2 has no lookaround
        assert list_transactions(root, 2, pattern="(a+").error_code == 128
