"""Settings: one ``KOP_DEDUP_`` env prefix, built by the CLI or ``create_app``.

Nothing reads the environment at import time; ``Settings()`` does when it is
called. Every field can be set as ``KOP_DEDUP_<FIELD>`` (upper case) or in a
``.env`` file.

This class is the one source of the configuration reference (the docs site's
``reference/configuration.md`` is generated from it): every field carries a
docstring, the string right below it, which pydantic keeps as the field's
description; the ``# -- `` comments name the page's sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from kop_dedup.settings_security import SecuritySettings

__all__ = ["Settings", "split_address"]

_PULSAR_NAME = r"^[-=:.\w]+$"  # a tenant or namespace name alone, as Pulsar allows it
_MAX_QUEUE_RECORDS = 1_000_000  # the client preallocates nothing, but a bound keeps it sane


def split_address(value: str, name: str = "address") -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as (host, port); ValueError naming ``name``."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{name} must be host:port, got {value!r}")
    return host.strip("[]"), int(port)


class Settings(SecuritySettings):
    model_config = SettingsConfigDict(
        env_prefix="KOP_DEDUP_", env_file=".env", extra="ignore", use_attribute_docstrings=True
    )

    # -- where Pulsar is
    pulsar_service_url: str = "pulsar://127.0.0.1:6650"
    """The broker (``pulsar+ssl://`` for TLS); ``kop-dedup serve --pulsar-service-url``
    overrides it."""
    pulsar_admin_url: str = "http://127.0.0.1:8080"
    """The broker's admin REST API; ``--pulsar-admin-url`` overrides it."""
    pulsar_auth_token: SecretStr | None = Field(default=None, repr=False)
    """Token authentication to Pulsar, client and admin API alike."""
    pulsar_auth_token_file: Path | None = None
    """A file holding the Pulsar token (read at start; the setting above wins)."""
    pulsar_tls_trust_certs_file: Path | None = None
    """CA certificates to trust for TLS to Pulsar."""
    pulsar_tls_allow_insecure: bool = False
    """TLS to Pulsar: accept a certificate that does not verify."""
    pulsar_tls_validate_hostname: bool = True
    """TLS to Pulsar: check the certificate's host name."""

    # -- where data goes
    tenant: str = Field(default="public", pattern=_PULSAR_NAME)
    """The Pulsar tenant Kafka topics live in."""
    namespace: str = Field(default="kafka", pattern=_PULSAR_NAME)
    """The Pulsar namespace Kafka topics live in (deduplication on)."""
    system_namespace: str = Field(default="kop-dedup-system", pattern=_PULSAR_NAME)
    """The sidecar's own topics: registries, transaction log and journals, consumer
    groups (deduplication on, compacted tables read compacted)."""
    producer_name_prefix: str = "kop"
    """Pulsar producer names are ``<prefix>-<producerId>-<epoch>``."""
    ensure_deduplication: bool = True
    """Enable dedup on the namespace at start-up; when False, refuse to start if it is off."""
    auto_create_topics: bool = True
    """Produce creates a missing topic as a partitioned topic (Kafka's
    ``auto.create.topics.enable``)."""
    default_partitions: int = Field(default=1, ge=1, le=10_000)
    """Partitions of a topic produce creates."""
    group_auto_create_topics: bool = False
    """A group join or reset naming a missing topic creates it (when ``auto_create_topics``
    is on too); off: 3 UNKNOWN_TOPIC_OR_PARTITION (HTTP 404), so a typo is no topic."""

    # -- produce behaviour
    reorder_window_ms: int = Field(default=5_000, ge=0)
    """How long a batch that arrives ahead of a sequence gap waits for the gap to fill."""
    strict_fencing: bool = True
    """Judge every idempotent batch on a view of the epochs fenced through other sidecars
    that is at most ``fencing_lease_ms`` old (a coalesced catch-up when it is older);
    off: caught up only when a producer opens."""
    fencing_lease_ms: int = Field(default=200, ge=0)
    """With ``strict_fencing``: the epochs are caught up in the background every third
    of this, a batch is judged without a catch-up of its own while the last one began
    less than this ago, and a new epoch (InitProducerId, a producer's first batch of
    it) is answered only this long after it is stored, so that every sidecar fences the
    old epoch from then on. 0: a catch-up per batch (one broker round trip)."""
    default_timeout_ms: int = Field(default=30_000, ge=1)
    """A produce request's deadline when it gives no ``timeoutMs``."""
    max_timeout_ms: int = Field(default=300_000, ge=1)
    """The largest ``timeoutMs`` a request may give (a larger one is a 422 naming the
    field; ``/openapi.json`` shows the same maximum)."""
    send_timeout_ms: int = Field(default=30_000, ge=1_000)
    """The Pulsar producers' send timeout."""
    max_inflight_batches: int = Field(default=5, ge=1, le=100)
    """Batches of one producer on one partition handed to Pulsar at once (Kafka clients
    keep at most 5 in flight); more wait for an answer. The Pulsar client's queue holds
    ``max_batch_records`` x this records (at most 1,000,000)."""
    max_batch_records: int = Field(default=10_000, ge=1, le=100_000)
    """Records in one batch; more is 10 MESSAGE_TOO_LARGE."""
    max_batch_bytes: int = Field(default=1 << 20, ge=1, le=4 << 20)
    """Bytes in one batch (at most ``pulsar_max_message_bytes``); more is 10
    MESSAGE_TOO_LARGE."""
    pulsar_max_message_bytes: int = Field(default=5 * 1024 * 1024, ge=64 * 1024)
    """The broker's ``maxMessageSize`` (5 MiB by default): a batch whose Pulsar entry could
    exceed it is refused with MESSAGE_TOO_LARGE before it is sent."""
    max_request_bytes: int = Field(default=16 << 20, ge=1024)
    """The largest HTTP request body; larger is 413."""
    max_txn_request_bytes: int = Field(default=1 << 20, ge=1024)
    """The largest body of ``init-producer-id``, ``end-txn`` and ``txn-offset-commit``
    (read before their routes, to find the transactional id's coordinator, and only once
    the caller's token is accepted); larger is 413, before any of it is parsed. 1 MiB
    holds a txn-offset-commit of about 10,000 partitions."""
    max_inflight_bytes: int = Field(default=32 << 20, ge=1024)
    """Produce request bodies held at once; a request that does not fit waits, after its
    body is read and before it is parsed, until earlier ones are answered (first come,
    first served; one larger than the budget runs alone). Parsed records take many times
    their JSON size (about 20x for 100-byte values): size the container's memory limit
    accordingly."""
    http_queued_max_request_bytes: int = Field(default=64 << 20, ge=1024)
    """HTTP request bodies held at once over every connection (Kafka's
    ``queued.max.request.bytes``), each from before it is read until it is answered: a
    ``Content-Length`` that does not fit beside the others is answered 429 (89
    THROTTLING_QUOTA_EXCEEDED, ``Retry-After``) with nothing read, a chunked body when the
    chunk that does not fit arrives; a request alone is always admitted."""
    http_request_read_timeout_ms: int = Field(default=30_000, ge=100)
    """An HTTP request's body must be whole this long after the request began; else 408
    and its share of ``HTTP_QUEUED_MAX_REQUEST_BYTES`` is let go."""
    max_batches_per_request: int = Field(default=1_000, ge=1)
    """Batches in one produce request; more is 413 with ``errorCode`` 42 INVALID_REQUEST
    (answered once for the request, none of its batches produced)."""
    producer_idle_seconds: float = Field(default=300.0, gt=0)
    """An idle Pulsar producer is closed after this long; its state comes back from the
    broker when it is opened again."""
    max_open_producers: int = Field(default=2_000, ge=1)
    """Pulsar producers held at once (one per idempotent producer per partition, one per
    partition for plain produce; opening and closing ones count), a hard bound: a batch
    for one more closes the least recently used idle producer and waits for its close
    (the name takes the broker's mark again when it reopens), or, when every one is busy,
    waits for one to fall idle until its deadline and is then answered 7
    REQUEST_TIMED_OUT (retriable). Each open producer costs the client a connection
    slot, a queue and broker state; see the performance page for the memory per producer."""
    max_remembered_producers: int = Field(default=100_000, ge=1)
    """Closed producers whose stored sequence (and where a producer started) the sidecar
    remembers, least recently used dropped first: how a broker that lost its dedup state
    is noticed; also bounds the epochs remembered per partition."""
    dedup_policy_ttl_seconds: float = Field(default=10.0, ge=0)
    """How long the effective deduplication of a topic (topic policy, else namespace, else
    broker) is reused before it is asked again, when it is on (an "off" answer is asked
    again every time)."""

    # -- stats and metrics
    stats_max_topics: int = Field(default=1_000, ge=1)
    """Topic names counted by name in /v1/stats and /metrics (a label each); batches to
    further names are counted under ``~other``, to invalid names under ``~invalid``."""
    stats_max_producers: int = Field(default=10_000, ge=1)
    """Producer ids whose counters /v1/stats/producers keeps: the most recently used;
    the least recently used is dropped first (counted in ``producersEvicted``)."""

    # -- the registries in the system namespace
    registry_compaction_threshold_bytes: int = Field(default=1 << 20, ge=0)
    """Set on the system namespace: the broker compacts a registry topic once this many
    bytes are uncompacted, so a start reads about one record per key (0: the broker
    compacts only when a start finds the topic worth it)."""

    producer_epoch_expiry_seconds: float = Field(default=7 * 86_400.0, ge=60)
    """A producer id's epoch is forgotten this long after it was last raised (as Kafka
    forgets producer state after ``producer.id.expiration.ms``); a zombie of a forgotten
    producer id is no longer fenced by the registry (see Limits)."""
    max_producer_epochs: int = Field(default=200_000, ge=1_000)
    """Producer ids whose epoch is kept in memory; above it, those raised longest ago
    are forgotten first (about 230 bytes each)."""
    transactional_id_expiry_seconds: float = Field(default=7 * 86_400.0, ge=60)
    """A transactional id (in the legacy table and the transaction log) is forgotten
    this long after its last change; its next init gets a new producer id at epoch 0."""
    max_transactional_ids: int = Field(default=100_000, ge=1_000)
    """Transactional ids kept in the legacy table's memory; above it, those initialised
    longest ago are forgotten first."""
    registry_sweep_seconds: float = Field(default=60.0, ge=1)
    """How often expired and over-cap registry entries are dropped (logged at INFO) and
    tombstoned."""

    # -- transactions
    txn_log_partitions: int = Field(default=8, ge=1, le=256)
    """Partitions of the transaction log (fixed once the log exists: ids hash onto them)."""
    default_transaction_timeout_ms: int = Field(default=60_000, ge=1)
    """A transaction's timeout when init-producer-id names none."""
    max_transaction_timeout_ms: int = Field(default=900_000, ge=1)
    """Kafka's ``transaction.max.timeout.ms``: longer timeouts answer 50
    INVALID_TRANSACTION_TIMEOUT."""
    check_back_max: int = Field(default=15, ge=1, le=1000)
    """Check-backs asked before a transaction in doubt is aborted."""
    check_back_interval_ms: int = Field(default=1_000, ge=10)
    """The first wait between check-backs; it doubles each time, up to a minute."""
    check_back_timeout_ms: int = Field(default=5_000, ge=10)
    """One check-back's total deadline: connecting, sending and the whole answer."""
    check_back_urls: str = ""
    """Comma-separated URL prefixes a ``checkBackUrl`` may start with
    (``https://app.internal:8443/txn/``); empty: a ``checkBackUrl`` is refused (400)."""
    check_back_max_response_bytes: int = Field(default=64 * 1024, ge=16)
    """The largest check-back answer read; a longer one counts as no answer."""
    txn_sweep_interval_ms: int = Field(default=1_000, ge=10)
    """How often the owner of a log partition looks for timed-out transactions."""
    journal_retention_minutes: int = Field(default=1440, ge=1)
    """How long journals (and the decisions log) keep records: at least twice
    ``max_transaction_timeout_ms`` (the longest transaction plus its recovery), which it
    follows when that is longer (:attr:`journal_retention`)."""
    txn_apply_delay_ms: int = Field(default=0, ge=0)
    """Fault injection: wait this long between a decision and applying it (the fault
    tests crash a coordinator there)."""
    txn_busy_wait_ms: int = Field(default=250, ge=0)
    """How long AddPartitionsToTxn, AddOffsetsToTxn, a transactional produce or EndTxn
    that meets the transaction's previous decision still being applied on this sidecar
    waits for it before answering 51 CONCURRENT_TRANSACTIONS (0: answer at once, as a
    Kafka broker does; the clients then back off 20-100 ms before they retry)."""
    txn_journal_whole_batches: bool = True
    """Journal a transactional batch as one message holding the whole batch (one send
    instead of one per record). Sidecars older than this setting read only the
    per-record layout: keep it false until every sidecar sharing the system namespace
    runs a version that has it (they all read both)."""
    txn_local_copy_max_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    """Memory for the local copy of journaled transactional batches, which commits copy
    from; past it the oldest transactions are evicted and their commits read the journal
    back (slower, same result). 0: always read the journal."""
    txn_local_copy_max_transactions: int = Field(default=10_000, ge=1)
    """Transactions the local copy keeps at most (the least recently used evicted; their
    commits read the journal)."""
    broker_dedup_producer_inactivity_minutes: int = Field(default=360, ge=1)
    """The broker's ``brokerDeduplicationProducerInactivityTimeoutMinutes``: how long it
    remembers a producer name after its last disconnect. A commit decided longer ago
    whose copy producer the broker no longer knows is not copied again blindly: what
    the data partition holds is counted first (see docs/concepts/exactly-once.md)."""
    txn_remembered_partitions: int = Field(default=10_000, ge=1)
    """Data partitions whose journal (created, with its retention) and latest positions
    a sidecar remembers (the least recently used forgotten: asked of the broker again
    when needed)."""

    # -- consumer groups
    offsets_partitions: int = Field(default=8, ge=1, le=256)
    """Partitions of the consumer-groups log: offsets, members, deliveries, resets (fixed once
    it exists: group ids hash onto them)."""
    group_session_timeout_ms: int = Field(default=30_000, ge=100)
    """A group's default sessionTimeoutMs (PUT /v1/groups/{id} sets its own)."""
    group_broadcast_expire_ms: int = Field(default=120_000, ge=100)
    """A broadcast group's default broadcastExpireMs: members seen this recently count
    for the group minimum a new member starts at."""
    group_sweep_interval_ms: int = Field(default=1_000, ge=10)
    """How often the owner of a groups partition looks for members past their session."""
    group_cursor_interval_ms: int = Field(default=5_000, ge=100)
    """How often each group's durable Pulsar subscription is moved to its commits (so
    retention keeps what the group has not consumed)."""
    group_lag_interval_ms: int = Field(default=10_000, ge=100)
    """How often the owner of a groups partition recomputes its groups' lag for
    /metrics (a scrape reads the last result; GET /v1/groups/{id}/lag computes now)."""
    group_metrics_max_series: int = Field(default=1_000, ge=1, le=100_000)
    """Group partition rows exported one by one in /metrics (the most lagging first);
    the others are summed under group="~other"."""
    group_retention_ms: int = Field(default=7 * 24 * 3_600_000, ge=1_000)
    """A group with no members, no offsets pending in a transaction and nothing done
    (no commit, no join or leave, no reset, no pull) for this long is forgotten, its
    offsets and its Pulsar subscription with it (Kafka's offsets.retention.minutes: 7
    days)."""
    group_retention_check_interval_ms: int = Field(default=60_000, ge=10)
    """How often the owner of a groups partition looks for groups past their retention,
    departed broadcast members past broadcastExpireMs, and pending-offset markers whose
    transaction ended without removing them."""
    kafka_group_min_session_timeout_ms: int = Field(default=6_000, ge=1)
    """The shortest session timeout a Kafka consumer may ask in JoinGroup (Kafka's
    ``group.min.session.timeout.ms``; shorter: 26 INVALID_SESSION_TIMEOUT)."""
    kafka_consumer_session_timeout_ms: int = Field(default=45_000, ge=1_000)
    """A KIP-848 member silent this long is removed (``group.consumer.session.timeout.ms``)."""
    kafka_consumer_heartbeat_interval_ms: int = Field(default=5_000, ge=100)
    """How often a KIP-848 member heartbeats (``group.consumer.heartbeat.interval.ms``)."""
    group_reader_idle_ms: int = Field(default=60_000, ge=100)
    """A member's partition reader kept between pulls closes after this long unused."""
    group_pull_answer_delay_ms: int = Field(default=0, ge=0)
    """Fault injection: wait this long between recording a pull and answering it."""
    max_pull_records: int = Field(default=10_000, ge=1, le=100_000)
    """The cap on a pull's ``maxRecords`` (more is served as this many)."""
    max_pull_wait_ms: int = Field(default=60_000, ge=0)
    """The cap on a pull's ``waitMs`` (more is a 422 naming the field, the maximum
    ``/openapi.json`` shows; a wait is also at most half the group's session) and on a
    Kafka Fetch's ``max_wait_ms``."""

    # -- stopping
    shutdown_timeout_ms: int = Field(default=20_000, ge=100)
    """A stop (SIGTERM) ends within this long whatever the broker does (under
    Kubernetes' 30 s grace): requests in flight get half of it (at most
    ``--graceful-seconds``), then every part closes within what is left. Nothing
    acknowledged is lost; what could not be handed over cleanly is recovered by the
    next owner."""

    # -- the cluster (kop_dedup.cluster): sidecars sharing a system namespace are one
    node_id: int | None = Field(default=None, ge=0, le=2**31 - 2)
    """This node's Kafka broker id, unique in the cluster (a StatefulSet's pod ordinal,
    say); default: derived from the advertised Kafka address, stable as long as it is."""
    peer_url: str | None = None
    """The URL other nodes reach this node's HTTP API at, for forwarded requests
    (``http://10.0.0.7:8090``); default: ``http://<host>:<port>``, with the advertised
    Kafka host when ``host`` binds every address."""
    cluster_mode: Literal["cluster", "sidecar"] = "cluster"
    """``cluster``: Kafka clients are told every node and go to the owner of what they
    use; ``sidecar``: this node's Kafka listener answers as a one-node cluster (clients
    that can reach only their own sidecar) and forwards what other nodes own."""
    cluster_refresh_ms: int = Field(default=1_000, ge=10)
    """How often a node lists the cluster's live members (Pulsar's view): ownership
    follows a change within about this long."""
    cluster_handoff_ms: int = Field(default=5_000, ge=0)
    """How long a new owner waits for the previous one to hand a state partition over
    (close its writer) before it fences it: bounds a takeover from a node that hangs."""

    # -- HTTP
    host: str = "127.0.0.1"
    """Where the HTTP API listens; ``kop-dedup serve --host`` overrides it."""
    port: int = Field(default=8090, ge=0, le=65535)
    """The HTTP API's port; ``--port`` overrides it."""
    auth_tokens: list[SecretStr] = Field(default_factory=list, repr=False)
    """Bearer tokens for ``/v1/*`` and ``/metrics`` (a JSON list); ``/healthz``,
    ``/readyz`` and ``/docs`` stay open. With tokens, the Kafka listener requires
    SASL/PLAIN with a token as the password."""
    auth_tokens_file: Path | None = None
    """A file of bearer tokens, one per line (``#`` comments), added to ``auth_tokens``."""
    http_tls_cert: Path | None = None
    """PEM certificate chain: the HTTP API speaks HTTPS when it and ``http_tls_key`` are
    set (passed to uvicorn)."""
    http_tls_key: Path | None = None
    """PEM private key of ``http_tls_cert``."""

    log_format: Literal["auto", "json", "console"] = "auto"
    """``auto``: JSON when stdout is not a terminal; one line per batch not stored (46,
    45, 47, ...)."""
    log_level: str = "INFO"
    """The root log level; at ``DEBUG`` one line per stored batch too, and per Kafka
    request."""

    # -- the Kafka wire listener (kop_dedup.transports.kafka)
    kafka_listener: str = "127.0.0.1:9092"
    """``host:port`` Kafka clients connect to, served beside HTTP by ``kop-dedup serve``;
    port 0 takes a free port. Empty (``KOP_DEDUP_KAFKA_LISTENER=``) turns the listener off."""
    kafka_advertised: str | None = None
    """``host:port`` the listener tells clients to connect back to (Metadata,
    FindCoordinator); default: the listener's bound address. Set it when listening on
    ``0.0.0.0`` or behind NAT."""
    kafka_auto_create_topics: bool = True
    """Create a topic a Metadata request names when the client allows it (Kafka's
    ``auto.create.topics.enable``); Produce never creates one."""
    kafka_default_partitions: int = Field(default=1, ge=1, le=10_000)
    """Partitions of a topic created by Metadata or by CreateTopics with -1."""
    kafka_max_request_bytes: int = Field(default=16 << 20, ge=1024)
    """Largest request frame (Kafka's ``socket.request.max.bytes``); a larger one closes
    its connection, as Kafka does."""
    kafka_max_request_inflated_bytes: int = Field(default=64 << 20, ge=1024)
    """What the compressed batches of one Produce request may inflate to together (each
    batch is also held to ``MAX_BATCH_BYTES``): inflating stops as the request passes it,
    and that partition and those after it are answered 10 MESSAGE_TOO_LARGE naming this
    setting (a 16 MiB frame of tiny batches of zeros would otherwise ask for ~100 GiB)."""
    kafka_max_connection_inflated_bytes: int = Field(default=128 << 20, ge=1024)
    """Inflated bytes one connection's Produce requests may hold at once (Kafka's
    ``queued.max.request.bytes``, per connection): a request reserves
    ``KAFKA_MAX_REQUEST_INFLATED_BYTES`` before it inflates anything, keeps what it
    inflated until it is answered, and waits (the client waits for its answer) while
    the connection's earlier requests hold too much; one larger than this runs alone."""
    kafka_queued_max_request_bytes: int = Field(default=256 << 20, ge=1024)
    """Request bytes the Kafka listener holds at once over every connection (Kafka's
    ``queued.max.request.bytes``): a frame is admitted from its size header, before its
    body is read, until it is answered; while it does not fit, its connection reads
    nothing more (TCP pushes back on the client; no error), first come first served. A
    frame larger than this is admitted alone."""
    kafka_produce_offsets: Literal["derive", "lookup", "none"] = "derive"
    """The base offset a Produce answer carries: ``derive`` it from the offset of the
    entry before when this sidecar knows it (entries are dense within a ledger), else
    ask the broker (one admin call); ``lookup``: always ask; ``none``: answer -1."""
    kafka_transaction_produce_offsets: Literal["floor", "none"] = "floor"
    """The base offset a Produce answer carries for a batch in a transaction, whose
    offsets are known only once its transaction is committed and copied: ``floor``, the
    partition's end as this sidecar last knew it (the records land at or above it; Kafka
    Streams keeps it as its changelog checkpoint and, after a clean restart, restores only
    past it); ``none``: -1, as before (Streams then restores its stores from the whole
    changelog at every start)."""
    kafka_log_retention_ms: int = Field(default=7 * 24 * 3_600_000, ge=-1)
    """Kafka's ``log.retention.ms`` for topics without their own ``retention.ms``: set as
    the data namespace's retention (rounded up to minutes; -1 keeps forever) when it has
    none. Pulsar deletes a ledger that no subscription holds once it is this old, and
    Kafka consumers read through readers, which hold nothing (see the retention docs)."""
    kafka_log_retention_bytes: int = Field(default=-1, ge=-1)
    """Kafka's ``log.retention.bytes`` (per partition) for topics without their own
    ``retention.bytes`` (rounded up to MB; -1 unbounded), set with the time."""
    kafka_retention_check: Literal["warn", "refuse"] = "warn"
    """A data namespace whose retention policy keeps less than the two above (set by an
    operator: the sidecar never shortens or overrides one) is logged at start with the
    command that fixes it (``warn``), or the sidecar refuses to start (``refuse``)."""
    kafka_tls_cert: Path | None = None
    """PEM certificate chain: the listener speaks TLS (``security.protocol=SSL``, or
    ``SASL_SSL`` with tokens) when it and ``kafka_tls_key`` are set."""
    kafka_tls_key: Path | None = None
    """PEM private key of ``kafka_tls_cert``."""

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ValueError("default_timeout_ms must not exceed max_timeout_ms")
        if self.producer_queue_records > _MAX_QUEUE_RECORDS:
            raise ValueError(
                f"max_batch_records x max_inflight_batches = {self.producer_queue_records} "
                f"records per Pulsar producer queue; the limit is {_MAX_QUEUE_RECORDS}"
            )
        if self.default_transaction_timeout_ms > self.max_transaction_timeout_ms:
            raise ValueError(
                "default_transaction_timeout_ms must not exceed max_transaction_timeout_ms"
            )
        if self.max_batch_bytes > self.pulsar_max_message_bytes:
            raise ValueError("max_batch_bytes must not exceed pulsar_max_message_bytes")
        if max(self.default_partitions, self.kafka_default_partitions) > (
            self.max_partitions_per_topic
        ):
            raise ValueError("default partitions must not exceed max_partitions_per_topic")
        if (self.http_tls_cert is None) != (self.http_tls_key is None):
            raise ValueError("http_tls_cert and http_tls_key go together: set both or neither")
        if (self.kafka_tls_cert is None) != (self.kafka_tls_key is None):
            raise ValueError("kafka_tls_cert and kafka_tls_key go together: set both or neither")
        for name in ("kafka_listener", "kafka_advertised"):
            value = getattr(self, name)
            if value:
                split_address(value, name)
        return self

    @property
    def journal_retention(self) -> int:
        """The journals' retention in minutes: ``journal_retention_minutes``, raised to
        twice ``max_transaction_timeout_ms`` when that is longer (a journal must outlive
        the longest transaction plus its recovery: Flink's one-hour
        ``transaction.timeout.ms`` needs ``MAX_TRANSACTION_TIMEOUT_MS=3600000``, and its
        journals then keep at least two hours)."""
        needed = -(-2 * self.max_transaction_timeout_ms // 60_000)
        return max(self.journal_retention_minutes, needed)

    @property
    def producer_queue_records(self) -> int:
        """Records a channel's Pulsar producer queues: room for every batch in flight."""
        return self.max_batch_records * self.max_inflight_batches

    @model_validator(mode="after")
    def _sweep_within_expiry(self) -> Settings:
        shortest = min(self.producer_epoch_expiry_seconds, self.transactional_id_expiry_seconds)
        if self.registry_sweep_seconds > shortest:
            raise ValueError(
                "registry_sweep_seconds must not exceed the registry expiries "
                f"({shortest:g} s): entries would outlive their expiry by more than itself"
            )
        return self

    def peer(self, kafka_host: str) -> str:
        """The URL other nodes forward HTTP requests to (see ``peer_url``)."""
        if self.peer_url:
            return self.peer_url.rstrip("/")
        host = kafka_host if self.host in {"", "0.0.0.0", "::"} else self.host  # noqa: S104
        scheme = "http" if self.http_tls_cert is None else "https"
        return f"{scheme}://{host}:{self.port}"

    def kafka_address(self) -> tuple[str, int] | None:
        """(host, port) of the Kafka listener; None when it is off."""
        if not self.kafka_listener.strip():
            return None
        return split_address(self.kafka_listener, "kafka_listener")

    def check_back_prefixes(self) -> tuple[str, ...]:
        """The allowed check-back URL prefixes (``check_back_urls``, comma-separated)."""
        return tuple(u.strip() for u in self.check_back_urls.split(",") if u.strip())

    def pulsar_admin_verify(self) -> bool | str:
        """httpx's ``verify`` for the admin API: the trusted CA file, or False when
        insecure TLS is allowed."""
        if self.pulsar_tls_allow_insecure:
            return False
        if self.pulsar_tls_trust_certs_file is not None:
            return str(self.pulsar_tls_trust_certs_file)
        return True

    def pulsar_token(self) -> str | None:
        """The Pulsar auth token from the setting or its file, if any."""
        if self.pulsar_auth_token is not None:
            return self.pulsar_auth_token.get_secret_value()
        if self.pulsar_auth_token_file is not None:
            return self.pulsar_auth_token_file.read_text().strip()
        return None

    def http_tokens(self) -> frozenset[str]:
        """Bearer tokens accepted on the API (empty: authentication off)."""
        tokens = {t.get_secret_value() for t in self.auth_tokens}
        if self.auth_tokens_file is not None:
            for raw in self.auth_tokens_file.read_text().splitlines():
                line = raw.strip()
                if line and not line.startswith("#"):
                    tokens.add(line)
        return frozenset(tokens)
