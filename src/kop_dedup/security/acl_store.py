"""Kafka's ACLs read from and written to Pulsar's permissions and the owners table.

The rules are :mod:`kop_dedup.security.acls` (pure); this module reads the state they
start from and makes their writes: a role's actions on a topic or on the data
namespace through Pulsar's admin API (:meth:`~kop_dedup.pulsar.grants.Grants.set_actions`),
the owner of a group or transactional id in the owners table (claimed for the role, or
released). One node's changes are made one request at a time (a lock), each from a
fresh read; two nodes changing one role's grants on one topic at the same moment may
leave either's (Pulsar keeps a role's set of actions per topic whole, last write wins).

Each entry's outcome is its own: an entry Pulsar refuses (a topic that does not exist,
the admin API away) carries its error; the others are done.

>>> store = AclStore(grants, owners)
>>> await store.create([Binding.topic("orders", "alice", Operation.WRITE)])
[None]
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kop_dedup import errors
from kop_dedup.pulsar.admin import AdminError
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.grants import Grants
from kop_dedup.security.acls import (
    OWN,
    Binding,
    Filter,
    Key,
    State,
    plan_creations,
    plan_deletions,
    refusal_of_cluster,
    view,
)
from kop_dedup.security.owners import Owners

__all__ = ["AclStore", "Deleted"]

Deleted = list[tuple[errors.KafkaError | None, list[tuple[Binding, errors.KafkaError | None]]]]
"""Per filter: its error, or each binding it matched with the error of its deletion."""


class AclStore:
    """The ACL view of one sidecar's grants and owners (see the module)."""

    def __init__(self, grants: Grants, owners: Owners) -> None:
        self._grants, self._owners = grants, owners
        self._lock = asyncio.Lock()

    async def state(self) -> State:
        """What Pulsar holds now."""
        try:
            namespace, topics = await self._grants.acl_state()
            groups = await self._owners.owners("group")
            txns = await self._owners.owners("txn")
            admins = await self._grants.tenant_admins()
        except Exception as exc:
            raise translate(exc, "reading the permissions and owners in Pulsar") from exc
        return State(namespace, topics, groups, txns, admins)

    async def describe(self, flt: Filter) -> list[Binding]:
        """The ACLs ``flt`` matches; INVALID_REQUEST for a filter with UNKNOWN parts."""
        why = flt.unknown()
        if why is not None:
            raise errors.InvalidRequest(why)
        return [b for b, _key in view(await self.state()) if flt.matches(b)]

    async def create(self, bindings: Sequence[Binding]) -> list[errors.KafkaError | None]:
        """Each binding's error (None: it holds now)."""
        async with self._lock:
            plan = plan_creations(await self.state(), bindings)
            failed = await self._write(plan.targets)
        return [
            refusal if key is None else failed.get(key)
            for key, refusal in zip(plan.keys, plan.refusals, strict=True)
        ]

    async def delete(self, filters: Sequence[Filter]) -> Deleted:
        """Per filter, the bindings it matched and whether each is gone."""
        async with self._lock:
            plan = plan_deletions(await self.state(), filters)
            failed = await self._write(plan.targets)
        out: Deleted = []
        for error, hits in plan.matched:
            out.append(
                (
                    error,
                    [
                        (b, refusal_of_cluster(b) if key is None else failed.get(key))
                        for b, key in hits
                    ],
                )
            )
        return out

    async def _write(self, targets: dict[Key, frozenset[str]]) -> dict[Key, errors.KafkaError]:
        failed: dict[Key, errors.KafkaError] = {}
        for key, actions in targets.items():
            try:
                await self._write_one(key, actions)
            except errors.KafkaError as exc:
                failed[key] = exc
            except AdminError as exc:
                scope = key[0]
                if exc.status == 404 and scope.kind == "topic" and not actions:
                    continue  # deleted meanwhile: Pulsar dropped its grants with it
                if exc.status == 404 and scope.kind == "topic":
                    failed[key] = errors.InvalidRequest(
                        f"topic {scope.name!r} does not exist: Pulsar grants name existing "
                        "topics (create it first, or use '*' for every topic)"
                    )
                else:
                    failed[key] = translate(exc, f"changing the permissions of {scope.name!r}")
            except Exception as exc:
                failed[key] = translate(exc, f"changing the ACLs of {key[0].name!r}")
        return failed

    async def _write_one(self, key: Key, actions: frozenset[str]) -> None:
        scope, role = key
        if scope.kind in ("topic", "namespace"):
            topic = scope.name if scope.kind == "topic" else None
            await self._grants.set_actions(topic, role, actions)
            return
        if OWN not in actions:
            await self._owners.release(scope.kind, scope.name)
            return
        if not await self._owners.claim(scope.kind, scope.name, role):
            owner = await self._owners.owner(scope.kind, scope.name)
            raise errors.InvalidRequest(
                f"{scope.kind} {scope.name!r} belongs to role {owner!r}: remove that ACL first"
            )
