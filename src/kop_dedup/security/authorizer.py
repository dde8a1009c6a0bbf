"""What a role may do: Pulsar's grants for topics, first use for ids and groups.

One question per resource, asked by both transports before they call a coordinator:

============================  ==========================================================
operation                     needs
============================  ==========================================================
produce (a topic)             ``produce`` on the topic (29 TOPIC_AUTHORIZATION_FAILED)
fetch, pull, offsets (topic)  ``consume`` on the topic (29)
describe a topic (Metadata)   ``produce`` or ``consume`` (29); auto-creation the same
create/delete topics, configs the tenant's admin role or a superuser (29)
a transactional id            its owner, the role that used it first (53); a look
                              (describe) at one nobody owns is allowed, claims nothing
a group (join, offsets, ...)  its owner, the role that used it first (30); the same
delete a group                its owner, the tenant's admin role or a superuser (30)
release a transactional id    the tenant's admin role or a superuser (53)
a producer id in a batch      given to the caller's role by init-producer-id: one
                              given to no role (never handed out yet, a superuser's,
                              from before roles) 59 UNKNOWN_PRODUCER_ID; another
                              role's 31 CLUSTER_AUTHORIZATION_FAILED (Kafka's
                              IdempotentWrite)
client quotas (Kafka, HTTP)   the tenant's admin role or a superuser (31; HTTP 403); a
                              role sees its own over HTTP (``GET /v1/quotas``)
============================  ==========================================================

Each role may hold at most ``ROLE_QUOTA_PERCENT`` of the transactional ids and the
groups (counted in the owners table, :mod:`kop_dedup.security.quotas`): 89 past it.

A name is checked before it is claimed (:mod:`kop_dedup.coordination.names`: empty or
over ``MAX_ID_LENGTH`` characters is 42 INVALID_REQUEST for a transactional id, 24
INVALID_GROUP_ID for a group): nothing is written for a refused name. A superuser
(``superuser_roles``, the ``auth_tokens``) may do everything and claims nothing. With
authentication off every caller is :data:`~.identity.ANONYMOUS`, a superuser: no check
is made, no admin call, no table read. Grants are reused for ``auth_permissions_ttl_ms``
(:mod:`kop_dedup.pulsar.grants`), owners for ``auth_owners_ttl_ms``. A failure to read
them (Pulsar away) is the one translation's Kafka error (retriable mostly), never a
permission.
"""

from __future__ import annotations

from collections.abc import Iterable

from kop_dedup import errors
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.failures import translate
from kop_dedup.pulsar.grants import Grants
from kop_dedup.pulsar.tables import PulsarClient
from kop_dedup.security.acl_store import AclStore
from kop_dedup.security.client_quotas import ClientQuotas
from kop_dedup.security.identity import Authenticator, Identity
from kop_dedup.security.owners import Owners, validate_name
from kop_dedup.security.quotas import owner_quotas
from kop_dedup.settings import Settings

__all__ = [
    "CONSUME",
    "DESCRIBE",
    "GROUP",
    "OPEN",
    "PRODUCE",
    "PRODUCER",
    "TXN",
    "Access",
    "Authorizer",
]

PRODUCE, CONSUME, DESCRIBE = "produce", "consume", "describe"
TXN, GROUP, PRODUCER = "txn", "group", "pid"


class Authorizer:
    """Decides per :class:`Identity` (see the module's table)."""

    def __init__(
        self, grants: Grants | None, owners: Owners | None, quotas: ClientQuotas | None = None
    ) -> None:
        self._grants, self._owners = grants, owners
        self.acls = None if grants is None or owners is None else AclStore(grants, owners)
        """Kafka's ACL view of the same grants and owners; None with authentication off."""
        self.client_quotas = quotas
        """Kafka's client quotas per role (DescribeClientQuotas, ``/v1/quotas``); None:
        none kept (:data:`OPEN`)."""

    @classmethod
    def build(
        cls, auth: Authenticator, settings: Settings, admin: PulsarAdmin, client: PulsarClient
    ) -> Authorizer:
        """The sidecar's authorizer: no checks at all when authentication is off (the
        client quotas are kept either way, as Kafka keeps them without an authorizer)."""
        system = f"persistent://{settings.tenant}/{settings.system_namespace}"
        quotas = ClientQuotas(client, f"{system}/client-quotas")
        if not auth.enabled:
            return cls(None, None, quotas)
        namespace = f"{settings.tenant}/{settings.namespace}"
        return cls(
            Grants(admin, namespace, ttl_s=settings.auth_permissions_ttl_ms / 1000),
            Owners(
                client,
                f"{system}/owners",
                owner_quotas(settings),
                ttl_s=settings.auth_owners_ttl_ms / 1000,
            ),
            quotas,
        )

    async def may(self, who: Identity, action: str, topic: str) -> bool:
        """Whether ``who`` may ``action`` (produce, consume, describe) ``topic``."""
        return (await self.may_each(who, action, [topic]))[topic]

    async def may_each(self, who: Identity, action: str, topics: Iterable[str]) -> dict[str, bool]:
        """:meth:`may` for each of ``topics``, their grants read in one admin call."""
        names = list(dict.fromkeys(topics))
        if who.superuser or self._grants is None:
            return dict.fromkeys(names, True)
        try:
            grants = await self._grants.topics(names)
        except Exception as exc:
            raise translate(exc, "reading the topics' permissions in Pulsar") from exc
        wanted = {PRODUCE, CONSUME} if action == DESCRIBE else {action}
        out = {n: bool(grants[n].get(who.role, frozenset()) & wanted) for n in names}
        if not all(out.values()) and await self.is_admin(who):
            return dict.fromkeys(names, True)
        return out

    async def require(self, who: Identity, action: str, topics: Iterable[str]) -> None:
        """29 TOPIC_AUTHORIZATION_FAILED unless ``who`` may ``action`` every topic."""
        for topic, allowed in (await self.may_each(who, action, topics)).items():
            if not allowed:
                raise errors.TopicAuthorizationFailed(
                    f"role {who.role!r} has no {action!r} permission on topic {topic!r}"
                )

    async def is_admin(self, who: Identity) -> bool:
        """A superuser, or an admin role of the data namespace's tenant."""
        if who.superuser or self._grants is None:
            return True
        try:
            return who.role in await self._grants.tenant_admins()
        except Exception as exc:
            raise translate(exc, "reading the tenant's admin roles in Pulsar") from exc

    async def require_admin(self, who: Identity, what: str, error: type[errors.KafkaError]) -> None:
        if not await self.is_admin(who):
            raise error(f"role {who.role!r} may not {what}: it needs the tenant's admin role")

    async def owns(self, who: Identity, kind: str, name: str, *, claim: bool = True) -> bool:
        """Whether ``who`` owns ``name``; superusers own all. ``claim``: a use, which
        takes a name nobody owns; else a look, which a name nobody owns allows (there
        is nothing of another role's to see) without taking it."""
        if who.superuser or self._owners is None:
            return True
        if claim:  # before anything is written for it
            validate_name(kind, name)
        try:
            if claim:
                return await self._owners.claim(kind, name, who.role)
            return await self._owners.owner(kind, name) in (None, who.role)
        except Exception as exc:
            raise translate(exc, f"reading the owner of {kind} {name!r} in Pulsar") from exc

    async def require_txn(
        self, who: Identity, transactional_id: str | None, *, claim: bool = True
    ) -> None:
        """53 unless ``who`` owns ``transactional_id`` (none: nothing to check)."""
        if transactional_id and not await self.owns(who, TXN, transactional_id, claim=claim):
            raise errors.TransactionalIdAuthorizationFailed(
                f"transactional id {transactional_id!r} belongs to another role"
            )

    async def require_group(self, who: Identity, group: str | None, *, claim: bool = True) -> None:
        """30 unless ``who`` owns ``group``."""
        if group and not await self.owns(who, GROUP, group, claim=claim):
            raise errors.GroupAuthorizationFailed(f"group {group!r} belongs to another role")

    async def claim_producer(self, who: Identity, producer_id: int) -> None:
        """A producer id init-producer-id handed to ``who`` is its role's. One another
        role holds is taken over: the coordinator answers a transactional id's own
        producer id (at a new epoch, fencing the last producer) to the id's owner, and
        the id changed hands (released by an admin, by DeleteAcls, or through another
        node), so the old owner's claim on its producer id goes with it."""
        if producer_id < 0 or who.superuser or self._owners is None:
            return
        pid = str(producer_id)
        try:
            if not await self._owners.claim(PRODUCER, pid, who.role):
                await self._owners.release(PRODUCER, pid)
                await self._owners.claim(PRODUCER, pid, who.role)
        except Exception as exc:
            raise translate(exc, f"giving producer id {pid} to role {who.role!r}") from exc

    async def require_producers(self, who: Identity, producer_ids: Iterable[int]) -> None:
        """Refuse a batch of a producer id init-producer-id did not give ``who``'s role.

        Ids are handed out in order, so an id nobody was given yet is the next caller's:
        a batch written with it first would have that caller's first records answered
        46 and dropped. So an id given to no role (not handed out yet, far above any, a
        superuser's, from before roles) is 59 UNKNOWN_PRODUCER_ID (call init-producer-id
        for one), and another role's is 31 CLUSTER_AUTHORIZATION_FAILED (Kafka's
        IdempotentWrite: its batches could fence that role's producer). Decided on the
        owners table read to its end (an owner never changes once written, and the id's
        owner is written before init-producer-id answers), so every node of a cluster
        decides alike."""
        if who.superuser or self._owners is None:
            return
        for pid in sorted({p for p in producer_ids if p >= 0}):
            try:
                owner = await self._owners.owner(PRODUCER, str(pid))
            except Exception as exc:
                raise translate(exc, f"reading the owner of producer id {pid}") from exc
            if owner is None:
                raise errors.UnknownProducerId(
                    f"producer id {pid} was not handed out to role {who.role!r}: "
                    "use one init-producer-id (InitProducerId) gave it"
                )
            if owner != who.role:
                raise errors.ClusterAuthorizationFailed(
                    f"producer id {pid} belongs to another role"
                )

    async def visible(self, who: Identity, kind: str, names: Iterable[str]) -> list[str]:
        """Of ``names``, those ``who`` may see (its own; all for a superuser)."""
        names = list(names)
        if who.superuser or self._owners is None:
            return names
        try:
            owners = await self._owners.owners(kind)
        except Exception as exc:
            raise translate(exc, "reading owners in Pulsar") from exc
        return [n for n in names if owners.get(n) == who.role]

    @property
    def has_owners(self) -> bool:
        """Names have owners (authentication on)."""
        return self._owners is not None

    async def owner(self, kind: str, name: str) -> str | None:
        """The role owning ``name`` (None: nobody, or authentication off)."""
        if self._owners is None:
            return None
        try:
            return await self._owners.owner(kind, name)
        except Exception as exc:
            raise translate(exc, f"reading the owner of {kind} {name!r} in Pulsar") from exc

    async def released(self, kind: str, name: str) -> str | None:
        """``name`` is gone (a deleted or expired group or transactional id, an admin's
        release): its next user claims it. The owner it had (None: nobody)."""
        if self._owners is None:
            return None
        try:
            return await self._owners.release(kind, name)
        except Exception as exc:
            raise translate(exc, f"releasing {kind} {name!r} in Pulsar") from exc

    async def claimed_before(self, kind: str, before_ms: int) -> list[str]:
        """The ``kind`` names claimed before ``before_ms`` (epoch ms); none with
        authentication off."""
        if self._owners is None:
            return []
        try:
            return await self._owners.claimed_before(kind, before_ms)
        except Exception as exc:
            raise translate(exc, "reading owners in Pulsar") from exc

    async def may_delete_group(self, who: Identity, group: str) -> None:
        """30 unless ``who`` owns ``group`` (a name nobody owns is not the caller's) or
        is an admin (Kafka's Delete on the Group resource)."""
        if who.superuser or self._owners is None:
            return
        if await self.owner(GROUP, group) != who.role and not await self.is_admin(who):
            raise errors.GroupAuthorizationFailed(
                f"role {who.role!r} may not delete group {group!r}: it needs to own the "
                "group or the tenant's admin role"
            )

    async def close(self) -> None:
        if self.client_quotas is not None:
            await self.client_quotas.close()
        if self._owners is not None:
            await self._owners.close()


OPEN = Authorizer(None, None)
"""Lets everyone do everything (authentication off)."""


class Access:
    """One caller's questions, its identity bound (what a transport's route holds).

    >>> await Access(authorizer, who).require_txn("payments-1")
    """

    def __init__(self, authorizer: Authorizer, who: Identity) -> None:
        self.authorizer, self.who = authorizer, who

    async def require(self, action: str, topics: Iterable[str]) -> None:
        await self.authorizer.require(self.who, action, topics)

    async def may_each(self, action: str, topics: Iterable[str]) -> dict[str, bool]:
        return await self.authorizer.may_each(self.who, action, topics)

    async def require_txn(self, transactional_id: str | None, *, claim: bool = True) -> None:
        await self.authorizer.require_txn(self.who, transactional_id, claim=claim)

    async def require_group(self, group: str | None, *, claim: bool = True) -> None:
        await self.authorizer.require_group(self.who, group, claim=claim)

    async def visible(self, kind: str, names: Iterable[str]) -> list[str]:
        return await self.authorizer.visible(self.who, kind, names)

    async def claim_producer(self, producer_id: int) -> None:
        await self.authorizer.claim_producer(self.who, producer_id)
