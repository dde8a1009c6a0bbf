"""Kafka topics administered on Pulsar: configs, creation with configs, growth, log
start offsets, and the data namespace's retention (Kafka's ``AdminManager`` decisions;
the transports only decode and encode).

A topic's config overrides are stored with it (:mod:`kop_dedup.pulsar.topic_admin`)
and the ones that mean something on Pulsar are applied to its Pulsar topic
(:func:`~kop_dedup.protocol.topic_configs.pulsar_policy`): ``retention.ms`` and
``retention.bytes`` become its retention policy, ``cleanup.policy=compact`` unbounded
retention and Pulsar's compaction (:data:`COMPACTION_THRESHOLD_BYTES`). A topic without
overrides has no policy of its own: the namespace's applies, which the sidecar sets to
Kafka's ``log.retention.*`` when it has none (:meth:`TopicManager.prepare_namespace`).

>>> manager = TopicManager(admin, settings)
>>> entries = await manager.create("orders", 3, [("retention.ms", "3600000")])  # doctest: +SKIP
>>> {e.name: e.value for e in entries}["retention.ms"]  # doctest: +SKIP
'3600000'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from kop_dedup import errors
from kop_dedup.protocol import topic_configs as tc
from kop_dedup.protocol.retention import Retention, Verdict, namespace_plan
from kop_dedup.pulsar.admin import AdminError
from kop_dedup.pulsar.topic_admin import CONFIG_PREFIX, PROPERTIES_TTL_S, TopicAdmin
from kop_dedup.settings import Settings

__all__ = ["COMPACTION_THRESHOLD_BYTES", "RetentionTooShort", "TopicManager", "defaults"]

log = logging.getLogger(__name__)

COMPACTION_THRESHOLD_BYTES = 64 << 20
"""The compaction threshold of a compacted topic: the broker compacts it once this many
bytes were written since its last compaction (Kafka's cleaner waits for half the log to
be dirty, ``min.cleanable.dirty.ratio``). Kafka consumers read the whole log whatever
Pulsar compacted; Pulsar readers with ``readCompacted`` read the compacted view."""
_CONFLICT = 409
_REFUSED = 412  # the admin API's answer to a policy it will not take


class RetentionTooShort(RuntimeError):
    """The data namespace deletes unconsumed records sooner than Kafka would and
    ``KAFKA_RETENTION_CHECK=refuse``."""


def defaults(settings: Settings) -> tc.Defaults:
    """A topic's config defaults: the sidecar's settings (Kafka's broker configs)."""
    fields = settings.model_fields_set
    return tc.Defaults(
        retention_ms=settings.kafka_log_retention_ms,
        retention_bytes=settings.kafka_log_retention_bytes,
        max_message_bytes=settings.max_batch_bytes,
        retention_ms_set="kafka_log_retention_ms" in fields,
        retention_bytes_set="kafka_log_retention_bytes" in fields,
    )


class TopicManager:
    def __init__(self, admin: TopicAdmin, settings: Settings) -> None:
        self._admin = admin
        self._settings = settings
        self._namespace = f"{settings.tenant}/{settings.namespace}"
        self.defaults = defaults(settings)
        self._following: tuple[tc.Defaults, float] | None = None

    async def current_defaults(self) -> tc.Defaults:
        """What applies to a topic without overrides: the settings, or the data
        namespace's retention where an operator set another (read at most every
        :data:`~kop_dedup.pulsar.topic_admin.PROPERTIES_TTL_S`)."""
        cached = self._following
        if cached is not None and time.monotonic() - cached[1] < PROPERTIES_TTL_S:
            return cached[0]
        policy = await self._admin.namespace_retention(self._namespace)
        following = self.defaults.following(policy)
        self._following = (following, time.monotonic())
        return following

    # -- the data namespace ---------------------------------------------------------------

    async def prepare_namespace(self, namespace: str) -> Verdict:
        """Give the data namespace Kafka's retention when it has no policy; report (or
        refuse, ``KAFKA_RETENTION_CHECK=refuse``) one that keeps less."""
        wanted = Retention.from_kafka(
            self._settings.kafka_log_retention_ms, self._settings.kafka_log_retention_bytes
        )
        current = await self._admin.namespace_retention(namespace)
        plan = namespace_plan(namespace, current, wanted, self._settings.pulsar_admin_url)
        if plan.verdict is Verdict.SET:
            try:
                await self._admin.set_namespace_retention(namespace, wanted)
            except AdminError as exc:
                if exc.status != _REFUSED:
                    raise
                raise RuntimeError(
                    f"Pulsar refused retention {wanted.describe()} on {namespace}: {exc}; "
                    "KOP_DEDUP_KAFKA_LOG_RETENTION_BYTES must exceed the namespace's backlog "
                    "quota (-1, or above backlogQuotaDefaultLimitGB, 10 GB by default)"
                ) from exc
            log.info(plan.message)
        elif plan.verdict is Verdict.KEEP:
            log.info(plan.message)
        elif self._settings.kafka_retention_check == "refuse":
            raise RetentionTooShort(f"{plan.message} (KOP_DEDUP_KAFKA_RETENTION_CHECK=refuse)")
        else:
            log.warning(plan.message)
        return plan.verdict

    # -- configs ------------------------------------------------------------------------

    async def describe(self, topic: str, names: Iterable[str] | None) -> list[tc.Entry]:
        """The configs of a topic (UnknownTopicOrPartition when it does not exist)."""
        overrides = await self._admin.configs(topic, fresh=True)
        return tc.describe(overrides, await self.current_defaults(), names)

    async def alter(
        self,
        topic: str,
        change: Callable[[Mapping[str, str], tc.Defaults], dict[str, str]],
        *,
        validate_only: bool,
    ) -> None:
        """Compute a topic's next overrides with ``change`` (``tc.incremental`` or
        ``tc.replace``, bound to the request), apply them to its Pulsar topic, store
        them. InvalidConfig (nothing changed) for what cannot be honoured."""
        current = await self._admin.configs(topic, fresh=True)
        defaults = await self.current_defaults()
        wanted = change(current, defaults)
        if validate_only or wanted == current:
            return
        before = tc.pulsar_policy(current, defaults)
        after = tc.pulsar_policy(wanted, defaults)
        if after != before:
            await self._apply(topic, after)
        changed = {f"{CONFIG_PREFIX}{k}": v for k, v in wanted.items() if current.get(k) != v}
        removed = {f"{CONFIG_PREFIX}{k}" for k in current if k not in wanted}
        await self._admin.update_properties(topic, changed, removed)

    async def _apply(self, topic: str, policy: tc.PulsarPolicy, *, created: bool = False) -> None:
        threshold = COMPACTION_THRESHOLD_BYTES if policy.compacted else None
        try:
            await self._admin.apply_topic_policy(
                topic, policy.retention, threshold, created=created
            )
        except AdminError as exc:
            if exc.status != _REFUSED or policy.retention is None:
                raise
            log.warning("Pulsar refused the retention of %s: %s", topic, exc)
            raise errors.InvalidConfig(
                f"Pulsar refused the retention of {topic} ({policy.retention.describe()}); "
                "retention.bytes must exceed the topic's backlog quota "
                "(backlogQuotaDefaultLimitGB, 10 GB by default)"
            ) from exc

    # -- creation and growth --------------------------------------------------------------

    async def create(
        self,
        topic: str,
        partitions: int,
        configs: Iterable[tuple[str, str | None]],
        *,
        validate_only: bool = False,
    ) -> list[tc.Entry]:
        """Create a topic with its config overrides stored and applied; its configs as
        DescribeConfigs would answer them. TopicAlreadyExists, InvalidConfig,
        InvalidRequest as Kafka answers them."""
        self._within_cap(partitions)
        defaults = await self.current_defaults()
        overrides = tc.for_create(configs, defaults)
        try:
            await self._admin.partitions(topic, create_with=None)
        except errors.UnknownTopicOrPartition:
            pass
        else:
            raise errors.TopicAlreadyExists(f"Topic '{topic}' already exists.")
        if validate_only:
            return tc.describe(overrides, defaults)
        properties = {f"{CONFIG_PREFIX}{k}": v for k, v in overrides.items()}
        try:
            await self._admin.create_topic_with(topic, partitions, properties)
        except AdminError as exc:
            if exc.status == _CONFLICT:
                raise errors.TopicAlreadyExists(f"Topic '{topic}' already exists.") from exc
            raise
        policy = tc.pulsar_policy(overrides, defaults)
        if policy != tc.PulsarPolicy(None, compacted=False):
            try:
                await self._apply(topic, policy, created=True)
            except Exception:
                # not created with configs it could not apply: Kafka creates nothing then
                await self._admin.delete_topic(topic)
                raise
        return tc.describe(overrides, defaults)

    def _within_cap(self, partitions: int) -> None:
        cap = self._settings.max_partitions_per_topic
        if partitions > cap:
            raise errors.InvalidPartitions(
                f"{partitions} partitions asked; a topic may have at most {cap} "
                "(KOP_DEDUP_MAX_PARTITIONS_PER_TOPIC)"
            )

    async def grow(self, topic: str, count: int, *, validate_only: bool) -> None:
        """CreatePartitions: ``count`` partitions for a topic that has fewer (Kafka's
        messages for the same count, a lower one, a missing topic)."""
        self._within_cap(count)
        await self._admin.properties(topic, fresh=True)  # reads the count afresh too
        have = await self._admin.partitions(topic, create_with=None)
        if count == have:
            raise errors.InvalidPartitions(f"Topic already has {have} partition(s).")
        if count < have:
            raise errors.InvalidPartitions(
                f"The topic {topic} currently has {have} partition(s); {count} would not be "
                "an increase."
            )
        if not validate_only:
            await self._admin.grow_topic(topic, count)
