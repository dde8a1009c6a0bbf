"""Pulsar's permissions, read through its admin API and reused for a stated while.

What ``pulsar-admin namespaces grant-permission`` and ``topics grant-permission`` store
(the broker keeps them whether or not it enforces authorization itself), and the
tenant's ``adminRoles``:

- ``GET /admin/v2/namespaces/{tenant}/{namespace}``: the namespace's policies, whose
  ``auth_policies`` hold the namespace's grants (``namespace_auth``) and every topic's
  (``destination_auth``, by full topic name). A topic's grants are its own and the
  namespace's merged, as Pulsar's own authorization provider reads them: one call
  answers for every topic asked about at once (:meth:`Grants.topics`), so a Metadata
  naming 200 topics asks once;
- ``GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/permissions``: a topic's
  grants, the namespace's merged in (Pulsar answers both), asked per topic only when
  the policies carry no ``auth_policies`` (a broker that answers them otherwise); 404
  for a topic that does not exist, whose grants are then the namespace's;
- ``GET /admin/v2/namespaces/{tenant}/{namespace}/permissions``;
- ``GET /admin/v2/tenants/{tenant}``: ``adminRoles``.

Kafka's ACL APIs read all of them at once from the namespace's policies
(``GET /admin/v2/namespaces/{tenant}/{namespace}``: ``auth_policies``) and write them
with ``POST`` (the role's whole set of actions) and ``DELETE`` on the same paths
(:meth:`Grants.acl_state`, :meth:`Grants.set_actions`); a write forgets what this node
cached.

Every answer is reused for ``ttl_s`` (``auth_permissions_ttl_ms``): a grant or a
revocation counts within that long (a topic not asked about within it is read afresh).
Concurrent askers of one path share one call. At most ``max_cached`` answers are kept,
the least recently used dropped first (:class:`Recent`).

>>> grants = Grants(admin, "public/kafka", ttl_s=10.0)
>>> await grants.topic("orders")     # role -> actions
{'alice': frozenset({'produce', 'consume'})}
"""

from __future__ import annotations

import asyncio
import functools
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.naming import validate_topic

__all__ = ["Grants", "Recent", "RoleActions"]

RoleActions = Mapping[str, frozenset[str]]
"""role -> the actions granted to it (``produce``, ``consume``, ...)."""

MAX_CACHED = 10_000


def _actions(doc: Any) -> dict[str, frozenset[str]]:
    if not isinstance(doc, dict):
        return {}
    return {
        str(role): frozenset(str(a) for a in actions)
        for role, actions in doc.items()
        if isinstance(actions, list)
    }


class Recent:
    """At most ``capacity`` entries, the least recently used dropped first (a full
    cache keeps its hot entries; one wiped whole made every caller ask again at once).

    >>> cache = Recent(2)
    >>> cache.put("a", 1); cache.put("b", 2); cache.get("a"); cache.put("c", 3)
    >>> cache.get("b") is None   # "a" was used after "b"
    True
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Any:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def put(self, key: str, value: Any) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


class Grants:
    """The grants of one namespace's topics, cached for ``ttl_s``."""

    def __init__(
        self,
        admin: PulsarAdmin,
        namespace_path: str,
        *,
        ttl_s: float,
        max_cached: int = MAX_CACHED,
    ) -> None:
        self._admin, self._ns, self._ttl = admin, namespace_path, ttl_s
        self.ttl_s = ttl_s
        self._tenant = namespace_path.split("/", 1)[0]
        self._cache = Recent(max_cached)
        self._pending: dict[str, asyncio.Future[Any]] = {}

    async def topic(self, topic: str) -> RoleActions:
        """Who may do what on Kafka topic ``topic`` (its grants and its namespace's);
        InvalidTopic (17) for a name Kafka does not allow, before any admin call."""
        return (await self.topics([topic]))[topic]

    async def topics(self, topics: Iterable[str]) -> dict[str, RoleActions]:
        """:meth:`topic` for many topics: those not reused are read in one call."""
        names = list(dict.fromkeys(topics))
        for name in names:
            validate_topic(name)
        out: dict[str, RoleActions] = {}
        now = time.monotonic()
        for name in names:
            hit = self._cache.get(f"topic:{name}")
            if hit is not None and now - hit[0] < self._ttl:
                out[name] = hit[1]
        missing = [n for n in names if n not in out]
        if not missing:
            return out
        auth = await self._shared("policies", self._auth_policies)
        for name in missing:
            if auth is None:  # no auth_policies in the namespace's policies: ask the topic
                out[name] = await self._cached(
                    f"topic:{name}", functools.partial(self._topic, name)
                )
                continue
            own, merged = auth[0].get(f"persistent://{self._ns}/{name}", {}), dict(auth[1])
            for role, actions in own.items():
                merged[role] = merged.get(role, frozenset()) | actions
            self._cache.put(f"topic:{name}", (now, merged))
            out[name] = merged
        return out

    async def namespace(self) -> RoleActions:
        return await self._cached("ns", self._namespace)  # type: ignore[no-any-return]

    async def tenant_admins(self) -> frozenset[str]:
        """The tenant's ``adminRoles``."""
        return await self._cached("tenant", self._tenant_admins)  # type: ignore[no-any-return]

    async def _auth_policies(
        self,
    ) -> tuple[dict[str, dict[str, frozenset[str]]], dict[str, frozenset[str]]] | None:
        """(full topic name -> its own grants, the namespace's grants); None when the
        namespace's policies carry no ``auth_policies``."""
        doc = await self._admin.get_json(f"/admin/v2/namespaces/{self._ns}")
        auth = doc.get("auth_policies") if isinstance(doc, dict) else None
        if not isinstance(auth, dict):
            return None
        topics = auth.get("destination_auth")
        own = {
            str(name): _actions(grants)
            for name, grants in (topics.items() if isinstance(topics, dict) else ())
        }
        return own, _actions(auth.get("namespace_auth"))

    async def acl_state(self) -> tuple[RoleActions, dict[str, RoleActions]]:
        """(the namespace's grants, each Kafka topic's own grants), read now (no cache)."""
        doc = await self._admin.get_json(f"/admin/v2/namespaces/{self._ns}")
        auth = doc.get("auth_policies") if isinstance(doc, dict) else None
        auth = auth if isinstance(auth, dict) else {}
        prefix = f"persistent://{self._ns}/"
        destinations = auth.get("destination_auth")
        topics: dict[str, RoleActions] = {
            str(name).removeprefix(prefix): _actions(roles)
            for name, roles in (destinations if isinstance(destinations, dict) else {}).items()
            if str(name).startswith(prefix)
        }
        return _actions(auth.get("namespace_auth")), topics

    async def set_actions(self, topic: str | None, role: str, actions: frozenset[str]) -> None:
        """Make ``role`` hold exactly ``actions`` on Kafka topic ``topic`` (None: on the
        namespace); none: revoke. AdminError 404 when the topic does not exist."""
        base = f"/admin/v2/namespaces/{self._ns}"
        if topic is not None:
            validate_topic(topic)
            base = f"/admin/v2/persistent/{self._ns}/{urllib.parse.quote(topic, safe='')}"
        path = f"{base}/permissions/{urllib.parse.quote(role, safe='')}"
        try:
            if actions:
                await self._admin.request("POST", path, json=sorted(actions))
            else:
                await self._admin.request("DELETE", path)
        finally:
            self._cache.clear()

    async def _topic(self, topic: str) -> RoleActions:
        path = f"/admin/v2/persistent/{self._ns}/{urllib.parse.quote(topic, safe='')}/permissions"
        try:
            return _actions(await self._admin.get_json(path))
        except AdminError as exc:
            if exc.status != 404:
                raise
        return await self.namespace()

    async def _namespace(self) -> RoleActions:
        return _actions(await self._admin.get_json(f"/admin/v2/namespaces/{self._ns}/permissions"))

    async def _tenant_admins(self) -> frozenset[str]:
        doc = await self._admin.get_json(f"/admin/v2/tenants/{self._tenant}")
        roles = doc.get("adminRoles") if isinstance(doc, dict) else None
        return frozenset(str(r) for r in roles or ())

    async def _cached(self, key: str, load: Any) -> Any:
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        value = await self._shared(key, load)
        self._cache.put(key, (now, value))
        return value

    async def _shared(self, key: str, load: Any) -> Any:
        """``load()``, one call shared by concurrent askers of ``key``."""
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(load())
            self._pending[key] = pending
            pending.add_done_callback(lambda _f: self._pending.pop(key, None))
        return await asyncio.shield(pending)
