"""Kafka's client quotas per role, kept in Pulsar so that every node agrees.

A keyed table, ``<system namespace>/client-quotas``: one record per user entity (key
``user:<role>``, or ``user-default`` for the default user), its value the entity's
quotas as JSON (``{"producer_byte_rate": 1048576.0}``); a tombstone removes the last
one. Any node writes it (AlterClientQuotas, ``PUT /v1/quotas``), every node reads it:
a change is seen by the other nodes within :data:`REFRESH_S` (the throttle reads the
local view, refreshed in the background), and at once by a describe (read to the end).
Two alterations of one entity at once on two nodes: the later write wins whole.

>>> quotas = ClientQuotas(client, "persistent://public/kop-dedup-system/client-quotas")
>>> await quotas.alter("alice", {"producer_byte_rate": 1048576.0}, [])
>>> await quotas.describe()
{'alice': {'producer_byte_rate': 1048576.0}}
>>> quotas.limit("alice", "producer_byte_rate")   # the role's own, else the default's
1048576.0
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping

from kop_dedup.protocol.client_quotas import values_of
from kop_dedup.pulsar.tables import KeyedTable, KeyedWriter, PulsarClient, TableRecord

__all__ = ["REFRESH_S", "ClientQuotas"]

log = logging.getLogger(__name__)

REFRESH_S = 1.0
"""How stale the throttle's view of the table may grow before it is read again."""
_DEFAULT = "user-default"


def _key(user: str | None) -> str:
    return _DEFAULT if user is None else f"user:{user}"


class ClientQuotas:
    """The client-quotas table (see the module)."""

    def __init__(self, client: PulsarClient, topic: str) -> None:
        self._quotas: dict[str | None, dict[str, float]] = {}
        self._table = KeyedTable(client, topic, self._apply, read_compacted=False)
        self._writer = KeyedWriter(client, topic)
        self._read_at = -REFRESH_S
        self._refreshing: asyncio.Task[None] | None = None

    def _apply(self, record: TableRecord) -> None:
        if record.key == _DEFAULT:
            user: str | None = None
        elif record.key.startswith("user:"):
            user = record.key[len("user:") :]
        else:
            return
        if record.value is None:
            self._quotas.pop(user, None)
            return
        stored = json.loads(record.value)
        if not isinstance(stored, dict):  # the table skips a ValueError's record, warning
            raise ValueError(  # noqa: TRY004 (a TypeError would stop the table's reader)
                f"client quotas of {record.key!r} are not a JSON object"
            )
        values = values_of(stored)
        if values:
            self._quotas[user] = values
        else:
            self._quotas.pop(user, None)

    async def describe(self) -> dict[str | None, dict[str, float]]:
        """Every entity's quotas (None: the default user), read to the end of the table."""
        await self._table.barrier()
        self._read_at = time.monotonic()
        return {user: dict(values) for user, values in self._quotas.items()}

    async def alter(
        self, user: str | None, put: Mapping[str, float], remove: Iterable[str]
    ) -> dict[str, float]:
        """Set ``put`` and remove ``remove`` on ``user``'s quotas (None: the default's);
        durable when it returns; the entity's quotas after it."""
        current = (await self.describe()).get(user, {})
        for key in remove:
            current.pop(key, None)
        current.update(put)
        if current:
            await self._writer.send(_key(user), json.dumps(current).encode())
        else:
            await self._writer.tombstone(_key(user))
        await self._table.barrier()
        return current

    def limit(self, role: str, key: str) -> float | None:
        """``role``'s quota ``key`` (its own, else the default user's; None: no quota),
        from the local view; a view older than :data:`REFRESH_S` is read again in the
        background (the answer is not held up for it)."""
        if time.monotonic() - self._read_at >= REFRESH_S and (
            self._refreshing is None or self._refreshing.done()
        ):
            self._read_at = time.monotonic()
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        own = self._quotas.get(role)
        if own is not None and key in own:
            return own[key]
        return self._quotas.get(None, {}).get(key)

    async def _refresh(self) -> None:
        try:
            await self._table.barrier()
        except Exception as exc:  # the throttle goes on with the view it has
            log.warning("client quotas not read from %s: %r", self._table.topic, exc)

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(BaseException):
                await self._refreshing
        await self._writer.close()
        await self._table.close()
