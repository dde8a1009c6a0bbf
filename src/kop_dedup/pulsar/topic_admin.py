"""The admin calls behind Kafka's admin APIs: retention and compaction policies, a
Kafka topic's stored configs and log start offsets, partition growth, and what the
broker knows of a partition's producers.

:class:`TopicAdmin` is :class:`~kop_dedup.pulsar.admin.PulsarAdmin` with these calls
(the runtime makes one; everything typed ``PulsarAdmin`` takes it). A Kafka topic's
state that Pulsar has no field for lives in the partitioned topic's **properties**
(kept in its metadata, read with its partition count, deleted with it, kept when it
grows): its config overrides as ``kafka.config.<name>`` and each partition's log start
offset (DeleteRecords) as ``kafka.log-start.<partition>``. Properties are read through
a cache of :data:`PROPERTIES_TTL_S`: another sidecar's DeleteRecords or config change is
seen within it; this sidecar's own at once.

>>> admin = TopicAdmin("http://127.0.0.1:8080", naming)
>>> await admin.set_log_start("orders", 0, 42)     # doctest: +SKIP
>>> await admin.log_start(naming.partition_topic("orders", 0))  # doctest: +SKIP
42
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from kop_dedup import errors
from kop_dedup.protocol.retention import Retention
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin

__all__ = ["CONFIG_PREFIX", "LOG_START_PREFIX", "PROPERTIES_TTL_S", "TopicAdmin"]

log = logging.getLogger(__name__)

CONFIG_PREFIX = "kafka.config."
LOG_START_PREFIX = "kafka.log-start."
PROPERTIES_TTL_S = 5.0
"""How long a topic's properties (configs, log starts) are reused before they are read
again: another sidecar's change is seen within it."""
_APPLIED_WAIT_S = 10.0
_METADATA = "application/vnd.partitioned-topic-metadata+json"
_PARTITION = "-partition-"


class TopicAdmin(PulsarAdmin):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._props: dict[str, tuple[dict[str, str], float]] = {}
        self._props_pending: dict[str, asyncio.Future[dict[str, str]]] = {}

    # -- retention ---------------------------------------------------------------------

    async def namespace_retention(self, namespace: str) -> Retention | None:
        """A namespace's own retention policy; None when it has none (the broker's
        default applies)."""
        resp = await self.request("GET", f"/admin/v2/namespaces/{namespace}/retention")
        return Retention.from_pulsar(resp.json() if resp.content else None)

    async def set_namespace_retention(self, namespace: str, retention: Retention) -> None:
        await self.request(
            "POST", f"/admin/v2/namespaces/{namespace}/retention", json=retention.to_pulsar()
        )

    async def topic_retention(self, topic: str, *, applied: bool = False) -> Retention | None:
        """A Kafka topic's own retention policy (None: none, the namespace's applies), or
        with ``applied`` the one the broker applies (topic, else namespace, else broker)."""
        params = {"applied": "true"} if applied else {}
        resp = await self.request(
            "GET", f"/admin/v2/persistent/{self._path(topic)}/retention", params=params
        )
        return Retention.from_pulsar(resp.json() if resp.content else None)

    async def apply_topic_policy(
        self,
        topic: str,
        retention: Retention | None,
        compaction_threshold: int | None,
        *,
        created: bool = False,
    ) -> None:
        """Set (None: remove) a Kafka topic's own retention policy and compaction
        threshold (``created``: the topic is new, it has nothing to remove); returns once
        the broker applies the retention (topic policies travel through a system topic:
        a roll-over right after the call must find them)."""
        path = f"/admin/v2/persistent/{self._path(topic)}"
        if retention is not None:
            await self.request("POST", f"{path}/retention", json=retention.to_pulsar())
        elif not created:
            await self.request("DELETE", f"{path}/retention")
        if compaction_threshold is None:
            if not created:
                await self.request("DELETE", f"{path}/compactionThreshold")
        else:
            await self.request("POST", f"{path}/compactionThreshold", json=compaction_threshold)
        if retention is not None:
            await self._applied(topic, retention)

    async def _applied(self, topic: str, retention: Retention) -> None:
        deadline = time.monotonic() + _APPLIED_WAIT_S
        while await self.topic_retention(topic, applied=True) != retention:
            if time.monotonic() > deadline:
                raise errors.RequestTimedOut(
                    f"the broker did not apply the retention policy of {topic} within "
                    f"{_APPLIED_WAIT_S:.0f}s (topic-level policies enabled?)"
                )
            await asyncio.sleep(0.05)

    async def compaction_threshold(self, topic: str) -> int | None:
        """A Kafka topic's own compaction threshold (bytes), None when it has none."""
        resp = await self.request(
            "GET", f"/admin/v2/persistent/{self._path(topic)}/compactionThreshold"
        )
        value = resp.json() if resp.content else None
        return int(value) if isinstance(value, int) else None

    # -- properties: configs and log starts -------------------------------------------------

    async def create_topic_with(
        self, topic: str, partitions: int, properties: dict[str, str]
    ) -> None:
        """Create a Kafka topic with its properties in one call (409: it exists)."""
        await self.request(
            "PUT",
            f"/admin/v2/persistent/{self._path(topic)}/partitions",
            content=json.dumps({"partitions": partitions, "properties": properties}).encode(),
            headers={"Content-Type": _METADATA},
        )
        self._partitions.pop(topic, None)
        self._props[topic] = (dict(properties), time.monotonic())

    async def delete_topic(self, topic: str) -> None:
        """:meth:`PulsarAdmin.delete_topic`, forgetting the topic's properties (a topic
        created again under the name starts with none)."""
        self._props.pop(topic, None)
        try:
            await super().delete_topic(topic)
        finally:
            self._props.pop(topic, None)

    async def grow_topic(self, topic: str, partitions: int) -> None:
        """Give a Kafka topic ``partitions`` partitions (more than it has)."""
        await self.request(
            "POST", f"/admin/v2/persistent/{self._path(topic)}/partitions", json=partitions
        )
        self._partitions.pop(topic, None)

    async def properties(self, topic: str, *, fresh: bool = False) -> dict[str, str]:
        """A Kafka topic's properties (cached :data:`PROPERTIES_TTL_S`; ``fresh``: read
        now); UnknownTopicOrPartition when the topic does not exist."""
        cached = self._props.get(topic)
        if not fresh and cached is not None and time.monotonic() - cached[1] < PROPERTIES_TTL_S:
            return cached[0]
        pending = self._props_pending.get(topic)
        if pending is None:
            pending = asyncio.ensure_future(self._read_properties(topic))
            self._props_pending[topic] = pending
            pending.add_done_callback(lambda f: self._props_settled(topic, f))
        return dict(await asyncio.shield(pending))

    def _props_settled(self, topic: str, future: asyncio.Future[dict[str, str]]) -> None:
        self._props_pending.pop(topic, None)
        if not future.cancelled():
            future.exception()  # retrieved: every waiter may have gone

    async def _read_properties(self, topic: str) -> dict[str, str]:
        try:
            resp = await self.request("GET", f"/admin/v2/persistent/{self._path(topic)}/partitions")
        except AdminError as exc:
            if exc.status == 404:
                self._props.pop(topic, None)
                raise errors.UnknownTopicOrPartition(f"topic {topic!r} does not exist") from exc
            raise
        meta = resp.json()
        count = int(meta.get("partitions") or 0)
        if not count:
            raise errors.UnknownTopicOrPartition(f"topic {topic!r} does not exist")
        props = {str(k): str(v) for k, v in (meta.get("properties") or {}).items()}
        now = time.monotonic()
        self._props[topic] = (props, now)
        self._partitions[topic] = (count, now)  # read anyway: the count is fresh too
        return props

    async def update_properties(
        self, topic: str, changed: dict[str, str], removed: set[str]
    ) -> None:
        """Set ``changed`` and remove ``removed`` among a Kafka topic's properties."""
        path = f"/admin/v2/persistent/{self._path(topic)}/properties"
        if changed:
            await self.request("PUT", path, json=changed)
        for key in sorted(removed):
            await self.request("DELETE", path, params={"key": key})
        self._props.pop(topic, None)

    async def configs(self, topic: str, *, fresh: bool = False) -> dict[str, str]:
        """A Kafka topic's config overrides (name -> value)."""
        props = await self.properties(topic, fresh=fresh)
        return {
            k.removeprefix(CONFIG_PREFIX): v
            for k, v in props.items()
            if k.startswith(CONFIG_PREFIX)
        }

    async def log_start(self, partition_topic: str) -> int:
        """The log start offset DeleteRecords set on a partition topic (a full
        ``persistent://`` name); 0 when none was set, or the topic is not a Kafka topic.
        Reads go on while the admin API does not answer: the last value read is used
        (0 when none was), so a fetch never fails for want of it."""
        prefix = self._naming.topic("")
        topic, sep, index = partition_topic.removeprefix(prefix).rpartition(_PARTITION)
        if not partition_topic.startswith(prefix) or not sep or not index.isdigit():
            return 0
        try:
            props = await self.properties(topic)
        except errors.UnknownTopicOrPartition:
            return 0
        except Exception as exc:
            known = self._props.get(topic)
            props = {} if known is None else known[0]
            self._props[topic] = (props, time.monotonic())  # asked again after the TTL
            log.warning("log start of %s not read (%r): using the last known", topic, exc)
        return int(props.get(f"{LOG_START_PREFIX}{index}", 0))

    async def set_log_start(self, topic: str, partition: int, offset: int) -> int:
        """Move a partition's log start offset up to ``offset`` (never down: a lower one
        stored meanwhile by another sidecar is written over); the log start it has."""
        key = f"{LOG_START_PREFIX}{partition}"
        for _ in range(5):
            props = await self.properties(topic, fresh=True)
            have = int(props.get(key, 0))
            if have >= offset:
                return have
            await self.update_properties(topic, {key: str(offset)}, set())
        return int((await self.properties(topic, fresh=True)).get(key, 0))

    # -- producers of a partition ----------------------------------------------------------

    async def dedup_marks(self, partition_topic: str) -> dict[str, int]:
        """The broker's last deduplication snapshot of a partition topic: producer name ->
        highest sequence id (taken every ``brokerDeduplicationEntriesInterval`` entries and
        ``brokerDeduplicationSnapshotIntervalSeconds``; {} before the first)."""
        path = partition_topic.removeprefix("persistent://")
        stats = (await self.request("GET", f"/admin/v2/persistent/{path}/internalStats")).json()
        cursor = (stats.get("cursors") or {}).get("pulsar.dedup") or {}
        return {str(k): int(v) for k, v in (cursor.get("properties") or {}).items()}

    async def publishers(self, partition_topic: str) -> list[str]:
        """Names of the producers connected to a partition topic now."""
        path = partition_topic.removeprefix("persistent://")
        stats = (await self.request("GET", f"/admin/v2/persistent/{path}/stats")).json()
        return [str(p.get("producerName")) for p in stats.get("publishers") or []]

    async def unload(self, topic: str) -> None:
        """Unload a (partition) topic (``persistent://`` name): its ledger rolls over."""
        path = topic.removeprefix("persistent://")
        await self.request("PUT", f"/admin/v2/persistent/{path}/unload")
