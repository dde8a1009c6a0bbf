"""Membership: which sidecars are alive, as Pulsar sees them.

Every node of a cluster holds one consumer on the control topic
``<system namespace>/cluster-members``, subscription ``members`` (Shared; nothing is
ever published there), named ``node-<id>`` and carrying its identity as consumer
properties: its node id, its advertised Kafka address, the URL of its HTTP API and
the instance of this run. The **live members are the consumers the broker lists** in
the topic's stats: Pulsar decides who is alive, not a store of ours.

- A node that stops closes its consumer: gone from the next listing.
- A node that dies (SIGKILL, a crash) loses its TCP connection: the broker removes its
  consumer at once, gone from the next listing.
- A node that hangs (SIGSTOP, a network partition) stays listed until the broker's
  keep-alive gives up on its connection (``keepAliveIntervalSeconds``, 30 s by default:
  up to about a minute).
- A node that cannot reach the admin API keeps the last listing it read (a broker
  restart does not scatter the cluster); one whose own consumer is not listed keeps its
  view for ``absent_s`` (its consumer reconnecting after a broker restart), then owns
  nothing until it is listed again.

Each node lists the members every ``refresh_s`` (one admin call) and hands every
view to its listeners (:mod:`kop_dedup.cluster.ownership`). Two nodes agree
once both have listed the same members: within ``refresh_s`` of a change.

A node id must be unique: a second process started with an id in use is refused at
start (:class:`NodeIdInUse`), and while two are listed the one started first counts.

Nodes must agree on security: each is listed with the fingerprint of its
authentication (:mod:`kop_dedup.security.fingerprint`). A node that finds a member
with another fingerprint when it joins is refused (:class:`SecurityMismatch`, naming
each setting that differs), whichever started first: of two that start side by side,
at least one lists the other. A running node leaves such a member out of its views
(it owns nothing here, and nothing is forwarded to it) and says so in its log.

>>> membership = Membership(client, admin, "persistent://public/sys/cluster-members")
>>> view = await membership.join(me)    # listed, and the first view read
>>> membership.start()                  # listing every refresh_s from now on
>>> await membership.leave()            # the others see this node gone next listing
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from kop_dedup.cluster.placement import ClusterView, Member
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.presence import be_listed
from kop_dedup.pulsar.tables import PulsarClient, discard
from kop_dedup.security.fingerprint import differences

__all__ = [
    "SUBSCRIPTION",
    "Membership",
    "NodeIdInUse",
    "SecurityMismatch",
    "default_node_id",
    "member_from",
    "properties_of",
]

log = logging.getLogger(__name__)

SUBSCRIPTION = "members"
_JOIN_WAIT_S = 30.0

Listener = Callable[[ClusterView], Awaitable[None]]


class NodeIdInUse(RuntimeError):
    """Another live node already has this node id."""


class SecurityMismatch(RuntimeError):
    """A live node of this cluster authenticates differently from this one."""


def default_node_id(host: str, port: int, peer_url: str) -> int:
    """A node id derived from the node's addresses, its advertised Kafka address and the
    URL its peers reach it at (stable while they are): what a node without
    ``KOP_DEDUP_NODE_ID`` uses. The peer URL tells apart the per-pod sidecars, whose Kafka
    listeners all advertise the same loopback address; the whole 31-bit range keeps two
    of a few hundred pods from drawing the same id (1 in about 10,000 at 600 pods)."""
    return zlib.crc32(f"{host}:{port} {peer_url}".encode()) % (2**31 - 1)


def properties_of(member: Member) -> dict[str, str]:
    """The consumer properties a node is listed with."""
    return {
        "nodeId": str(member.node_id),
        "kafka": f"{member.host}:{member.port}",
        "peer": member.peer_url,
        "instance": member.instance,
        "startedMs": str(member.started_ms),
        "security": member.security,
    }


def member_from(metadata: dict[str, Any] | None) -> Member | None:
    """The member a listed consumer's properties describe; None for anything else (a
    consumer of an older or foreign version, or one an operator attached by hand)."""
    if not metadata:
        return None
    try:
        host, _, port = str(metadata["kafka"]).rpartition(":")
        return Member(
            node_id=int(metadata["nodeId"]),
            host=host.strip("[]"),
            port=int(port),
            peer_url=str(metadata.get("peer", "")),
            instance=str(metadata.get("instance", "")),
            started_ms=int(metadata.get("startedMs", 0)),
            security=str(metadata.get("security", "")),
        )
    except (KeyError, ValueError):
        return None


class Membership:
    def __init__(
        self,
        client: PulsarClient,
        admin: PulsarAdmin,
        topic: str,
        *,
        refresh_s: float = 1.0,
        absent_s: float = 5.0,
    ) -> None:
        self.topic, self.refresh_s, self.absent_s = topic, refresh_s, absent_s
        self._absent_since: float | None = None
        self._me: Member | None = None
        self._client, self._admin = client, admin
        self._consumer: Any = None
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self.view = ClusterView.of([])
        """The members as last listed (empty before :meth:`join`)."""
        self.changes = 0
        """Views handed to the listeners (membership changes seen)."""
        self.listed_at = 0.0
        """When the members were last listed (``time.monotonic()``; 0: never)."""
        self._leaving = False
        self._begun = self._published = 0  # listings begun; the latest begun of those published
        self._excluded: set[str] = set()
        self.excluded: frozenset[int] = frozenset()
        """The node ids listed last with another security fingerprint (left out)."""

    @property
    def me(self) -> Member:
        """This node (set by :meth:`join`)."""
        if self._me is None:
            raise RuntimeError("this node has not joined its cluster yet")
        return self._me

    @property
    def joined(self) -> bool:
        """Whether this node is a member in the current view."""
        return self._me is not None and self.view.member(self._me.node_id) == self._me

    def listen(self, listener: Listener) -> None:
        """Call ``listener`` with the view after every listing (in order, one at a time)."""
        self._listeners.append(listener)

    async def join(self, me: Member, wait_s: float = _JOIN_WAIT_S) -> ClusterView:
        """Become listed as ``me`` and read the first view that lists this node.
        NodeIdInUse when a node started earlier holds the same id; SecurityMismatch when
        a listed node authenticates differently."""
        self._me = me
        self._consumer = await be_listed(
            self._client, self.topic, SUBSCRIPTION, f"node-{me.node_id}", properties_of(me)
        )
        deadline = time.monotonic() + wait_s
        while True:
            listed = await self._list()
            other = next(
                (
                    m
                    for m in listed
                    if m.node_id == self.me.node_id and m.instance != self.me.instance
                ),
                None,
            )
            if other is not None and (other.started_ms, other.instance) < (
                self.me.started_ms,
                self.me.instance,
            ):
                await self.leave()
                raise NodeIdInUse(
                    f"node id {self.me.node_id} is in use by the node at {other.host}:"
                    f"{other.port} ({other.peer_url}); give each node its own "
                    "KOP_DEDUP_NODE_ID"
                )
            if self.me in listed:
                await self._refuse_mismatched(listed)
                await self._publish(ClusterView.of(self._agreeing(listed)))
                return self.view
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic} does not list this node after {wait_s:g} s")
            await asyncio.sleep(0.05)

    def start(self) -> None:
        """List the members every ``refresh_s`` from now on."""
        self._task = asyncio.create_task(self._watch(), name="cluster-members")

    async def refresh(self) -> ClusterView:
        """List the members now and hand the view to the listeners. A listing that leaves
        this node out while it is a member (its consumer reconnecting: a broker restart,
        a topic reloaded) keeps the last view for up to ``absent_s``: a node does not give
        up its partitions for a blip, only once Pulsar has not listed it for that long.

        Listings run side by side (the timer's, and one per forward that failed): one
        answered after a listing begun later is not published (it could bring back a
        node that just died, and move partitions back and forth: a load cut short)."""
        self._begun += 1
        begun = self._begun
        listed = await self._list()
        if begun < self._published:
            return self.view
        if self._me is not None and self.joined and self._me not in listed:
            now = time.monotonic()
            if self._absent_since is None:
                self._absent_since = now
                log.info("cluster: this node is not listed (reconnecting?); keeping its view")
            if now - self._absent_since < self.absent_s:
                return self.view
        else:
            self._absent_since = None
        self._published = begun
        await self._publish(ClusterView.of(self._agreeing(listed)))
        return self.view

    async def _refuse_mismatched(self, listed: list[Member]) -> None:
        me = self.me
        for other in listed:
            if other.instance == me.instance:
                continue
            differ = differences(me.security, other.security, f"node {other.node_id}")
            if differ:
                await self.leave()
                namespace = self.topic.removeprefix("persistent://").rsplit("/", 1)[0]
                raise SecurityMismatch(
                    f"node {other.node_id} at {other.host}:{other.port} ({other.peer_url}) "
                    f"authenticates differently: {'; '.join(differ)}. Every node sharing "
                    f"{namespace} must authenticate alike (the same "
                    "tokens, roles file, token keys and superuser roles), or a client's "
                    "request forwarded between them would be authenticated by the other "
                    "node's rules; this node does not join"
                )

    def _agreeing(self, listed: list[Member]) -> list[Member]:
        """The members with this node's security fingerprint (all before it joined):
        another is left out of the view, and logged once per run of it."""
        if self._me is None:
            return listed
        mine = self._me.security
        for other in listed:
            if other.security != mine and other.instance not in self._excluded:
                self._excluded.add(other.instance)
                log.error(
                    "cluster: node %d (%s:%d) authenticates differently (%s): it is left "
                    "out of this node's cluster (owns nothing, nothing is forwarded to it); "
                    "stop it or give it this node's security settings",
                    other.node_id,
                    other.host,
                    other.port,
                    "; ".join(differences(mine, other.security, f"node {other.node_id}")),
                )
        self.excluded = frozenset(m.node_id for m in listed if m.security != mine)
        return [m for m in listed if m.security == mine]

    async def _list(self) -> list[Member]:
        path = self.topic.removeprefix("persistent://")
        try:
            stats = await self._admin.get_json(f"/admin/v2/persistent/{path}/stats")
        except AdminError as exc:
            if exc.status == 404:
                return []
            raise
        self.listed_at = time.monotonic()
        consumers = (stats.get("subscriptions") or {}).get(SUBSCRIPTION, {}).get("consumers")
        found = (member_from(c.get("metadata")) for c in consumers or [])
        return [m for m in found if m is not None]

    async def _publish(self, view: ClusterView) -> None:
        """Take ``view`` as the current one and hand it to the listeners: after every
        listing, changed or not (they are idempotent; a partition fenced away while still
        this node's is taken again that way)."""
        if view != self.view:
            before, self.view = self.view, view
            self.changes += 1
            log.info(
                "cluster: %d node(s) live: %s (was %s)",
                len(view.members),
                ", ".join(f"{m.node_id}@{m.host}:{m.port}" for m in view.members) or "none",
                ", ".join(str(n) for n in before.node_ids) or "none",
            )
        for listener in self._listeners:
            try:
                await listener(self.view)
            except Exception:  # one listener's failure is not the others'
                log.exception("cluster: a listener failed on the new view")

    async def _watch(self) -> None:
        while not self._leaving:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the admin API away: keep the last view
                log.debug("cluster: listing the members failed: %r", exc)

    async def stop_watching(self) -> None:
        self._leaving = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def leave(self) -> None:
        """Stop being listed (the others see it at their next listing)."""
        await self.stop_watching()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await discard(consumer)
