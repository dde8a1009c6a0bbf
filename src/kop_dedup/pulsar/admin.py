"""Pulsar admin REST: namespaces, deduplication, partitioned topics, broker stats.

Thin async wrapper over the few admin endpoints the sidecar needs, with the
partition counts it learns cached. Errors become :class:`AdminError` with the
status and the broker's reason, or Kafka errors where a produce depends on
them (unknown topic, partition out of range).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any
from urllib.parse import quote

import httpx

from kop_dedup import errors
from kop_dedup.pulsar.admin_entries import AdminError, EntryLookups
from kop_dedup.pulsar.message_ids import EntryPosition
from kop_dedup.pulsar.naming import Naming, check_admin_path, validate_topic

__all__ = ["DEDUP_POLICY_TTL_S", "AdminError", "PulsarAdmin"]

log = logging.getLogger(__name__)

_PARTITIONS_TTL_S = 5.0
"""How long a topic's partition count is reused: a topic grown elsewhere (CreatePartitions)
is seen, and its partitions' leaders agree on every node again, within it."""
DEDUP_POLICY_TTL_S = 10.0
"""How long an "on" deduplication answer is reused (KOP_DEDUP_DEDUP_POLICY_TTL_SECONDS).

A topic-level override that turns dedup off is seen by channels opened at most
this long after the broker applies it; the broker itself applies topic policies
asynchronously (they travel through a system topic). Shorter costs one admin
request per topic per period when channels open. An "off" answer is never
reused: it refuses produce, so turning dedup back on must count at once.
"""
_DEDUP_CACHE_TOPICS = 10_000  # answers kept; the oldest go first
_CREATED_WAIT_S = 10.0  # for another's creation of a partitioned topic to show its count
_BROKER_RUNTIME_CONFIG = "/admin/v2/brokers/configuration/runtime"


_REDIRECTS = 3
_IN_FLIGHT = 32
"""Admin calls in flight at once (the rest wait their turn): a fetch or ListOffsets of
512 partitions asks hundreds at once, and past its pool httpx opened and closed a
connection per call and rescanned its queue at each answer."""
_BROKERS_TTL_S = 30.0  # the cluster's broker hosts, for redirects, read again after this


class PulsarAdmin(EntryLookups):
    def __init__(
        self,
        admin_url: str,
        naming: Naming,
        *,
        token: str | None = None,
        verify: bool | str = True,
        timeout_s: float = 10.0,
        dedup_ttl_s: float = DEDUP_POLICY_TTL_S,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=admin_url.rstrip("/"),
            headers=headers,
            timeout=timeout_s,
            verify=verify,
            limits=httpx.Limits(max_connections=_IN_FLIGHT, max_keepalive_connections=_IN_FLIGHT),
        )
        self._in_flight = asyncio.Semaphore(_IN_FLIGHT)
        self._naming = naming
        self._partitions: dict[str, tuple[int, float]] = {}
        self._topic_locks: dict[str, asyncio.Lock] = {}
        self._dedup_ttl_s = dedup_ttl_s
        self._dedup: dict[str, tuple[tuple[bool, str], float]] = {}
        self._dedup_pending: dict[str, asyncio.Future[tuple[bool, str]]] = {}
        self._dedup_scopes: dict[str, tuple[bool | None, float]] = {}
        self._brokers: tuple[frozenset[str], float] | None = None

    async def close(self) -> None:
        await self._http.aclose()

    def _path(self, topic: str) -> str:
        """``tenant/namespace/topic`` of a Kafka topic for an admin path: the name
        checked (InvalidTopic) and quoted."""
        validate_topic(topic)
        return f"{self._naming.namespace_path}/{quote(topic, safe='')}"

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One admin call (``/admin/v2/...``); AdminError for a 4xx or 5xx answer.
        InvalidTopic, and no call, for a path that could step out of the resource its
        caller meant (a ``.`` or ``..`` segment, an empty one, an encoded ``/``, ``.``
        or ``%``, a backslash): names are checked before they get here, this is the
        last guard."""
        try:
            check_admin_path(path)
        except errors.InvalidTopic:
            log.warning("refused to call the Pulsar admin API at %r", path)
            raise
        # a broker that does not own a topic redirects to the one that does (307): follow
        # it with the same method, body and token, only to a broker of the cluster
        async with self._in_flight:
            resp = await self._http.request(method, path, **kwargs)
        for _ in range(_REDIRECTS):
            if resp.status_code not in (307, 308) or "location" not in resp.headers:
                break
            target = resp.request.url.join(resp.headers["location"])
            if not await self._may_follow(target):
                log.warning(
                    "the Pulsar admin API redirected %s to %s, not a broker of the cluster: "
                    "not followed",
                    path,
                    target.host,
                )
                raise AdminError(
                    resp.status_code,
                    f"redirected to {target.host}, which is not a broker of the Pulsar "
                    "cluster (the sidecar's token goes only to the cluster's brokers)",
                )
            async with self._in_flight:
                resp = await self._http.request(method, target, **kwargs)
        if resp.status_code >= 400:
            reason = resp.text
            with contextlib.suppress(ValueError, AttributeError):
                reason = resp.json().get("reason", reason)
            raise AdminError(resp.status_code, reason)
        return resp

    async def _may_follow(self, url: httpx.URL) -> bool:
        """Whether a redirect to ``url`` may be followed with the sidecar's token: the
        admin URL's own origin, or (never from https to http) a host of an active
        broker of the cluster (``/admin/v2/brokers/{cluster}``, cached
        :data:`_BROKERS_TTL_S`)."""
        base = self._http.base_url
        if (url.scheme, url.host, url.port) == (base.scheme, base.host, base.port):
            return True
        if "authorization" not in self._http.headers:
            return True  # no token to give away
        if base.scheme == "https" and url.scheme != "https":
            return False
        return url.host.lower() in await self._broker_hosts()

    async def _broker_hosts(self) -> frozenset[str]:
        """The hosts of the active brokers of the admin URL's clusters; none when they
        cannot be read (a redirect elsewhere is then not followed)."""
        cached = self._brokers
        if cached is not None and time.monotonic() - cached[1] < _BROKERS_TTL_S:
            return cached[0]
        hosts: set[str] = set()
        try:
            clusters = await self._http.get("/admin/v2/clusters")
            for cluster in clusters.json() if clusters.status_code == 200 else []:
                path = f"/admin/v2/brokers/{quote(str(cluster), safe='')}"
                brokers = await self._http.get(path)
                if brokers.status_code == 200:
                    hosts.update(str(b).rsplit(":", 1)[0].lower() for b in brokers.json())
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("reading the Pulsar cluster's brokers failed: %r", exc)
        self._brokers = (frozenset(hosts), time.monotonic())
        return self._brokers[0]

    async def get_json(self, path: str, **params: str) -> Any:
        """GET an admin path (``/admin/v2/...``); AdminError for a 4xx or 5xx answer."""
        return (await self.request("GET", path, params=params or None)).json()

    # -- cluster and namespaces -------------------------------------------------

    async def clusters(self) -> list[str]:
        return list((await self.request("GET", "/admin/v2/clusters")).json())

    async def ensure_namespace(
        self,
        namespace_path: str,
        *,
        deduplication: bool,
        infinite_retention: bool = False,
    ) -> None:
        """Create the namespace if missing; turn dedup on when asked."""
        tenant = namespace_path.split("/", 1)[0]
        namespaces = (await self.request("GET", f"/admin/v2/namespaces/{tenant}")).json()
        if namespace_path not in namespaces:
            try:
                await self.request("PUT", f"/admin/v2/namespaces/{namespace_path}")
                log.info("created namespace %s", namespace_path)
            except AdminError as exc:
                if exc.status != 409:  # another sidecar created it first
                    raise
        if deduplication:
            await self.request(
                "POST", f"/admin/v2/namespaces/{namespace_path}/deduplication", json=True
            )
        if infinite_retention:
            await self.request(
                "POST",
                f"/admin/v2/namespaces/{namespace_path}/retention",
                json={"retentionTimeInMinutes": -1, "retentionSizeInMB": -1},
            )

    async def deduplication_enabled(self, namespace_path: str) -> bool:
        """Whether dedup applies on the namespace (its policy, else the broker's default)."""
        resp = await self.request("GET", f"/admin/v2/namespaces/{namespace_path}/deduplication")
        value = resp.json() if resp.content else None
        if isinstance(value, bool):
            return value
        conf = (await self.request("GET", "/admin/v2/brokers/configuration/runtime")).json()
        return str(conf.get("brokerDeduplicationEnabled", "false")).lower() == "true"

    async def topic_deduplication(self, topic: str) -> bool | None:
        """The topic-level dedup override for a Kafka topic, or None when none is set."""
        path = self._path(topic)
        try:
            resp = await self.request("GET", f"/admin/v2/persistent/{path}/deduplicationEnabled")
        except AdminError as exc:
            if exc.status in {404, 405}:
                return None
            raise
        value = resp.json() if resp.content else None
        return value if isinstance(value, bool) else None

    # -- partitioned topics ------------------------------------------------------

    def known_partitions(self, topic: str) -> int | None:
        """The partition count :meth:`partitions` would answer without a call, or None."""
        cached = self._partitions.get(topic)
        if cached is not None and time.monotonic() - cached[1] < _PARTITIONS_TTL_S:
            return cached[0]
        return None

    async def partitions(self, topic: str, *, create_with: int | None) -> int:
        """Partition count of a Kafka topic; create it with ``create_with`` when missing.

        Raises UnknownTopicOrPartition when it does not exist and may not be created.
        """
        cached = self._partitions.get(topic)
        now = time.monotonic()
        if cached is not None and now - cached[1] < _PARTITIONS_TTL_S:
            return cached[0]
        lock = self._topic_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            cached = self._partitions.get(topic)
            if cached is not None and time.monotonic() - cached[1] < _PARTITIONS_TTL_S:
                return cached[0]
            path = self._path(topic)
            count = await self._partition_count(path)
            if count == 0:
                if create_with is None:
                    raise errors.UnknownTopicOrPartition(
                        f"topic {topic!r} does not exist and auto-creation is off"
                    )
                try:
                    await self.request(
                        "PUT", f"/admin/v2/persistent/{path}/partitions", json=create_with
                    )
                    log.info("created topic %s with %d partitions", topic, create_with)
                    count = create_with
                except AdminError as exc:
                    if exc.status != 409:
                        raise
                    count = await self._partition_count(path)
            self._partitions[topic] = (count, time.monotonic())
            return count

    async def _partition_count(self, path: str) -> int:
        """Partitions of a partitioned topic; 0 when it does not exist (4.x answers 404)."""
        try:
            meta = (await self.request("GET", f"/admin/v2/persistent/{path}/partitions")).json()
        except AdminError as exc:
            if exc.status == 404:
                return 0
            raise
        return int(meta.get("partitions", 0))

    async def partition_exists(self, topic: str, partition: int) -> bool:
        """Whether a Kafka topic has the partition now, asked afresh (no cache): the
        partitioned topic's metadata names at least ``partition + 1`` partitions. A
        partition made again as a topic of its own (a broker that creates topics on use)
        does not count; the admin API unreachable raises."""
        count = await self._partition_count(self._path(topic))
        if count:
            self._partitions[topic] = (count, time.monotonic())
        else:
            self._partitions.pop(topic, None)
        return partition < count

    async def create_topic(self, topic: str, partitions: int) -> None:
        path = self._path(topic)
        await self.request("PUT", f"/admin/v2/persistent/{path}/partitions", json=partitions)
        self._partitions.pop(topic, None)

    async def topics(self) -> list[str]:
        """The Kafka topics of the data namespace: its partitioned topics, by name."""
        path = f"/admin/v2/persistent/{self._naming.namespace_path}/partitioned"
        prefix = self._naming.topic("")
        return [str(t).removeprefix(prefix) for t in (await self.request("GET", path)).json()]

    async def delete_topic(self, topic: str) -> None:
        """Delete a Kafka topic (every partition; producers on it are disconnected).
        UnknownTopicOrPartition when there is none."""
        path = self._path(topic)
        self._partitions.pop(topic, None)
        try:
            await self.request(
                "DELETE", f"/admin/v2/persistent/{path}/partitions", params={"force": "true"}
            )
        except AdminError as exc:
            if exc.status == 404:
                raise errors.UnknownTopicOrPartition(f"topic {topic!r} does not exist") from exc
            raise
        finally:
            self._partitions.pop(topic, None)

    async def topic_stats(self, topic: str) -> dict[str, Any]:
        """The broker's partitioned stats for a Kafka topic ({} when it does not exist)."""
        path = self._path(topic)
        try:
            resp = await self.request(
                "GET",
                f"/admin/v2/persistent/{path}/partitioned-stats",
                params={"perPartition": "true"},
            )
        except AdminError as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(resp.json())

    # -- effective deduplication ---------------------------------------------------

    async def effective_deduplication(self, topic: str) -> tuple[bool, str]:
        """(enabled, source) of deduplication on a Kafka topic, as the broker applies it.

        The source is the first level that sets it: ``"topic"`` (a topic-level
        policy on the partitioned topic), ``"namespace"``, else ``"broker"``
        (``brokerDeduplicationEnabled``). A topic that does not exist yet has no
        topic-level policy. "On" answers are reused for ``dedup_ttl_s`` (see
        :data:`DEDUP_POLICY_TTL_S`; "off" ones are asked again), and concurrent
        lookups of one topic share one round of requests, so it is cheap enough
        to ask whenever a producer channel opens.

        >>> await admin.effective_deduplication("orders")  # doctest: +SKIP
        (True, 'namespace')
        """
        validate_topic(topic)
        cached = self._dedup.get(topic)
        if cached is not None and time.monotonic() < cached[1]:
            return cached[0]
        pending = self._dedup_pending.get(topic)
        if pending is None:
            pending = asyncio.ensure_future(self._lookup_deduplication(topic))
            self._dedup_pending[topic] = pending
            pending.add_done_callback(lambda f: self._dedup_settled(topic, f))
        return await asyncio.shield(pending)

    def _dedup_settled(self, topic: str, future: asyncio.Future[tuple[bool, str]]) -> None:
        self._dedup_pending.pop(topic, None)
        if future.cancelled() or future.exception() is not None:  # read: no "never retrieved"
            return
        self._dedup.pop(topic, None)  # re-insert: the dict stays ordered oldest first
        answer = future.result()
        if not answer[0]:  # "off" refuses produce: ask again next time
            return
        self._dedup[topic] = (answer, time.monotonic() + self._dedup_ttl_s)
        while len(self._dedup) > _DEDUP_CACHE_TOPICS:
            del self._dedup[next(iter(self._dedup))]

    async def _lookup_deduplication(self, topic: str) -> tuple[bool, str]:
        path = self._path(topic)
        try:
            # without ?applied=true: the topic's own policy only (null when none is set);
            # 4.0.8 answers 404 for a topic that does not exist, 405 when topic-level
            # policies are disabled on the broker
            resp = await self.request("GET", f"/admin/v2/persistent/{path}/deduplicationEnabled")
            value = resp.json() if resp.content else None
        except AdminError as exc:
            if exc.status not in {404, 405}:
                raise
            value = None
        if isinstance(value, bool):
            return value, "topic"
        namespace = await self._scope_deduplication(
            f"namespace:{self._naming.namespace_path}",
            f"/admin/v2/namespaces/{self._naming.namespace_path}/deduplication",
        )
        if namespace is not None:
            return namespace, "namespace"
        broker = await self._scope_deduplication("broker", _BROKER_RUNTIME_CONFIG)
        return bool(broker), "broker"

    async def _scope_deduplication(self, key: str, path: str) -> bool | None:
        """A namespace's dedup policy (None when unset) or the broker's default.

        Cached like topic answers: an unset or "on" answer for the TTL, "off" not at all.
        """
        cached = self._dedup_scopes.get(key)
        if cached is not None and time.monotonic() < cached[1]:
            return cached[0]
        resp = await self.request("GET", path)
        body = resp.json() if resp.content else None  # an unset namespace policy: empty
        value: bool | None
        if isinstance(body, dict):  # the broker's runtime configuration: strings
            value = str(body.get("brokerDeduplicationEnabled", "false")).lower() == "true"
        else:
            value = body if isinstance(body, bool) else None
        if value is not False:
            self._dedup_scopes[key] = (value, time.monotonic() + self._dedup_ttl_s)
        return value

    # -- compaction (the system namespace's keyed tables) -----------------------

    async def set_compaction_threshold(self, namespace_path: str, threshold_bytes: int) -> None:
        """Let the broker compact a namespace's topics once this many bytes are uncompacted
        (0: only when asked, see :meth:`compact`)."""
        await self.request(
            "PUT",
            f"/admin/v2/namespaces/{namespace_path}/compactionThreshold",
            json=threshold_bytes,
        )

    async def compact(self, topic: str) -> None:
        """Ask the broker to compact ``persistent://tenant/ns/topic`` now (it runs in the
        background; one already running is fine)."""
        path = topic.removeprefix("persistent://")
        try:
            await self.request("PUT", f"/admin/v2/persistent/{path}/compaction")
        except AdminError as exc:
            if exc.status != 409:  # 409: a compaction of that topic is already running
                raise

    async def compaction_status(self, topic: str) -> str:
        """NOT_RUN, RUNNING, SUCCESS or ERROR for the topic's last compaction."""
        path = topic.removeprefix("persistent://")
        resp = await self.request("GET", f"/admin/v2/persistent/{path}/compaction")
        return str(resp.json().get("status", "NOT_RUN"))

    # -- coordinator logs (partitioned topics in the system namespace) ----------------

    async def ensure_partitioned_topic(self, topic: str, partitions: int) -> int:
        """Create ``persistent://tenant/ns/topic`` with ``partitions`` partitions if it does
        not exist; return the partition count it has."""
        path = topic.removeprefix("persistent://")
        count = await self._partition_count(path)
        if count:
            return count
        try:
            await self.request("PUT", f"/admin/v2/persistent/{path}/partitions", json=partitions)
        except AdminError as exc:
            if exc.status != 409:  # another sidecar created it first, or is creating it
                raise
            # while another's creation is under way the broker answers 409 and no count yet
            deadline = asyncio.get_running_loop().time() + _CREATED_WAIT_S
            while not (count := await self._partition_count(path)):
                if asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            return count
        return partitions

    async def partition_writers(self, topic: str) -> dict[int, list[str]]:
        """Names of the producers connected to each partition of
        ``persistent://tenant/ns/topic``."""
        path = topic.removeprefix("persistent://")
        resp = await self.request(
            "GET", f"/admin/v2/persistent/{path}/partitioned-stats", params={"perPartition": "true"}
        )
        out: dict[int, list[str]] = {}
        for name, stats in (resp.json().get("partitions") or {}).items():
            index = int(name.rsplit("-partition-", 1)[1])
            out[index] = [str(p.get("producerName")) for p in stats.get("publishers") or []]
        return out

    async def last_position(self, topic: str) -> EntryPosition | None:
        """(ledger, entry) of a (partition) topic's last entry: everything stored so far
        lies at or before it. Entry -1: the current ledger is still empty (the entries
        before it are in earlier ledgers). None: the topic has no ledger at all."""
        path = topic.removeprefix("persistent://")
        body = (await self.request("GET", f"/admin/v2/persistent/{path}/lastMessageId")).json()
        ledger, entry = int(body.get("ledgerId", -1)), int(body.get("entryId", -1))
        return None if ledger < 0 else (ledger, entry)

    async def set_topic_retention(self, topic: str, minutes: int) -> None:
        """A topic-level retention policy (time only) on a partitioned topic."""
        path = topic.removeprefix("persistent://")
        await self.request(
            "POST",
            f"/admin/v2/persistent/{path}/retention",
            json={"retentionTimeInMinutes": minutes, "retentionSizeInMB": -1},
        )
