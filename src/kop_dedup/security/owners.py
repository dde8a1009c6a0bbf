"""Who owns a transactional id, a consumer group or a producer id: the role that used
it first (a producer id: the role it was given to).

Kept in Pulsar like the sidecar's other state: a keyed table (``<system
namespace>/owners``), one record per claimed name (``txn:<id>``, ``group:<id>``,
``pid:<producer id>``; the value: the owner role in UTF-8). Every sidecar reads it;
any may write it.

The *first* record of a key in topic order owns it, so two sidecars that claim one
name at once agree on the winner once each has read its own claim back; the loser
then writes the winner's claim again, so that compaction (which keeps the latest
record of a key) keeps the winner too. A tombstone (a deleted group) frees the name.

A claim costs a broker round trip only the first time a name is seen: an owner never
changes while the name lives, so a name already read is decided locally.

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
from collections.abc import Mapping

from kop_dedup.pulsar.tables import KeyedTable, KeyedWriter, PulsarClient, TableRecord
from kop_dedup.security.quotas import RoleQuota

__all__ = ["Owners"]

log = logging.getLogger(__name__)


class Owners:
    """The owners table (see the module)."""

    def __init__(
        self, client: PulsarClient, topic: str, quotas: Mapping[str, RoleQuota] | None = None
    ) -> None:
        self._owners: dict[str, str] = {}
        self._quotas = dict(quotas or {})
        self._held: dict[tuple[str, str], int] = {}  # (kind, role) -> names owned
        self._table = KeyedTable(client, topic, self._apply, read_compacted=False)
        self._writer = KeyedWriter(client, topic)

    def _apply(self, record: TableRecord) -> None:
        key, kind = record.key, record.key.partition(":")[0]
        if record.value is None:
            role = self._owners.pop(key, None)
            if role is not None:
                self._count(kind, role, -1)
        elif key not in self._owners:
            role = record.value.decode("utf-8")
            self._owners[key] = role
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
        if key not in self._owners:
            await self._table.barrier()
        return self._owners.get(key)

    async def owners(self, kind: str) -> dict[str, str]:
        """Every ``kind`` name's owner, caught up with Pulsar."""
        await self._table.barrier()
        prefix = f"{kind}:"
        return {k[len(prefix) :]: v for k, v in self._owners.items() if k.startswith(prefix)}

    async def claim(self, kind: str, name: str, role: str) -> bool:
        """True when ``role`` owns ``name`` (claiming it if nobody does); 89
        THROTTLING_QUOTA_EXCEEDED when ``role`` may claim no more of ``kind``."""
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

    async def release(self, kind: str, name: str) -> None:
        """Forget ``name``'s owner (a deleted group): the next user claims it."""
        await self._writer.tombstone(f"{kind}:{name}")
        await self._table.barrier()

    async def close(self) -> None:
        await self._writer.close()
        await self._table.close()
