"""Kafka 4.1's ``kafka-acls`` and ``kafka-log-dirs`` as judges of the ACL APIs and
DescribeLogDirs, run from the Kafka jars against the listener (with roles, and without
authentication) and against the reference Kafka broker where the cases compare (no
authorizer there: SECURITY_DISABLED). What the ACLs did is checked in Pulsar's own
permissions and by a client that then may (or may not) use them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Producer
from kafka.protocol.admin import (
    CreateAclsRequest,
    DeleteAclsRequest,
    DescribeAclsRequest,
    DescribeLogDirsRequest,
)

from tests.helpers import delete_namespace, uniq, wait_until
from tests.kafka_cli import ACLS, LOG_DIRS, ToolResult, run_tools
from tests.kafka_wire import WireClient
from tests.pulsar_grants import KafkaRoles
from tests.roles import kafka_roles, logged_in
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def roles(pulsar: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaRoles]:
    with kafka_roles(pulsar, tmp_path_factory, "kacl", auth_permissions_ttl_ms=500) as env:
        yield env


def _login(tmp_path: Path, token: str) -> list[str]:
    """``--command-config`` of a tool logging in with ``token`` (SASL/PLAIN)."""
    props = tmp_path / f"{token}.properties"
    props.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="u" password="{token}";\n'
    )
    return ["--command-config", str(props)]


def _deliver(conf: dict[str, Any], topic: str) -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    producer = Producer({**conf, "message.timeout.ms": 10_000})
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def _topic_grants(env: KafkaRoles, topic: str) -> dict[str, list[str]]:
    resp = env.admin.get(f"/admin/v2/persistent/{env.namespace}/{topic}/permissions")
    resp.raise_for_status()
    return {role: sorted(actions) for role, actions in resp.json().items()}


def _ok(*results: ToolResult) -> None:
    for r in results:
        assert r.exit == 0, (r.argv, r.text, r.error_text)


def test_kafka_acls_read_and_write_pulsars_permissions(roles, tmp_path):
    env = roles
    topic, group, tid = uniq("acl-t"), uniq("acl-g"), uniq("acl-x")
    assert _deliver(env.conf("tok-root"), topic) is None  # the topic exists
    s = ["--bootstrap-server", env.sc.kafka_bootstrap, *_login(tmp_path, "tok-root")]
    alice = ["--allow-principal", "User:alice"]
    done = run_tools(
        [
            (ACLS, [*s, "--add", *alice, "--operation", "Write", "--topic", topic]),
            (
                ACLS,
                [
                    *s,
                    "--add",
                    "--allow-principal",
                    "User:bob",
                    "--consumer",
                    "--topic",
                    topic,
                    "--group",
                    group,
                ],
            ),
            (ACLS, [*s, "--add", *alice, "--operation", "Write", "--transactional-id", tid]),
            (ACLS, [*s, "--list", "--topic", topic]),
            (ACLS, [*s, "--list", "--group", group]),
            (
                ACLS,
                [
                    *s,
                    "--add",
                    "--deny-principal",
                    "User:bob",
                    "--operation",
                    "Write",
                    "--topic",
                    topic,
                ],
            ),
            (ACLS, [*s, "--add", *alice, "--operation", "Alter", "--topic", topic]),
            (
                ACLS,
                [
                    *s,
                    "--add",
                    "--allow-principal",
                    "User:bob",
                    "--operation",
                    "Read",
                    "--group",
                    group + "-p",
                    "--resource-pattern-type",
                    "prefixed",
                ],
            ),
        ],
        tmp_path,
    )
    add_alice, add_bob, add_txn, listed, listed_group, deny, alter, prefixed = done
    _ok(add_alice, add_bob, add_txn, listed, listed_group)
    assert _topic_grants(env, topic) == {"alice": ["produce"], "bob": ["consume"]}
    text = listed.text
    assert f"name={topic}, patternType=LITERAL" in text
    for principal, operation in (("alice", "WRITE"), ("bob", "READ"), ("bob", "DESCRIBE")):
        entry = f"principal=User:{principal}, host=*, operation={operation}, "
        assert f"({entry}permissionType=ALLOW)" in text, text
    assert "principal=User:bob, host=*, operation=READ" in listed_group.text
    for refused, why in (
        (deny, "DENY cannot be expressed"),
        (alter, "tenant's admin role"),
        (prefixed, "LITERAL only"),
    ):
        assert refused.exit != 0, refused.argv
        assert why in refused.text + refused.error_text, (refused.text, refused.error_text)
    # the grants take effect: alice now may produce (she had nothing before)
    wait_until("alice may produce", lambda: _deliver(env.conf("tok-alice"), topic) is None)

    done = run_tools(
        [
            (ACLS, [*s, "--remove", "--force", *alice, "--operation", "Write", "--topic", topic]),
            (
                ACLS,
                [
                    *s,
                    "--remove",
                    "--force",
                    "--allow-principal",
                    "User:bob",
                    "--consumer",
                    "--topic",
                    topic,
                    "--group",
                    group,
                ],
            ),
            (ACLS, [*s, "--list", "--topic", topic]),
            (ACLS, [*s, "--list", "--principal", "User:alice"]),
            (
                ACLS,
                [
                    "--bootstrap-server",
                    env.sc.kafka_bootstrap,
                    *_login(tmp_path, "tok-alice"),
                    "--list",
                ],
            ),
        ],
        tmp_path,
    )
    removed_alice, removed_bob, after, alices, as_alice = done
    _ok(removed_alice, removed_bob, after, alices)
    assert _topic_grants(env, topic) == {}
    assert "principal=User:" not in after.text, after.text
    assert f"name={tid}, patternType=LITERAL" in alices.text  # the id she owns
    assert as_alice.exit != 0
    assert "ClusterAuthorization" in as_alice.text + as_alice.error_text
    err = _deliver(env.conf("tok-alice"), uniq("acl-none"))
    assert err is not None
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _acl_commands(bootstrap: str, topic: str) -> list[tuple[str, list[str]]]:
    s = ["--bootstrap-server", bootstrap]
    return [
        (ACLS, [*s, "--list"]),
        (
            ACLS,
            [
                *s,
                "--add",
                "--allow-principal",
                "User:alice",
                "--operation",
                "Read",
                "--topic",
                topic,
            ],
        ),
        (
            ACLS,
            [
                *s,
                "--remove",
                "--force",
                "--allow-principal",
                "User:alice",
                "--operation",
                "Read",
                "--topic",
                topic,
            ],
        ),
    ]


def _error_line(result: ToolResult) -> str:
    return next(line for line in result.lines if line.startswith("Error while executing"))


def test_without_authentication_acls_answer_as_kafka_without_an_authorizer(
    kafka_reference, sidecar_kafka, tmp_path
):
    topic = uniq("acl-off")
    theirs = run_tools(_acl_commands(kafka_reference.bootstrap, topic), tmp_path)
    ours = run_tools(_acl_commands(sidecar_kafka, topic), tmp_path)
    for kafka, sidecar in zip(theirs, ours, strict=True):
        assert kafka.exit == sidecar.exit != 0, (kafka.text, sidecar.text)
        said = [_error_line(kafka), _error_line(sidecar)]
        assert said[0] == said[1]
        assert "SecurityDisabledException: No Authorizer is configured" in said[1]


def _log_dirs(result: ToolResult) -> dict[str, Any]:
    assert result.exit == 0, (result.text, result.error_text)
    return dict(json.loads(result.lines[-1]))


def test_kafka_log_dirs_answers_each_partitions_size(pulsar, kafka_reference, tmp_path):
    namespace = uniq("klogdirs")
    with ThreadSidecar(pulsar, namespace=namespace, system_namespace=uniq("sys")) as sc:
        topic = uniq("logdirs")
        for bootstrap in (sc.kafka_bootstrap, kafka_reference.bootstrap):
            producer = Producer({"bootstrap.servers": bootstrap})
            for _ in range(20):
                producer.produce(topic, b"x" * 100)
            assert producer.flush(30) == 0
        argv = ["--describe", "--topic-list", topic]
        ours, theirs = run_tools(
            [
                (LOG_DIRS, ["--bootstrap-server", sc.kafka_bootstrap, *argv]),
                (LOG_DIRS, ["--bootstrap-server", kafka_reference.bootstrap, *argv]),
            ],
            tmp_path,
        )
        stats = httpx.get(
            f"{pulsar.admin_url}/admin/v2/persistent/public/{namespace}/{topic}/partitioned-stats",
            params={"perPartition": "true"},
            timeout=30,
        ).json()
    delete_namespace(pulsar.admin_url, f"public/{namespace}")
    mine, kafka = _log_dirs(ours), _log_dirs(theirs)
    assert ours.lines[0] == theirs.lines[0] == "Querying brokers for log directories information"
    for described in (mine, kafka):
        assert described["version"] == 1
        ((broker,),) = [described["brokers"]]
        ((log_dir,),) = [broker["logDirs"]]
        assert log_dir["error"] is None
        assert {p["partition"] for p in log_dir["partitions"]} >= {f"{topic}-0"}
        assert all(p["offsetLag"] == 0 and p["isFuture"] is False for p in log_dir["partitions"])
    (dir_,) = mine["brokers"][0]["logDirs"]
    assert dir_["logDir"] == f"/pulsar/public/{namespace}"
    sizes = {p["partition"]: p["size"] for p in dir_["partitions"]}
    pulsar_sizes = {
        f"{topic}-{name.rsplit('-', 1)[1]}": part["storageSize"]
        for name, part in stats["partitions"].items()
    }
    assert sizes == pulsar_sizes
    assert sizes[f"{topic}-0"] > 2000  # 20 records of 100 bytes landed there


def _wire(env: KafkaRoles, token: str) -> WireClient:
    return logged_in(env.sc.kafka_bootstrap, token)


_ANY = {"resource_name_filter": None, "principal_filter": None, "host_filter": None}


def test_every_served_version_round_trips_and_non_admins_get_31(roles):
    env = roles
    topic = uniq("acl-v")
    assert _deliver(env.conf("tok-root"), topic) is None
    with _wire(env, "tok-root") as root, _wire(env, "tok-bob") as bob:
        for version in (1, 2, 3):
            creation = CreateAclsRequest.AclCreation(
                resource_type=2,
                resource_name=topic,
                resource_pattern_type=3,
                principal=f"User:v{version}",
                host="*",
                operation=3,
                permission_type=3,
            )
            created = root.call(CreateAclsRequest(creations=[creation]), version)
            assert [r.error_code for r in created.results] == [0]
            described = root.call(
                DescribeAclsRequest(
                    resource_type_filter=2,
                    pattern_type_filter=3,
                    operation=1,
                    permission_type=1,
                    **{**_ANY, "resource_name_filter": topic},
                ),
                version,
            )
            assert described.error_code == 0
            principals = {a.principal for r in described.resources for a in r.acls}
            assert f"User:v{version}" in principals
            deleted = root.call(
                DeleteAclsRequest(
                    filters=[
                        DeleteAclsRequest.DeleteAclsFilter(
                            resource_type_filter=2,
                            pattern_type_filter=3,
                            operation=3,
                            permission_type=3,
                            **{**_ANY, "principal_filter": f"User:v{version}"},
                        )
                    ]
                ),
                version,
            )
            ((result,),) = [deleted.filter_results]
            assert result.error_code == 0
            assert [(m.principal, m.operation) for m in result.matching_acls] == [
                (f"User:v{version}", 3)
            ]
            refused = bob.call(
                DescribeAclsRequest(
                    resource_type_filter=1,
                    pattern_type_filter=1,
                    operation=1,
                    permission_type=1,
                    **_ANY,
                ),
                version,
            )
            assert refused.error_code == 31
            assert [
                r.error_code
                for r in bob.call(CreateAclsRequest(creations=[creation]), version).results
            ] == [31]
        assert _topic_grants(env, topic) == {}
        wanted = [DescribeLogDirsRequest.DescribableLogDirTopic(topic=topic, partitions=[0])]
        for version in (1, 2, 3, 4):
            answer = root.call(DescribeLogDirsRequest(topics=wanted), version)
            ((result,),) = [answer.results]
            assert result.error_code == 0
            assert [(t.name, [p.partition_index for p in t.partitions]) for t in result.topics] == [
                (topic, [0])
            ]
            if version >= 3:
                assert bob.call(DescribeLogDirsRequest(topics=wanted), version).error_code == 31


def test_the_wildcard_topic_is_the_namespaces_grant(roles):
    env = roles
    every = {"resource_type": 2, "resource_name": "*", "resource_pattern_type": 3}
    read = {"principal": "User:carol", "host": "*", "operation": 3, "permission_type": 3}
    namespace = f"/admin/v2/namespaces/{env.namespace}/permissions"
    with _wire(env, "tok-root") as root:
        creation = CreateAclsRequest.AclCreation(**every, **read)
        assert root.call(CreateAclsRequest(creations=[creation]), 3).results[0].error_code == 0
        assert env.admin.get(namespace).json().get("carol") == ["consume"]
        described = root.call(
            DescribeAclsRequest(
                resource_type_filter=2,
                resource_name_filter="any-topic",
                pattern_type_filter=2,  # MATCH: what applies to the name, '*' included
                principal_filter="User:carol",
                host_filter=None,
                operation=1,
                permission_type=1,
            ),
            3,
        )
        assert [
            (r.resource_name, sorted(a.operation for a in r.acls)) for r in described.resources
        ] == [("*", [3, 8])]  # READ, DESCRIBE
        deleted = root.call(
            DeleteAclsRequest(
                filters=[
                    DeleteAclsRequest.DeleteAclsFilter(
                        resource_type_filter=2,
                        resource_name_filter="*",
                        pattern_type_filter=3,
                        principal_filter="User:carol",
                        host_filter="*",
                        operation=1,
                        permission_type=3,
                    )
                ]
            ),
            3,
        )
        assert len(deleted.filter_results[0].matching_acls) == 2
        assert "carol" not in env.admin.get(namespace).json()
