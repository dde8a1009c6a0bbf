"""The sidecar's parts wired together, started and stopped in order.

``Runtime.start()`` checks the broker (admin API answers, deduplication on
for the data namespace, enabling it when allowed), prepares the system
namespace (its registry topics compacted by the broker), replays the epoch
registry, and only then lets the API serve.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

from kop_dedup.clock import now_ms
from kop_dedup.cluster.handover import Handover
from kop_dedup.cluster.members import Membership, default_node_id
from kop_dedup.cluster.offsets import RoutedOffsets
from kop_dedup.cluster.ownership import Cluster
from kop_dedup.cluster.peers import Peers
from kop_dedup.cluster.placement import GROUP_LOG, TRANSACTION_LOG, Member
from kop_dedup.coordination.expiry import Bounds
from kop_dedup.coordination.groups.coordinator import (
    GroupCoordinator,
    GroupSettings,
    StaleMember,
)
from kop_dedup.coordination.groups.deletion import GroupDeletion
from kop_dedup.coordination.groups.lag import GroupLag
from kop_dedup.coordination.groups.retention import GroupRetention
from kop_dedup.coordination.groups.store import GroupStore
from kop_dedup.coordination.registry import Registry, RegistryBounds
from kop_dedup.coordination.topics import TopicManager
from kop_dedup.coordination.transactions.coordinator import TransactionCoordinator
from kop_dedup.coordination.transactions.copier import Copier
from kop_dedup.coordination.transactions.journal import Journal
from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.coordination.transactions.settings import txn_settings
from kop_dedup.coordination.transactions.stable import StableOffsets
from kop_dedup.errors import KafkaError, UnknownTopicOrPartition
from kop_dedup.observability.reused import READY_TTL_S, Reused
from kop_dedup.observability.stats import Stats
from kop_dedup.observability.wire import WireStats
from kop_dedup.produce.service import ProduceService
from kop_dedup.protocol.records import KafkaBatch
from kop_dedup.protocol.transactions import Partition, Transaction
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.producers import Publisher
from kop_dedup.pulsar.topic_admin import TopicAdmin
from kop_dedup.security.authorizer import Authorizer
from kop_dedup.security.fingerprint import fingerprint
from kop_dedup.security.identity import Authenticator
from kop_dedup.security.system_namespace import check_system_namespace
from kop_dedup.settings import Settings, split_address

__all__ = ["DeduplicationOff", "Runtime", "registry_bounds", "txn_settings"]

log = logging.getLogger(__name__)

_EXIT_MARGIN_S = 1.0
"""Of the shutdown budget, what is kept for the process to exit after closing."""
_LAST_CHANCE_S = 0.05
"""What a part gets to close once the shutdown budget is spent (a quick close, no wait)."""
_LOAD_WAIT_S = 30.0
"""How long a start waits for this node's state partitions to load before it serves
anyway (a change to one still loading answers COORDINATOR_LOAD_IN_PROGRESS)."""


class DeduplicationOff(RuntimeError):
    """The data namespace has deduplication off and we may not turn it on."""


def registry_bounds(settings: Settings) -> RegistryBounds:
    """The registries' memory bounds from the settings."""
    return RegistryBounds(
        epochs=Bounds(
            expiry_ms=int(settings.producer_epoch_expiry_seconds * 1000),
            max_entries=settings.max_producer_epochs,
        ),
        transactional_ids=Bounds(
            expiry_ms=int(settings.transactional_id_expiry_seconds * 1000),
            max_entries=settings.max_transactional_ids,
        ),
        sweep_interval_s=settings.registry_sweep_seconds,
        fencing_lease_s=settings.fencing_lease_ms / 1000 if settings.strict_fencing else 0.0,
    )


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        token = settings.pulsar_token()
        self.naming = Naming(settings.tenant, settings.namespace, settings.producer_name_prefix)
        verify = settings.pulsar_admin_verify()
        self.admin = TopicAdmin(
            settings.pulsar_admin_url,
            self.naming,
            token=token,
            verify=verify,
            dedup_ttl_s=settings.dedup_policy_ttl_seconds,
        )
        self.publisher = Publisher(
            settings.pulsar_service_url,
            send_timeout_ms=settings.send_timeout_ms,
            auth_token=token,
            tls_trust_certs_file=(
                str(settings.pulsar_tls_trust_certs_file)
                if settings.pulsar_tls_trust_certs_file
                else None
            ),
            tls_allow_insecure=settings.pulsar_tls_allow_insecure,
            tls_validate_hostname=settings.pulsar_tls_validate_hostname,
        )
        system_ns = f"{settings.tenant}/{settings.system_namespace}"
        self.registry = Registry(
            self.publisher.client,
            system_ns,
            settings.producer_name_prefix,
            bounds=registry_bounds(settings),
            compact=self.admin.compact,
        )
        self.stats = Stats(
            max_topics=settings.stats_max_topics, max_producers=settings.stats_max_producers
        )
        self.kafka_stats = WireStats()  # the Kafka listener's requests and connections
        self.service = ProduceService(
            settings, self.publisher, self.admin, self.registry.epochs, self.stats
        )
        base = f"persistent://{system_ns}"
        self.membership = Membership(
            self.publisher.client,
            self.admin,
            f"{base}/cluster-members",
            refresh_s=settings.cluster_refresh_ms / 1000,
            absent_s=max(
                settings.cluster_handoff_ms / 1000, 5 * settings.cluster_refresh_ms / 1000
            ),
        )
        self.cluster = Cluster(
            self.membership, mode=settings.cluster_mode, partitions_of=self._partition_count
        )
        self._handover = Handover(
            self.cluster, self.service.channels, self.naming, journals=f"{base}/txn-journal."
        )
        self.auth = Authenticator.from_settings(settings)
        self._readiness = Reused(self._ask_ready, ttl_s=READY_TTL_S)
        self.authorizer = Authorizer.build(self.auth, settings, self.admin, self.publisher.client)
        self.peers = Peers(
            me=-1,
            token=self.auth.peer_token(settings),
            secret=self.auth.cluster_secret(settings),
            authenticating=self.auth.enabled,
            verify=(
                str(settings.peer_tls_trust_certs_file)
                if settings.peer_tls_trust_certs_file is not None
                else True
            ),
            # a forwarded long poll or join waits as long as the client allows
            timeout_s=max(settings.max_timeout_ms, settings.max_pull_wait_ms) / 1000 + 30,
        )
        self.offsets = GroupStore(
            self.publisher.client,
            self.admin,
            f"{base}/consumer-groups",
            settings.offsets_partitions,
            pending_is_live=self._pending_is_live,
            owner_of=self.cluster.owner_text(GROUP_LOG),
            handoff_wait_s=settings.cluster_handoff_ms / 1000,
            max_groups=settings.max_groups,
        )
        self.groups = GroupCoordinator(
            self.offsets,
            self.publisher.client,
            self.admin,
            self.naming,
            partitions_of=self._group_partitions_of,
            settings=GroupSettings(
                cursor_interval_s=settings.group_cursor_interval_ms / 1000,
                sweep_interval_s=settings.group_sweep_interval_ms / 1000,
                lag_interval_s=settings.group_lag_interval_ms / 1000,
                reader_idle_s=settings.group_reader_idle_ms / 1000,
                default_session_timeout_ms=settings.group_session_timeout_ms,
                default_broadcast_expire_ms=settings.group_broadcast_expire_ms,
                max_pull_records=settings.max_pull_records,
                max_wait_ms=settings.max_pull_wait_ms,
                answer_delay_s=settings.group_pull_answer_delay_ms / 1000,
                kafka_min_session_timeout_ms=settings.kafka_group_min_session_timeout_ms,
                max_members=settings.max_group_members,
            ),
        )
        # DeleteRecords' log start offsets bound what every reader (Fetch, pulls) finds
        self.groups.positions.log_start = self.admin.log_start
        self.topics = TopicManager(self.admin, settings)
        self.group_lag = GroupLag(self.groups, self.admin)
        self.group_retention = GroupRetention(
            self.groups, retention_ms=settings.group_retention_ms, forgotten=self.group_lag.forget
        )
        self.group_deletion = GroupDeletion(self.groups, self.group_retention)
        self._stopping_at: float | None = None
        self._leaving: asyncio.Task[None] | None = None
        instance = uuid.uuid4().hex[:16]
        journal = Journal(
            self.admin,
            self.naming,
            system_ns,
            publisher=self.publisher,
            retention_minutes=settings.journal_retention,
            remembered=settings.txn_remembered_partitions,
            instance=instance,
        )
        self.copier = Copier(
            self.publisher.client,
            self.publisher,
            self.naming,
            journal,
            prefix=settings.producer_name_prefix,
            on_state_lost=self._copy_state_lost,
            local=LocalCopy(
                settings.txn_local_copy_max_bytes, settings.txn_local_copy_max_transactions
            ),
            instance=instance,
            max_message_bytes=settings.pulsar_max_message_bytes,
            forget_after_ms=settings.broker_dedup_producer_inactivity_minutes * 60_000,
        )
        """Copies commits into the data topics (DeleteTopics closes its producers first)."""
        self.transactions = TransactionCoordinator(
            self.publisher.client,
            self.admin,
            log_topic=f"{base}/transaction-log",
            decisions_topic=f"{base}/transaction-decisions",
            journal=journal,
            copier=self.copier,
            offsets=RoutedOffsets(self.offsets, self.cluster, self.peers),
            allocator=self.registry.allocator,
            epochs=self.registry.epochs,
            legacy=self.registry.transactional,
            journaler=self._journal,
            partitions_of=self._partitions_of,
            members=self._check_member,
            settings=txn_settings(settings),
            owner_of=self.cluster.owner_text(TRANSACTION_LOG),
            release_journals=self._handover.release_journals,
        )
        self.cluster.on_data(self._handover.retire_moved)
        self.stable = StableOffsets(
            self.publisher.client, self.groups.positions, self.naming, self.transactions.state
        )
        """Last stable offsets (ListOffsets READ_COMMITTED, read_committed fetches, the
        groups' "latest" and lag)."""
        self.groups.stable = self.stable

    async def _journal(
        self, batch: KafkaBatch, deadline: float, ptopic: str, extra: dict[str, str]
    ) -> tuple[KafkaError | None, str | None]:
        result = await self.service.produce(batch, deadline, journal=(ptopic, extra))
        return result.error, result.message_id

    async def _pending_is_live(self, transactional_id: str, ordinal: int, marked_ms: int) -> bool:
        """The group store's leak sweep asks the transaction coordinator (created after
        the store, hence this indirection)."""
        return await self.transactions.pending_is_live(transactional_id, ordinal, marked_ms)

    async def _check_member(self, group: str, member: str | None, generation: int | None) -> None:
        """KIP-447 for transactional offsets: the group checks the member; its error is
        answered as the Kafka error it wraps (25, 22)."""
        try:
            await self.groups.check_member(group, member, generation)
        except StaleMember as exc:
            raise exc.error from exc

    async def _partition_count(self, topic: str) -> int:
        """A topic's partition count, never creating it (leadership is asked of topics a
        request names: the request answers a missing one itself)."""
        return await self.admin.partitions(topic, create_with=None)

    async def topic_partitions(self, topic: str) -> int:
        """A topic's partition count, creating it as produce does (``AUTO_CREATE_TOPICS``):
        what the HTTP produce path asks before it routes a batch to its leader (a topic's
        partitions have leaders only once it exists)."""
        return await self._partitions_of(topic)

    async def _partitions_of(self, topic: str) -> int:
        s = self.settings
        return await self.admin.partitions(
            topic, create_with=s.default_partitions if s.auto_create_topics else None
        )

    async def _group_partitions_of(self, topic: str) -> int:
        """A group's topics are created only when GROUP_AUTO_CREATE_TOPICS says so (and
        AUTO_CREATE_TOPICS too): else 3, so that a typo in a join or reset is no topic."""
        s = self.settings
        create = s.auto_create_topics and s.group_auto_create_topics
        try:
            return await self.admin.partitions(
                topic, create_with=s.default_partitions if create else None
            )
        except UnknownTopicOrPartition as exc:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} does not exist; a group does not create topics (produce "
                "to it first, or set KOP_DEDUP_GROUP_AUTO_CREATE_TOPICS=true)"
            ) from exc

    def _copy_state_lost(self, txn: Transaction, part: Partition, present: int, want: int) -> None:
        """A recovery found the copy's producer name unknown to the broker, for a decision
        older than the broker keeps names: it counted what the data partition holds."""
        self.transactions.stats.copy_state_lost += 1
        complete = present == want
        log.log(
            logging.WARNING if complete else logging.ERROR,
            "the broker no longer knows the copy producer of transaction %d of %r on %s-%d "
            "(decided %d minutes ago): the partition holds %d of its %d batches; %s (check "
            "brokerDeduplicationProducerInactivityTimeoutMinutes)",
            txn.ordinal,
            txn.transactional_id,
            part.topic,
            part.partition,
            (now_ms() - txn.updated_ms) // 60_000,
            present,
            want,
            "complete, nothing copied again"
            if complete
            else "nothing is copied again (some could be stored twice): left undone",
        )

    async def start(self) -> None:
        s = self.settings
        await check_system_namespace(s, self.admin)  # before anything is created
        ns = self.naming.namespace_path
        await self.admin.ensure_namespace(ns, deduplication=s.ensure_deduplication)
        if not await self.admin.deduplication_enabled(ns):
            raise DeduplicationOff(
                f"deduplication is off on namespace {ns}; turn it on "
                f"(pulsar-admin namespaces set-deduplication {ns} --enable) or set "
                "KOP_DEDUP_ENSURE_DEDUPLICATION=true to let the sidecar do it"
            )
        await self.topics.prepare_namespace(ns)
        system_ns = f"{s.tenant}/{s.system_namespace}"
        await self.admin.ensure_namespace(system_ns, deduplication=True, infinite_retention=True)
        await self.admin.set_compaction_threshold(system_ns, s.registry_compaction_threshold_bytes)
        await self.registry.start()
        self.service.start()
        await self.offsets.start()
        gs = self.groups.settings
        self.groups.start(
            (gs.lag_interval_s, self.group_lag.refresh, "group-lag"),
            (gs.cursor_interval_s, self.group_lag.follow_cursors, "group-cursors"),
            (
                s.group_retention_check_interval_ms / 1000,
                self.group_retention.sweep,
                "group-retention",
            ),
        )
        await self.transactions.start()
        self.cluster.register_log(GROUP_LOG, self.offsets.parts)
        self.cluster.register_log(TRANSACTION_LOG, self.transactions.state.parts)
        log.info("ready: namespace %s has deduplication on", ns)

    async def join_cluster(self, kafka: tuple[str, int] | None) -> Member:
        """Join this node's cluster (the sidecars sharing its system namespace), as the
        node advertising ``kafka`` (host, port) to Kafka clients (None: no listener
        here), and load the state partitions the cluster gives it (waiting at most
        ``_LOAD_WAIT_S``). NodeIdInUse when a live node has this node's id;
        SecurityMismatch when a live node authenticates differently."""
        s = self.settings
        if kafka is None:  # no listener here: what Metadata of other nodes shows for it
            kafka = (
                split_address(s.kafka_advertised, "kafka_advertised")
                if s.kafka_advertised
                else (s.host, 0)
            )
        host, port = kafka
        peer = s.peer(host)
        me = Member(
            node_id=s.node_id if s.node_id is not None else default_node_id(host, port, peer),
            host=host,
            port=port,
            peer_url=peer,
            instance=uuid.uuid4().hex[:16],
            started_ms=now_ms(),
            security=await asyncio.to_thread(fingerprint, s),  # PBKDF2: off the loop
        )
        self.peers.identify(me.node_id)
        await self.membership.join(me)
        self.membership.start()
        if not await self.cluster.loaded(_LOAD_WAIT_S):
            log.warning(
                "cluster: not every state partition of node %d loaded within %.0f s; "
                "serving (changes to those answer COORDINATOR_LOAD_IN_PROGRESS meanwhile)",
                me.node_id,
                _LOAD_WAIT_S,
            )
        log.info(
            "cluster: node %d (%s:%d, peers reach it at %s) in a cluster of %d; owns %s",
            me.node_id,
            me.host,
            me.port,
            me.peer_url,
            len(self.cluster.members),
            self.cluster.owned_partitions(),
        )
        return me

    async def ready(self) -> tuple[bool, str]:
        """(ready, reason) for /readyz: the broker answers and dedup is on; asked of the
        broker at most once per :data:`READY_TTL_S` however often probes come."""
        return await self._readiness.get()

    async def _ask_ready(self) -> tuple[bool, str]:
        try:
            if not await self.admin.deduplication_enabled(self.naming.namespace_path):
                return False, "deduplication is off on the namespace"
        except Exception as exc:  # any failure to ask means not ready; no broker text
            return False, f"Pulsar admin unreachable ({type(exc).__name__})"
        return True, "ok"

    def begin_shutdown(self) -> None:
        """A stop was asked for (SIGTERM): the shutdown budget starts now; nothing new
        is taken, long polls answer what they have, and the node leaves its cluster at
        once, so that the others take its partitions over while it closes (each waits
        for it to hand a state partition over: :mod:`kop_dedup.coordination.partitions`)."""
        if self._stopping_at is None:
            self._stopping_at = _clock()
            self._leaving = asyncio.get_running_loop().create_task(
                self.membership.leave(), name="leave the cluster"
            )
        self.service.begin_shutdown()
        self.groups.begin_shutdown()

    async def _left(self) -> None:
        if self._leaving is not None:
            await self._leaving

    def shutdown_left_s(self) -> float:
        """What is left of the shutdown budget for closing (all of it before a stop
        began), less a margin for the process to exit."""
        total = self.settings.shutdown_timeout_ms / 1000
        budget = total - min(_EXIT_MARGIN_S, 0.1 * total)
        if self._stopping_at is None:
            return budget
        return max(0.0, self._stopping_at + budget - _clock())

    async def close(self) -> None:
        """Stop every part within what is left of ``shutdown_timeout_ms``, whatever the
        broker does: the parts close in phases (the coordinators, then produce, then the
        registry, then the clients), each phase within the time left, a part still
        closing at the end of it abandoned. Nothing acknowledged is lost (it was durable
        when it was answered); a coordinator partition that could not be marked closed
        cleanly is recovered by its next owner (uncommitted deliveries come again)."""
        self.begin_shutdown()
        deadline = _clock() + self.shutdown_left_s()

        async def groups() -> None:
            await self.groups.close()
            # half of what is left to mark the partitions clean: the rest closes after
            await self.offsets.close(timeout_s=0.5 * (deadline - _clock()))

        phases: list[list[tuple[str, Callable[[], Awaitable[None]]]]] = [
            [
                ("transactions", self.transactions.close),
                ("consumer groups", groups),
                ("stable offsets", self.stable.close),
                ("owners", self.authorizer.close),
            ],
            [("produce", self.service.close), ("cluster membership", self._left)],
            [("registry", self.registry.close)],
            [
                ("Pulsar client", self.publisher.close),
                ("admin client", self.admin.close),
                ("peer client", self.peers.close),
            ],
        ]
        for phase in phases:
            await _within(deadline, phase, self.settings.shutdown_timeout_ms)


def _clock() -> float:
    """The event loop's clock (monotonic): the shutdown budget's."""
    return asyncio.get_running_loop().time()


async def _within(
    deadline: float, parts: list[tuple[str, Callable[[], Awaitable[None]]]], budget_ms: int
) -> None:
    """Close ``parts`` at once, abandoning those still closing at ``deadline``."""
    tasks = {asyncio.ensure_future(close()): name for name, close in parts}
    done, late = await asyncio.wait(tasks, timeout=max(deadline - _clock(), _LAST_CHANCE_S))
    for task in late:
        task.cancel()
        log.warning(
            "stopping: %s did not close within the shutdown timeout (%d ms); left behind "
            "(the next owner recovers what it had not handed over)",
            tasks[task],
            budget_ms,
        )
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning("stopping: closing %s failed: %r", tasks[task], task.exception())
