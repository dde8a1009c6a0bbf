"""Kafka's ACLs as a view of Pulsar's permissions and the owners table: pure rules.

Kafka's ACL APIs (DescribeAcls, CreateAcls, DeleteAcls) read and write what the
sidecar authorizes with (:mod:`kop_dedup.security.authorizer`); there is no second
store. The mapping, for a principal ``User:<role>``, host ``*``, ALLOW, LITERAL:

==============================  ============================================================
Kafka ACL                       Pulsar / the sidecar
==============================  ============================================================
Topic ``T`` WRITE               ``produce`` granted to the role on topic ``T``
Topic ``T`` READ                ``consume`` on ``T``
Topic ``T`` DESCRIBE            held with either (Pulsar has no describe-only grant); added
                                alone, it grants ``consume``, which then lists as READ too
Topic ``*`` (any of the above)  the same on the data namespace (every topic)
Group ``G`` READ, DESCRIBE      the role owns group ``G`` (:mod:`.owners`)
TransactionalId ``X`` WRITE,    the role owns transactional id ``X``
DESCRIBE
Cluster ``kafka-cluster`` ALL   listed for the tenant's admin roles; set in Pulsar only
==============================  ============================================================

Everything else cannot be said in Pulsar's terms and is refused per entry with
INVALID_REQUEST and the reason: DENY, a host other than ``*``, a principal that is not
``User:<role>`` (or ``User:*``), PREFIXED patterns, ``*`` for groups and transactional
ids (an owner is per name), another role's group or transactional id (one owner each),
and operations that need the tenant's admin role (Create, Delete, Alter, AlterConfigs,
DescribeConfigs, All, Cluster ACLs). Deleting a DESCRIBE changes nothing in Pulsar: it
stays listed while the role holds ``produce`` or ``consume`` there, as Kafka's READ and
WRITE imply DESCRIBE.

>>> plan = plan_creations(state, [Binding.topic("orders", "alice", Operation.READ)])
>>> plan.targets            # what each (scope, role) should hold afterwards
{(Scope('topic', 'orders'), 'alice'): frozenset({'consume'})}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from kop_dedup import errors

__all__ = [
    "CLUSTER_NAME",
    "OWN",
    "WILDCARD",
    "Binding",
    "Deletion",
    "Filter",
    "Key",
    "Operation",
    "Pattern",
    "Permission",
    "Plan",
    "ResourceType",
    "Scope",
    "State",
    "plan_creations",
    "plan_deletions",
    "refusal_of_cluster",
    "view",
]

WILDCARD = "*"
CLUSTER_NAME = "kafka-cluster"
OWN = "own"
"""The one action of a group or transactional id scope: the role owns the name."""
_PRODUCE, _CONSUME = "produce", "consume"
_TOPIC_ACTIONS = frozenset({_PRODUCE, _CONSUME})
_TOPIC_OPS: dict[int, str] = {3: _CONSUME, 4: _PRODUCE}  # READ, WRITE
_OWNED: dict[int, tuple[str, tuple[int, ...]]] = {
    3: ("group", (3, 8)),  # Group: READ, DESCRIBE
    5: ("txn", (4, 8)),  # TransactionalId: WRITE, DESCRIBE
}


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class Pattern(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a grant lives: ``topic`` (a Kafka topic), ``namespace`` (name ``*``: every
    topic of the data namespace), ``group`` or ``txn`` (an owned name)."""

    kind: str
    name: str

    @property
    def resource_type(self) -> ResourceType:
        if self.kind == "group":
            return ResourceType.GROUP
        if self.kind == "txn":
            return ResourceType.TRANSACTIONAL_ID
        return ResourceType.TOPIC


Key = tuple[Scope, str]
"""(scope, role): one holder of actions."""


@dataclass(frozen=True, slots=True)
class Binding:
    """One Kafka ACL (a resource pattern and an access control entry)."""

    resource_type: int
    name: str
    pattern: int
    principal: str
    host: str
    operation: int
    permission: int

    @classmethod
    def of(cls, scope: Scope, role: str, operation: Operation) -> Binding:
        return cls(
            int(scope.resource_type),
            scope.name,
            Pattern.LITERAL,
            f"User:{role}",
            WILDCARD,
            int(operation),
            Permission.ALLOW,
        )

    @classmethod
    def topic(cls, name: str, role: str, operation: Operation) -> Binding:
        kind = "namespace" if name == WILDCARD else "topic"
        return cls.of(Scope(kind, name), role, operation)


@dataclass(frozen=True, slots=True)
class Filter:
    """A Kafka ACL binding filter (None: any name, principal or host)."""

    resource_type: int
    name: str | None
    pattern: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def unknown(self) -> str | None:
        """Kafka's refusal of a filter with an UNKNOWN element, else None."""
        if self.pattern == Pattern.UNKNOWN or self.resource_type == ResourceType.UNKNOWN:
            return "The filter must not contain UNKNOWN elements (resource type or pattern)."
        if self.operation == Operation.UNKNOWN or self.permission == Permission.UNKNOWN:
            return "The filter must not contain UNKNOWN elements (operation or permission)."
        return None

    def matches(self, b: Binding) -> bool:
        """Kafka's ``AclBindingFilter.matches``: the resource pattern, then the entry."""
        return self._resource(b) and (
            (self.principal is None or self.principal == b.principal)
            and (self.host is None or self.host == b.host)
            and self.operation in (Operation.ANY, b.operation)
            and self.permission in (Permission.ANY, b.permission)
        )

    def _resource(self, b: Binding) -> bool:
        if self.resource_type not in (ResourceType.ANY, b.resource_type):
            return False
        if self.pattern not in (Pattern.ANY, Pattern.MATCH, b.pattern):
            return False
        if self.name is None:
            return True
        if self.pattern in (Pattern.ANY, b.pattern):
            return self.name == b.name
        if b.pattern == Pattern.LITERAL:  # MATCH: the patterns that apply to the name
            return b.name in (self.name, WILDCARD)
        return b.pattern == Pattern.PREFIXED and self.name.startswith(b.name)


@dataclass(frozen=True, slots=True)
class State:
    """What Pulsar holds: grants (role -> actions) on the namespace and per topic, the
    owners of groups and transactional ids, and the tenant's admin roles."""

    namespace: Mapping[str, frozenset[str]] = field(default_factory=dict)
    topics: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)
    groups: Mapping[str, str] = field(default_factory=dict)
    txns: Mapping[str, str] = field(default_factory=dict)
    admins: frozenset[str] = frozenset()

    def held(self) -> dict[Key, frozenset[str]]:
        """Every (scope, role) and the actions it holds."""
        out: dict[Key, frozenset[str]] = {}
        for role, actions in self.namespace.items():
            out[(Scope("namespace", WILDCARD), role)] = actions
        for topic, roles in self.topics.items():
            for role, actions in roles.items():
                out[(Scope("topic", topic), role)] = actions
        for kind, owners in (("group", self.groups), ("txn", self.txns)):
            for name, role in owners.items():
                out[(Scope(kind, name), role)] = frozenset({OWN})
        return out


def _shown(scope: Scope, actions: frozenset[str]) -> list[Operation]:
    if scope.kind == "group":
        return [Operation.READ, Operation.DESCRIBE] if OWN in actions else []
    if scope.kind == "txn":
        return [Operation.WRITE, Operation.DESCRIBE] if OWN in actions else []
    ops = [Operation.WRITE] if _PRODUCE in actions else []
    ops += [Operation.READ] if _CONSUME in actions else []
    return [*ops, Operation.DESCRIBE] if ops else []


def view(state: State) -> list[tuple[Binding, Key | None]]:
    """Every ACL the state amounts to, with the (scope, role) behind it (None: the
    tenant's admin roles, which only Pulsar changes)."""
    out: list[tuple[Binding, Key | None]] = []
    held = state.held()
    for key in sorted(held, key=lambda k: (k[0].kind, k[0].name, k[1])):
        scope, role = key
        out += [(Binding.of(scope, role, op), key) for op in _shown(scope, held[key])]
    for role in sorted(state.admins):
        cluster = Binding(
            ResourceType.CLUSTER,
            CLUSTER_NAME,
            Pattern.LITERAL,
            f"User:{role}",
            WILDCARD,
            Operation.ALL,
            Permission.ALLOW,
        )
        out.append((cluster, None))
    return out


_ADMIN_ONLY = (
    "needs the tenant's admin role in Pulsar (pulsar-admin tenants update --admin-roles), "
    "which Kafka's ACL APIs do not change"
)


def _refuse(b: Binding, why: str) -> errors.InvalidRequest:
    try:
        op = Operation(b.operation).name
        kind = ResourceType(b.resource_type).name
    except ValueError:
        op, kind = str(b.operation), str(b.resource_type)
    return errors.InvalidRequest(f"{op} on {kind} {b.name!r} for {b.principal}: {why}")


def _role(b: Binding) -> str:
    """The role of an ACL to create, once its entry is one Pulsar can hold (an ALLOW of
    one named resource, any host, a LITERAL pattern, a ``User:`` principal)."""
    if (
        b.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY)
        or b.pattern in (Pattern.UNKNOWN, Pattern.ANY, Pattern.MATCH)
        or b.operation in (Operation.UNKNOWN, Operation.ANY)
        or b.permission in (Permission.UNKNOWN, Permission.ANY)
    ):
        raise _refuse(
            b,
            "an ACL to create names one resource type, pattern type, operation "
            "and permission (not ANY, MATCH or UNKNOWN)",
        )
    if b.permission != Permission.ALLOW:
        raise _refuse(b, "Pulsar's permissions only allow; DENY cannot be expressed")
    if b.host != WILDCARD:
        raise _refuse(b, "Pulsar's permissions do not name hosts; use host '*'")
    kind, _, role = b.principal.partition(":")
    if kind != "User" or not role or role == WILDCARD:
        raise _refuse(b, "the principal must be User:<a Pulsar role> (no wildcard)")
    if role in (".", "..") or any(c in role for c in "/\\%"):
        raise _refuse(b, "a role with '/', '\\' or '%', or '.' or '..', cannot be granted")
    if b.pattern != Pattern.LITERAL:
        raise _refuse(b, "Pulsar grants name one topic or the namespace ('*'): LITERAL only")
    return role


def _grant(b: Binding) -> tuple[Key, str]:
    """(scope, role) and the action one binding to create asks for ('describe': either
    topic action), or INVALID_REQUEST saying why Pulsar cannot express it."""
    role = _role(b)
    op = b.operation
    if b.resource_type == ResourceType.TOPIC:
        scope = Scope("namespace" if b.name == WILDCARD else "topic", b.name)
        action = _TOPIC_OPS.get(op)
        if action is None and op == Operation.DESCRIBE:
            action = "describe"
        if action is None:
            raise _refuse(b, _ADMIN_ONLY)
        return (scope, role), action
    owned = _OWNED.get(b.resource_type)
    if owned is None:
        raise _refuse(b, _ADMIN_ONLY)
    kind, ops = owned
    if b.name == WILDCARD:
        raise _refuse(b, "an owner is per name: '*' cannot be owned")
    if op not in ops:
        raise _refuse(b, _ADMIN_ONLY)
    return (Scope(kind, b.name), role), OWN


@dataclass(slots=True)
class Plan:
    """What to write: the actions each changed (scope, role) holds afterwards, and the
    error of each refused entry (None: done once its scope's write succeeds)."""

    targets: dict[Key, frozenset[str]] = field(default_factory=dict)
    keys: list[Key | None] = field(default_factory=list)
    refusals: list[errors.KafkaError | None] = field(default_factory=list)


def plan_creations(state: State, bindings: Sequence[Binding]) -> Plan:
    """The writes that make every mappable binding hold (see the module)."""
    held = state.held()
    plan = Plan()
    adds: dict[Key, set[str]] = {}
    for b in bindings:
        try:
            key, action = _grant(b)
            scope, role = key
            if action == OWN:
                owner = (state.groups if scope.kind == "group" else state.txns).get(scope.name)
                if owner not in (None, role):
                    raise _refuse(b, f"it belongs to role {owner!r}: remove that ACL first")
        except errors.InvalidRequest as exc:
            plan.keys.append(None)
            plan.refusals.append(exc)
            continue
        adds.setdefault(key, set()).add(action)
        plan.keys.append(key)
        plan.refusals.append(None)
    for key, wanted in adds.items():
        current = held.get(key, frozenset())
        target = current | (wanted - {"describe"})
        if "describe" in wanted and not target & _TOPIC_ACTIONS:
            target |= {_CONSUME}  # the least Pulsar grant that lets a role describe
        if target != current:
            plan.targets[key] = frozenset(target)
    return plan


@dataclass(slots=True)
class Deletion:
    """Per filter: its refusal, or the bindings it matched, each with its key and its
    refusal (a Cluster ACL); and the actions each changed (scope, role) keeps."""

    matched: list[tuple[errors.KafkaError | None, list[tuple[Binding, Key | None]]]]
    targets: dict[Key, frozenset[str]]


def _removed(b: Binding, key: Key) -> str | None:
    scope = key[0]
    if scope.kind in ("group", "txn"):
        return OWN if b.operation != Operation.DESCRIBE else None
    return _TOPIC_OPS.get(b.operation)


def plan_deletions(state: State, filters: Iterable[Filter]) -> Deletion:
    """What each filter deletes; a binding matched by an earlier filter is not matched
    again (as Kafka reports it)."""
    listed = view(state)
    held = state.held()
    seen: set[Binding] = set()
    removals: dict[Key, set[str]] = {}
    matched: list[tuple[errors.KafkaError | None, list[tuple[Binding, Key | None]]]] = []
    for f in filters:
        why = f.unknown()
        if why is not None:
            matched.append((errors.InvalidRequest(why), []))
            continue
        hits = [(b, k) for b, k in listed if b not in seen and f.matches(b)]
        seen.update(b for b, _ in hits)
        for b, key in hits:
            action = None if key is None else _removed(b, key)
            if key is not None and action is not None:
                removals.setdefault(key, set()).add(action)
        matched.append((None, hits))
    targets = {k: held[k] - frozenset(r) for k, r in removals.items() if held[k] & r}
    return Deletion(matched, targets)


def refusal_of_cluster(b: Binding) -> errors.InvalidRequest:
    """Why a Cluster ACL cannot be deleted here."""
    return _refuse(b, _ADMIN_ONLY)
