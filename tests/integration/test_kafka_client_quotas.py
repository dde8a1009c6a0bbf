"""Kafka's client quotas over per-role quotas, with the reference Kafka broker as the
oracle: ``kafka-configs --describe/--alter --entity-type users`` (and ``clients``) run
against both and their output compared; AlterClientQuotas (validate_only, unknown keys,
invalid values), DescribeClientQuotas filters and DescribeUserScramCredentials sent on
the wire to both and the answers compared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.admin import AlterClientQuotasRequest as Alter
from kafka.protocol.admin import DescribeClientQuotasRequest as Describe
from kafka.protocol.admin import DescribeUserScramCredentialsRequest as Scram

from tests.helpers import uniq
from tests.kafka_cli import CONFIGS, run_tools
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

_E = Alter.EntryData


@pytest.fixture(scope="module")
def quota_sidecar(pulsar) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(pulsar, system_namespace=uniq("sys"), namespace=uniq("cq")) as sc:
        yield sc


def _tools(bootstrap: str, user: str, tmp: Any) -> list[tuple[int, list[str]]]:
    s = ["--bootstrap-server", bootstrap]
    users = ["--entity-type", "users"]
    named = [*users, "--entity-name", user]
    default = [*users, "--entity-default"]
    done = run_tools(
        [
            (CONFIGS, [*s, "--describe", *users]),
            (CONFIGS, [*s, "--describe", "--entity-type", "clients"]),
            (CONFIGS, [*s, "--alter", "--add-config", "producer_byte_rate=1048576", *named]),
            (CONFIGS, [*s, "--alter", "--add-config", "consumer_byte_rate=2048", *default]),
            (CONFIGS, [*s, "--describe", *users]),
            (CONFIGS, [*s, "--describe", *named]),
            (CONFIGS, [*s, "--describe", *default]),
            (CONFIGS, [*s, "--describe", "--entity-type", "clients"]),
            (CONFIGS, [*s, "--alter", "--add-config", "producer_byte_rate=1.5", *named]),
            (CONFIGS, [*s, "--alter", "--delete-config", "producer_byte_rate", *named]),
            (CONFIGS, [*s, "--describe", *users]),
            (CONFIGS, [*s, "--alter", "--delete-config", "consumer_byte_rate", *default]),
            (CONFIGS, [*s, "--describe", *users]),
        ],
        tmp,
    )
    out = []
    for r in done:
        refused = [line for line in r.errors if "Exception:" in line][:1]
        out.append((r.exit, [*sorted(r.lines), *refused]))  # Kafka lists in hash order
    return out


def test_kafka_configs_on_user_and_client_quotas_answers_as_kafka(
    kafka_reference, quota_sidecar, tmp_path
):
    user = uniq("quser")
    kafka = _tools(kafka_reference.bootstrap, user, tmp_path / "kafka")
    ours = _tools(quota_sidecar.kafka_bootstrap, user, tmp_path / "ours")
    assert ours == kafka
    assert kafka[4][1] == [
        "Quota configs for the default user-principal are consumer_byte_rate=2048.0",
        f"Quota configs for user-principal '{user}' are producer_byte_rate=1048576.0",
    ]
    assert "fractional" in kafka[8][1][-1]


def _alter(entity: str | None, ops: list[tuple[str, float, bool]], kind: str = "user") -> Any:
    return _E(
        entity=[_E.EntityData(entity_type=kind, entity_name=entity)],
        ops=[_E.OpData(key=k, value=v, remove=r) for k, v, r in ops],
    )


def _wire(bootstrap: str, user: str) -> list[Any]:
    answers = []
    with WireClient(bootstrap) as c:
        for request, version in [
            (
                Alter(
                    entries=[_alter(user, [("producer_byte_rate", 100.0, False)])],
                    validate_only=True,
                ),
                1,
            ),
            (Alter(entries=[_alter(user, [("bogus", 100.0, False)])], validate_only=False), 1),
            (
                Alter(
                    entries=[_alter(user, [("producer_byte_rate", -5.0, False)])],
                    validate_only=False,
                ),
                1,
            ),
            (
                Alter(
                    entries=[_alter(user, [("consumer_byte_rate", 0.0, False)])], validate_only=True
                ),
                0,
            ),
            (
                Alter(
                    entries=[_alter(user, [("producer_byte_rate", 5.0, False)], "bogus")],
                    validate_only=True,
                ),
                1,
            ),
            (
                Alter(
                    entries=[_alter("", [("producer_byte_rate", 5.0, False)])], validate_only=True
                ),
                1,
            ),
            (Alter(entries=[_E(entity=[], ops=[])], validate_only=True), 1),
            (
                Describe(
                    components=[
                        Describe.ComponentData(entity_type="user", match_type=0, match=user)
                    ],
                    strict=False,
                ),
                1,
            ),
            (
                Describe(
                    components=[
                        Describe.ComponentData(entity_type="bogus", match_type=2, match=None)
                    ],
                    strict=False,
                ),
                1,
            ),
            (
                Describe(
                    components=[
                        Describe.ComponentData(entity_type="user", match_type=0, match=None)
                    ],
                    strict=True,
                ),
                0,
            ),
            (
                Describe(
                    components=[
                        Describe.ComponentData(entity_type="client-id", match_type=2, match=None)
                    ],
                    strict=False,
                ),
                1,
            ),
            (Scram(users=None), 0),
            (Scram(users=[Scram.UserName(name=user)]), 0),
            (Scram(users=[Scram.UserName(name=user), Scram.UserName(name=user)]), 0),
        ]:
            answer = c.call(request, version).to_dict()
            if answer.get("error_message") == "":
                answer["error_message"] = None  # Kafka writes null; kafka-python reads ""
            answers.append(answer)
    return answers


def test_client_quota_apis_on_the_wire_answer_as_kafka(kafka_reference, quota_sidecar):
    user = uniq("qwire")
    kafka = _wire(kafka_reference.bootstrap, user)
    ours = _wire(quota_sidecar.kafka_bootstrap, user)
    assert ours == kafka
    assert kafka[0]["entries"][0]["error_code"] == 0  # validate_only: checked...
    assert kafka[7]["entries"] == []  # ... and not stored
    assert kafka[1]["entries"][0]["error_message"] == "Invalid configuration key bogus"


def test_quotas_not_served_are_refused_with_kafkas_code(quota_sidecar):
    with WireClient(quota_sidecar.kafka_bootstrap) as c:
        for request in [
            Alter(
                entries=[_alter("c1", [("producer_byte_rate", 5.0, False)], "client-id")],
                validate_only=False,
            ),
            Alter(entries=[_alter("u", [("request_percentage", 5.0, False)])], validate_only=False),
        ]:
            entry = c.call(request, 1).entries[0]
            assert entry.error_code == 42, entry
            assert "served" in entry.error_message


def test_a_quota_altered_on_one_node_is_described_and_enforced_on_another(pulsar, quota_sidecar):
    user = uniq("qnode")
    with ThreadSidecar(pulsar, cluster_of=quota_sidecar, namespace=uniq("cq2")) as other:
        with WireClient(quota_sidecar.kafka_bootstrap) as here:
            entry = _alter(user, [("producer_byte_rate", 4096.0, False)])
            assert (
                here.call(Alter(entries=[entry], validate_only=False), 1).entries[0].error_code == 0
            )
        component = Describe.ComponentData(entity_type="user", match_type=0, match=user)
        with WireClient(other.kafka_bootstrap) as there:
            answer = there.call(Describe(components=[component], strict=False), 1)
        assert [(v.key, v.value) for e in answer.entries for v in e.values] == [
            ("producer_byte_rate", 4096.0)
        ]
        quotas = other.runtime.authorizer.client_quotas

        async def limit() -> float | None:  # on the sidecar's loop, as the throttle asks
            return quotas.limit(user, "producer_byte_rate")

        assert other.call(limit()) == 4096.0
