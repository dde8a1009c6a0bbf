"""The security settings (roles and permissions; inputs and limits): a base of
:class:`~kop_dedup.settings.Settings`, which every caller uses. They live here so that
the settings class stays readable; the configuration reference reads their ``# --``
sections from this class's source (:mod:`kop_dedup_tools.settings_reference` walks the
class's bases)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["SecuritySettings"]


class SecuritySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KOP_DEDUP_", env_file=".env", extra="ignore", use_attribute_docstrings=True
    )

    # -- security: roles and permissions
    auth_roles_file: Path | None = None
    """A file of ``role:token`` lines (``#`` comments): each token authenticates as its
    role. Re-read when it changes (a removed line is refused at the next request)."""
    auth_token_secret_key: SecretStr | None = Field(default=None, repr=False)
    """Pulsar's ``tokenSecretKey``: JWTs signed with it (HS256) authenticate as their
    ``sub`` claim. As Pulsar: ``file:///path``, ``data:;base64,...``, a path, or the key
    in base64."""
    auth_token_public_key: str | None = None
    """Pulsar's ``tokenPublicKey`` (DER or PEM; ``file:///path``, ``data:;base64,...``, a
    path, or base64): JWTs signed with the matching private key authenticate."""
    auth_token_public_alg: str = "RS256"  # noqa: S105 (an algorithm name)
    """Pulsar's ``tokenPublicAlg``: the signature algorithm of public-key tokens."""
    auth_token_claim: str = "sub"  # noqa: S105 (a claim name)
    """Pulsar's ``tokenAuthClaim``: the JWT claim naming the role."""
    superuser_roles: str = ""
    """Comma-separated roles that may do everything (Pulsar's ``superUserRoles``); the
    ``auth_tokens`` always act as a superuser."""
    auth_permissions_ttl_ms: int = Field(default=10_000, ge=0)
    """How long Pulsar's permissions (namespace and topic grants, the tenant's admin
    roles) are reused before they are read again: a grant or a revocation takes effect
    within this long."""
    allow_unauthenticated: bool = False
    """Listen on an address other than loopback with authentication off (no tokens, no
    roles, no keys); without it the sidecar refuses to start there."""
    allow_plaintext_auth: bool = False
    """With authentication on, listen without TLS (HTTP or Kafka) on an address other
    than loopback, or forward to an ``http://`` peer URL on another host: tokens and
    SASL/PLAIN passwords then cross the network in cleartext. Without it the sidecar
    refuses to start so; with it, it starts and logs a WARNING naming each exposure (for
    a TLS-terminating proxy or a mesh with mutual TLS in front)."""
    peer_tls_trust_certs_file: Path | None = None
    """CA certificates to trust for ``https://`` peer URLs (forwarding between nodes);
    default: the system's. Peers' certificates are checked, their host name too."""
    system_namespace_check: Literal["warn", "refuse"] = "warn"
    """With a Pulsar token set: a system namespace whose permissions grant any role other
    than this sidecar's own (and the superusers) is logged at start as an ERROR naming
    the roles (``warn``), or the sidecar refuses to start (``refuse``)."""

    # -- inputs and limits
    kafka_max_unauthenticated_bytes: int = Field(default=512 * 1024, ge=1024)
    """Largest frame before SASL authentication (Kafka's ``sasl.server.max.receive.size``):
    judged from the size header, the connection closed before the body is read."""
    kafka_request_read_timeout_ms: int = Field(default=30_000, ge=100)
    """Once a request's first byte arrives, the whole request must arrive within this
    long, or the connection closes (a client that sends a size and stops holds nothing)."""
    kafka_failed_auth_delay_ms: int = Field(default=100, ge=0)
    """After a failed SASL authentication, the answer is sent and the connection closed
    this much later (Kafka's ``connection.failed.authentication.delay.ms``)."""
    kafka_max_connections: int = Field(default=10_000, ge=1)
    """Kafka connections open at once (Kafka's ``max.connections``); one more is closed
    as it is accepted."""
    kafka_max_connections_per_address: int = Field(default=1_000, ge=1)
    """Kafka connections open at once from one client address (``max.connections.per.ip``)."""
    kafka_max_auto_create_topics: int = Field(default=100, ge=0)
    """Topics one Metadata request may create; further missing topics it names are
    answered 3 UNKNOWN_TOPIC_OR_PARTITION (the next request may create them)."""
    kafka_fetch_max_bytes: int = Field(default=55 * 1024 * 1024, ge=1024)
    """The cap on a Fetch's ``max_bytes`` (Kafka's ``fetch.max.bytes``); a larger ask is
    served as this much."""
    max_transactional_ids_in_log: int = Field(default=1_000_000, ge=1)
    """Transactional ids the transaction log holds at once (each until
    ``transactional_id_expiry_seconds`` after its last change; each log partition holds
    its share, rounded up); InitProducerId for a new one past it is 89
    THROTTLING_QUOTA_EXCEEDED. About 1 KiB of memory each on the node that owns it."""
    max_groups: int = Field(default=100_000, ge=1)
    """Consumer groups the groups log holds (Kafka's and HTTP's; each log partition holds
    its share, rounded up); a change that would start a new one past it is 89
    THROTTLING_QUOTA_EXCEEDED (HTTP 429). A group goes with ``group_retention_ms``."""
    max_group_members: int = Field(default=1_000, ge=1)
    """Members one consumer group may have (Kafka's ``group.max.size``), over both
    transports; one more joining is 81 GROUP_MAX_SIZE_REACHED (HTTP 409)."""
    max_partitions_per_topic: int = Field(default=1_000, ge=1, le=100_000)
    """Partitions a topic may have (CreateTopics, CreatePartitions, the HTTP API);
    more is 37 INVALID_PARTITIONS (HTTP 400)."""
