"""Kafka ACLs <-> Pulsar's grants and the owners table: the pure mapping
(:mod:`kop_dedup.security.acls`)."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.security.acls import (
    CLUSTER_NAME,
    OWN,
    Binding,
    Filter,
    Operation,
    Pattern,
    Permission,
    ResourceType,
    Scope,
    State,
    plan_creations,
    plan_deletions,
    view,
)

READ, WRITE, DESCRIBE = Operation.READ, Operation.WRITE, Operation.DESCRIBE
ANY_FILTER = Filter(ResourceType.ANY, None, Pattern.ANY, None, None, Operation.ANY, Permission.ANY)


def _binding(**changes: object) -> Binding:
    base = {
        "resource_type": ResourceType.TOPIC,
        "name": "orders",
        "pattern": Pattern.LITERAL,
        "principal": "User:alice",
        "host": "*",
        "operation": Operation.READ,
        "permission": Permission.ALLOW,
    }
    return Binding(**{**base, **changes})  # type: ignore[arg-type]


def _listed(state: State) -> set[tuple[int, str, str, int]]:
    return {(b.resource_type, b.name, b.principal, b.operation) for b, _ in view(state)}


def test_topic_grants_list_as_read_write_and_describe():
    state = State(
        namespace={"bob": frozenset({"consume"})},
        topics={"orders": {"alice": frozenset({"produce", "functions"})}},
        groups={"g1": "bob"},
        txns={"tx1": "alice"},
        admins=frozenset({"ops"}),
    )
    assert _listed(state) == {
        (ResourceType.TOPIC, "*", "User:bob", READ),
        (ResourceType.TOPIC, "*", "User:bob", DESCRIBE),
        (ResourceType.TOPIC, "orders", "User:alice", WRITE),
        (ResourceType.TOPIC, "orders", "User:alice", DESCRIBE),
        (ResourceType.GROUP, "g1", "User:bob", READ),
        (ResourceType.GROUP, "g1", "User:bob", DESCRIBE),
        (ResourceType.TRANSACTIONAL_ID, "tx1", "User:alice", WRITE),
        (ResourceType.TRANSACTIONAL_ID, "tx1", "User:alice", DESCRIBE),
        (ResourceType.CLUSTER, CLUSTER_NAME, "User:ops", Operation.ALL),
    }


def test_read_and_write_become_consume_and_produce_keeping_other_actions():
    state = State(topics={"orders": {"alice": frozenset({"functions"})}})
    plan = plan_creations(state, [_binding(operation=READ), _binding(operation=WRITE)])
    assert plan.refusals == [None, None]
    assert plan.targets == {
        (Scope("topic", "orders"), "alice"): frozenset({"functions", "consume", "produce"})
    }


def test_the_wildcard_topic_is_the_namespace():
    plan = plan_creations(State(), [_binding(name="*", operation=WRITE)])
    assert plan.targets == {(Scope("namespace", "*"), "alice"): frozenset({"produce"})}


def test_describe_alone_grants_consume_and_beside_write_grants_nothing_more():
    alone = plan_creations(State(), [_binding(operation=DESCRIBE)])
    assert alone.targets == {(Scope("topic", "orders"), "alice"): frozenset({"consume"})}
    producer = plan_creations(State(), [_binding(operation=WRITE), _binding(operation=DESCRIBE)])
    assert producer.targets == {(Scope("topic", "orders"), "alice"): frozenset({"produce"})}
    held = State(topics={"orders": {"alice": frozenset({"produce"})}})
    assert plan_creations(held, [_binding(operation=DESCRIBE)]).targets == {}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"permission": Permission.DENY}, "DENY cannot be expressed"),
        ({"permission": Permission.ANY}, "not ANY, MATCH or UNKNOWN"),
        ({"operation": Operation.ANY}, "not ANY, MATCH or UNKNOWN"),
        ({"pattern": Pattern.MATCH}, "not ANY, MATCH or UNKNOWN"),
        ({"resource_type": ResourceType.UNKNOWN}, "not ANY, MATCH or UNKNOWN"),
        ({"host": "10.0.0.1"}, "do not name hosts"),
        ({"principal": "Group:ops"}, "User:<a Pulsar role>"),
        ({"principal": "User:*"}, "User:<a Pulsar role>"),
        ({"principal": "User:../ops"}, "cannot be granted"),
        ({"principal": "User:a%2Fb"}, "cannot be granted"),
        ({"pattern": Pattern.PREFIXED}, "LITERAL only"),
        ({"operation": Operation.ALTER_CONFIGS}, "tenant's admin role"),
        ({"operation": Operation.CREATE}, "tenant's admin role"),
        ({"operation": Operation.ALL}, "tenant's admin role"),
        ({"resource_type": ResourceType.CLUSTER, "name": CLUSTER_NAME}, "tenant's admin role"),
        ({"resource_type": ResourceType.GROUP, "name": "*"}, "cannot be owned"),
        ({"resource_type": ResourceType.GROUP, "operation": WRITE}, "tenant's admin role"),
        ({"resource_type": ResourceType.GROUP, "operation": Operation.DELETE}, "admin role"),
    ],
)
def test_what_pulsar_cannot_express_is_refused_with_the_reason(changes, reason):
    plan = plan_creations(State(), [_binding(**changes), _binding()])
    refused, done = plan.refusals
    assert isinstance(refused, errors.InvalidRequest)
    assert reason in refused.message
    assert done is None  # the other entry of the request is still made
    assert plan.targets == {(Scope("topic", "orders"), "alice"): frozenset({"consume"})}


def test_groups_and_transactional_ids_map_onto_one_owner():
    state = State(groups={"taken": "bob"})
    plan = plan_creations(
        state,
        [
            _binding(resource_type=ResourceType.GROUP, name="g1", operation=READ),
            _binding(resource_type=ResourceType.TRANSACTIONAL_ID, name="tx", operation=WRITE),
            _binding(resource_type=ResourceType.GROUP, name="taken", operation=READ),
        ],
    )
    assert plan.targets == {
        (Scope("group", "g1"), "alice"): frozenset({OWN}),
        (Scope("txn", "tx"), "alice"): frozenset({OWN}),
    }
    refused = plan.refusals[2]
    assert isinstance(refused, errors.InvalidRequest)
    assert "belongs to role 'bob'" in refused.message


def test_deleting_read_revokes_consume_and_keeps_produce():
    state = State(topics={"orders": {"alice": frozenset({"produce", "consume"})}})
    read = Filter(ResourceType.TOPIC, "orders", Pattern.LITERAL, "User:alice", "*", READ, 3)
    done = plan_deletions(state, [read])
    assert done.targets == {(Scope("topic", "orders"), "alice"): frozenset({"produce"})}
    ((error, hits),) = done.matched
    assert error is None
    assert [b.operation for b, _ in hits] == [READ]


def test_deleting_everything_of_a_role_revokes_and_releases():
    state = State(
        topics={"orders": {"alice": frozenset({"produce", "consume"})}},
        groups={"g1": "alice", "g2": "bob"},
        admins=frozenset({"alice"}),
    )
    alice = Filter(ResourceType.ANY, None, Pattern.ANY, "User:alice", None, 1, 1)
    done = plan_deletions(state, [alice, ANY_FILTER])
    assert done.targets == {
        (Scope("topic", "orders"), "alice"): frozenset(),
        (Scope("group", "g1"), "alice"): frozenset(),
        (Scope("group", "g2"), "bob"): frozenset(),
    }
    (_, first), (_, second) = done.matched
    assert len(first) == 6  # WRITE READ DESCRIBE, group READ DESCRIBE, cluster ALL
    assert [k for _, k in first].count(None) == 1  # the cluster entry: only Pulsar changes it
    assert {b.principal for b, _ in second} == {"User:bob"}  # not matched twice


def test_deleting_describe_alone_changes_nothing_in_pulsar():
    state = State(topics={"orders": {"alice": frozenset({"consume"})}})
    describe = Filter(ResourceType.TOPIC, "orders", Pattern.LITERAL, None, None, DESCRIBE, 1)
    done = plan_deletions(state, [describe])
    assert done.targets == {}
    assert len(done.matched[0][1]) == 1


def test_match_filters_see_the_wildcard_and_literal_filters_do_not():
    state = State(namespace={"bob": frozenset({"consume"})})
    match = Filter(ResourceType.TOPIC, "orders", Pattern.MATCH, None, None, 1, 1)
    literal = Filter(ResourceType.TOPIC, "orders", Pattern.LITERAL, None, None, 1, 1)
    assert all(match.matches(b) for b, _ in view(state))
    assert not any(literal.matches(b) for b, _ in view(state))


def test_a_filter_with_unknown_parts_is_refused():
    unknown = Filter(ResourceType.UNKNOWN, None, Pattern.ANY, None, None, 1, 1)
    assert unknown.unknown() is not None
    done = plan_deletions(State(), [unknown])
    assert isinstance(done.matched[0][0], errors.InvalidRequest)
    assert ANY_FILTER.unknown() is None
