"""Who owns a transactional id, a consumer group or a producer id: the role that used
it first (a producer id: the role it was given to).

Kept in Pulsar like the sidecar's other state: a keyed table (``<system
namespace>/owners``), one record per claimed name (``txn:<id>``, ``group:<id>``,
``pid:<producer id>``; the value: the owner role in UTF-8). Every sidecar reads it;
any may write it. Names are checked before they are claimed (:func:`validate_name`: at
most :data:`~kop_dedup.coordination.names.MAX_ID_LENGTH` characters, not empty), by every
caller of :meth:`Owners.claim` (first uses, Kafka ACLs).

The *first* record of a key in topic order owns it, so two sidecars that claim one
name at once agree on the winner once each has read its own claim back; the loser
then writes the winner's claim again, so that compaction (which keeps the latest
record of a key) keeps the winner too. A tombstone (a deleted group) frees the name.

A claim costs a broker round trip the first time a name is seen, and again once the
table was last read more than ``ttl_s`` ago: an owner changes only when the name is
released (an admin's release, a deleted or expired group, an expired transactional id),
possibly through another node, and such a release takes effect here within ``ttl_s``.

Per-role quotas (:mod:`kop_dedup.security.quotas`) are counted here, from the table
every node reads: a role claiming one more name of a kind than its quota allows is 89
THROTTLING_QUOTA_EXCEEDED. Two claims of one role at once on two nodes may both pass
(the count is read before the claim is written): a quota can be passed by the claims in
flight at once, never more.

>>> owners = Owners(client, "persistent://public/kop-dedup-system/owners")
>>> await owners.claim("txn", "payments-1", "alice")   # first use: alice owns it
True
>>> await owners.claim("txn", "payments-1", "bob")
False
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from kop_dedup.coordination import names
from kop_dedup.pulsar.tables import KeyedTable, KeyedWriter, PulsarClient, TableRecord
from kop_dedup.security.quotas import RoleQuota

__all__ = ["Owners", "validate_name"]

log = logging.getLogger(__name__)


def validate_name(kind: str, name: str) -> None:
    """Kafka's error for a transactional id (42) or group id (24) that may not be claimed:
    empty, or over :data:`~kop_dedup.coordination.names.MAX_ID_LENGTH` characters."""
    if kind == "txn":
        names.validate_transactional_id(name)
    elif kind == "group":
        names.validate_group_id(name)


class Owners:
    """The owners table (see the module)."""

    def __init__(
        self,
        client: PulsarClient,
        topic: str,
        quotas: Mapping[str, RoleQuota] | None = None,
        *,
        ttl_s: float = 10.0,
    ) -> None:
        self._owners: dict[str, str] = {}
        self._since: dict[str, int] = {}  # when the owner's claim was written (epoch ms)
        self._ttl_s = ttl_s
        self._quotas = dict(quotas or {})
        self._held: dict[tuple[str, str], int] = {}  # (kind, role) -> names owned
        self._table = KeyedTable(client, topic, self._apply, read_compacted=False)
        self._writer = KeyedWriter(client, topic)

    def _apply(self, record: TableRecord) -> None:
        key, kind = record.key, record.key.partition(":")[0]
        if record.value is None:
            role = self._owners.pop(key, None)
            self._since.pop(key, None)
            if role is not None:
                self._count(kind, role, -1)
        elif key not in self._owners:
            role = record.value.decode("utf-8")
            self._owners[key] = role
            self._since[key] = record.publish_time_ms
            self._count(kind, role, 1)

    def _count(self, kind: str, role: str, step: int) -> None:
        held = self._held.get((kind, role), 0) + step
        if held > 0:
            self._held[(kind, role)] = held
        else:
            self._held.pop((kind, role), None)

    def held(self, kind: str, role: str) -> int:
        """How many ``kind`` names ``role`` owns (as read so far)."""
        return self._held.get((kind, role), 0)

    async def owner(self, kind: str, name: str) -> str | None:
        """The role owning ``name`` (read from Pulsar when not known here)."""
        key = f"{kind}:{name}"
        if key not in self._owners or self._stale():
            await self._table.barrier()
        return self._owners.get(key)

    def _stale(self) -> bool:
        """The table was last read to its end more than ``ttl_s`` ago (or never)."""
        read = self._table.caught_up_from
        return read is None or time.monotonic() - read > self._ttl_s

    async def owners(self, kind: str) -> dict[str, str]:
        """Every ``kind`` name's owner, caught up with Pulsar."""
        await self._table.barrier()
        prefix = f"{kind}:"
        return {k[len(prefix) :]: v for k, v in self._owners.items() if k.startswith(prefix)}

    async def claimed_before(self, kind: str, before_ms: int) -> list[str]:
        """The ``kind`` names whose owner claimed them before ``before_ms`` (epoch ms, the
        broker's publish time), caught up with Pulsar."""
        await self._table.barrier()
        prefix = f"{kind}:"
        return [
            k[len(prefix) :]
            for k, at in self._since.items()
            if k.startswith(prefix) and at < before_ms
        ]

    async def claim(self, kind: str, name: str, role: str) -> bool:
        """True when ``role`` owns ``name`` (claiming it if nobody does); 89
        THROTTLING_QUOTA_EXCEEDED when ``role`` may claim no more of ``kind``. A name
        :func:`validate_name` refuses raises its Kafka error, and nothing is written."""
        validate_name(kind, name)
        key = f"{kind}:{name}"
        owner = await self.owner(kind, name)
        if owner is None:
            quota = self._quotas.get(kind)
            if quota is not None:
                quota.check(role, self.held(kind, role))
            await self._writer.send(key, role.encode("utf-8"))
            await self._table.barrier()
            owner = self._owners.get(key)
            if owner is not None and owner != role:
                log.info(
                    "%s %r: claimed by %r at the same time; %r owns it", kind, name, role, owner
                )
                await self._writer.send(key, owner.encode("utf-8"))
        return owner == role

    async def release(self, kind: str, name: str) -> str | None:
        """Forget ``name``'s owner (a deleted or expired group or transactional id, an
        admin's release): the next user claims it. The owner it had (None: nobody's, and
        nothing is written)."""
        key = f"{kind}:{name}"
        await self._table.barrier()
        owner = self._owners.get(key)
        if owner is not None:
            await self._writer.tombstone(key)
            await self._table.barrier()
        return owner

    async def close(self) -> None:
        await self._writer.close()
        await self._table.close()
