"""What a Kafka request needs of its caller's role, checked before its handler runs.

:func:`authorize` is called by :func:`kop_dedup.transports.kafka.routed.handle` for
every request a client sent (a request another node forwarded was authorized where its
client sent it). A request naming something its role may not use is answered whole
with the API's error answer at Kafka's code (nothing of it is done):

- 29 TOPIC_AUTHORIZATION_FAILED: a topic without ``produce`` (Produce,
  AddPartitionsToTxn), without ``consume`` (Fetch, ListOffsets, offsets of a group,
  OffsetForLeaderEpoch, DescribeProducers), without either (Kafka's DESCRIBE: a name of
  ConsumerGroupHeartbeat's SubscribedTopicNames, answered without a message as Kafka
  4.1 does), or an administrative change without the tenant's admin role
  (CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords, AlterConfigs,
  IncrementalAlterConfigs);
- 30 GROUP_AUTHORIZATION_FAILED: a group another role used first, or DeleteGroups of a
  group the caller's role does not own, without the admin role;
- 42 INVALID_REQUEST (a transactional id), 24 INVALID_GROUP_ID (a group): a name over
  ``MAX_ID_LENGTH`` characters, refused before it is claimed;
- 53 TRANSACTIONAL_ID_AUTHORIZATION_FAILED: a transactional id another role used first;
- 31 CLUSTER_AUTHORIZATION_FAILED: a batch of a producer id another role was given, or
  WriteTxnMarkers (an operator's abort), the ACL APIs or DescribeLogDirs without the
  tenant's admin role;
- 59 UNKNOWN_PRODUCER_ID: a batch of a producer id given to no role (not handed out yet:
  :meth:`~kop_dedup.security.authorizer.Authorizer.require_producers`).

Listings (Metadata of every topic, ListGroups, ListTransactions) are filtered by their
handlers; Metadata answers 29 per topic. With authentication off, or for a superuser,
nothing is checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from kop_dedup import errors
from kop_dedup.security.authorizer import CONSUME, DESCRIBE, PRODUCE, Authorizer
from kop_dedup.security.identity import Identity
from kop_dedup.transports.kafka.batches import producer_id_of
from kop_dedup.transports.kafka.registry import Session

__all__ = ["authorize"]

Check = Callable[[Authorizer, Identity, Any, int], Awaitable[None]]


def _names(items: Iterable[Any] | None, attr: str = "name") -> list[str]:
    return [str(getattr(t, attr)) for t in items or ()]


def _topics(action: str, attr: str = "name") -> Check:
    async def check(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
        await auth.require(who, action, _names(request.topics, attr))

    return check


def _admin(what: str, topics_of: Callable[[Any, int], list[str]]) -> Check:
    async def check(auth: Authorizer, who: Identity, request: Any, version: int) -> None:
        if not topics_of(request, version):
            return
        await auth.require_admin(who, what, errors.TopicAuthorizationFailed)

    return check


async def _produce(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require_txn(who, getattr(request, "transactional_id", None))
    await auth.require(who, PRODUCE, _names(request.topic_data))
    pids = (producer_id_of(p.records or b"") for t in request.topic_data for p in t.partition_data)
    await auth.require_producers(who, (pid for pid in pids if pid is not None))


async def _fetch(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require(who, CONSUME, _names(request.topics, "topic"))


async def _init_producer_id(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require_txn(who, request.transactional_id)


async def _add_partitions(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require_txn(who, request.v3_and_below_transactional_id)
    await auth.require(who, PRODUCE, _names(request.v3_and_below_topics))


async def _add_offsets(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require_txn(who, request.transactional_id)
    await auth.require_group(who, request.group_id)


async def _end_txn(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require_txn(who, request.transactional_id)


async def _txn_offset_commit(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require_txn(who, request.transactional_id)
    await auth.require_group(who, request.group_id)
    await auth.require(who, CONSUME, _names(request.topics))


async def _group(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require_group(who, request.group_id)


def _offsets(claim: bool) -> Check:
    """OffsetCommit and OffsetDelete use the group (``claim``), OffsetFetch looks."""

    async def check(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
        groups = getattr(request, "groups", None)
        if groups:  # OffsetFetch v8+: several groups
            for g in groups:
                await auth.require_group(who, g.group_id, claim=claim)
                await auth.require(who, CONSUME, _names(g.topics))
            return
        await auth.require_group(who, request.group_id, claim=claim)
        await auth.require(who, CONSUME, _names(request.topics))

    return check


async def _consumer_heartbeat(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    """Kafka 4.1's ``handleConsumerGroupHeartbeat``: the group, then every name of a
    non-empty SubscribedTopicNames the role may describe, else 29 for the whole heartbeat
    (a regular expression's topics are filtered by the coordinator instead)."""
    await auth.require_group(who, request.group_id)
    names = {str(n) for n in request.subscribed_topic_names or ()}
    if names and not all((await auth.may_each(who, DESCRIBE, sorted(names))).values()):
        raise errors.TopicAuthorizationFailed(f"role {who.role!r} may not describe {sorted(names)}")


async def _describe_groups(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    for group in request.groups or ():
        await auth.require_group(who, str(group), claim=False)


async def _consumer_groups(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    for group in request.group_ids or ():
        await auth.require_group(who, str(group), claim=False)


async def _delete_groups(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    for group in request.groups_names or ():
        await auth.may_delete_group(who, str(group))


async def _describe_txns(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    for tid in request.transactional_ids or ():
        await auth.require_txn(who, str(tid), claim=False)


async def _markers(auth: Authorizer, who: Identity, _request: Any, _version: int) -> None:
    await auth.require_admin(who, "write transaction markers", errors.ClusterAuthorizationFailed)


def _cluster(what: str) -> Check:
    async def check(auth: Authorizer, who: Identity, _request: Any, _version: int) -> None:
        await auth.require_admin(who, what, errors.ClusterAuthorizationFailed)

    return check


async def _describe_configs(auth: Authorizer, who: Identity, request: Any, _version: int) -> None:
    await auth.require(who, DESCRIBE, _config_topics(request, _version))


def _deleted_topics(request: Any, version: int) -> list[str]:
    return list(request.topic_names) if version < 6 else _names(request.topics)


def _config_topics(request: Any, _version: int) -> list[str]:
    return [r.resource_name for r in request.resources or () if r.resource_type == 2]  # TOPIC


def _named(request: Any, _version: int) -> list[str]:
    return _names(request.topics)


_CHECKS: dict[int, Check] = {
    0: _produce,
    1: _fetch,
    2: _topics(CONSUME),
    8: _offsets(claim=True),
    9: _offsets(claim=False),
    11: _group,  # JoinGroup
    12: _group,  # Heartbeat
    13: _group,  # LeaveGroup
    14: _group,  # SyncGroup
    15: _describe_groups,
    19: _admin("create topics", _named),
    20: _admin("delete topics", _deleted_topics),
    21: _admin("delete records", _named),
    22: _init_producer_id,
    23: _topics(CONSUME, "topic"),  # OffsetForLeaderEpoch
    24: _add_partitions,
    25: _add_offsets,
    26: _end_txn,
    27: _markers,  # WriteTxnMarkers: an operator's abort
    28: _txn_offset_commit,
    29: _cluster("describe ACLs"),
    30: _cluster("create ACLs"),
    31: _cluster("delete ACLs"),
    32: _describe_configs,
    33: _admin("alter configs", _config_topics),
    35: _cluster("describe log dirs"),
    37: _admin("add partitions", _named),
    42: _delete_groups,
    44: _admin("alter configs", _config_topics),
    47: _offsets(claim=True),  # OffsetDelete: the group's and its topics'
    61: _topics(CONSUME),  # DescribeProducers
    65: _describe_txns,
    68: _consumer_heartbeat,
    69: _consumer_groups,  # ConsumerGroupDescribe
}


async def authorize(session: Session, api_key: int, request: Any, version: int) -> None:
    """Raise the Kafka authorization error ``request`` earns its caller (see the module)."""
    who = session.identity
    if who.superuser or session.forwarded or request is None:
        return
    check = _CHECKS.get(api_key)
    if check is not None:
        await check(session.runtime.authorizer, who, request, version)
