"""The transaction coordinator's settings (derived from the sidecar's by the runtime)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kop_dedup.settings import Settings

__all__ = ["TxnSettings", "txn_settings"]


@dataclass(frozen=True, slots=True)
class TxnSettings:
    log_partitions: int = 8
    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 900_000
    check_back_max: int = 15
    check_back_interval_ms: int = 1_000
    """The first wait between two check-backs; it doubles, up to a minute."""
    check_back_timeout_s: float = 5.0
    """One check-back's whole deadline (connect, send, answer)."""
    check_back_urls: tuple[str, ...] = ()
    """URL prefixes a check-back URL must start with (none: check-backs are refused)."""
    check_back_max_response_bytes: int = 64 * 1024
    sweep_interval_s: float = 1.0
    handoff_wait_s: float = 5.0
    retry_interval_s: float = 1.0
    """How soon a decision whose application failed (Pulsar away) is tried again."""
    apply_delay_s: float = 0.0
    """Waits between a decision and its application (fault tests use it to crash there)."""
    busy_wait_s: float = 0.25
    """How long a call that meets the id's decision being applied on this sidecar waits
    for it before answering 51 CONCURRENT_TRANSACTIONS."""
    expiry_ms: int = 7 * 86_400_000
    decisions_retention_minutes: int = 1440
    max_message_bytes: int = 5 * 1024 * 1024
    """The broker's maxMessageSize: a batch whose journal entry or copy could exceed it is
    refused at produce (MESSAGE_TOO_LARGE)."""
    max_batch_records: int | None = None
    max_batch_bytes: int | None = None
    """The produce path's batch limits: a batch over them (or malformed: 87) is refused
    before its partition joins the transaction."""
    max_ids: int = 1_000_000
    """Transactional ids the log holds (spread over its partitions); a new one past it
    is refused (89)."""
    journal_whole_batches: bool = True
    """A journal entry is one message holding the whole batch (else one per record)."""


def txn_settings(settings: Settings) -> TxnSettings:
    """The transaction coordinator's settings."""
    return TxnSettings(
        log_partitions=settings.txn_log_partitions,
        default_timeout_ms=settings.default_transaction_timeout_ms,
        max_timeout_ms=settings.max_transaction_timeout_ms,
        check_back_max=settings.check_back_max,
        check_back_interval_ms=settings.check_back_interval_ms,
        check_back_timeout_s=settings.check_back_timeout_ms / 1000,
        check_back_urls=settings.check_back_prefixes(),
        check_back_max_response_bytes=settings.check_back_max_response_bytes,
        sweep_interval_s=settings.txn_sweep_interval_ms / 1000,
        handoff_wait_s=settings.cluster_handoff_ms / 1000,
        apply_delay_s=settings.txn_apply_delay_ms / 1000,
        busy_wait_s=settings.txn_busy_wait_ms / 1000,
        expiry_ms=int(settings.transactional_id_expiry_seconds * 1000),
        max_ids=settings.max_transactional_ids_in_log,
        decisions_retention_minutes=settings.journal_retention,
        max_message_bytes=settings.pulsar_max_message_bytes,
        journal_whole_batches=settings.txn_journal_whole_batches,
        max_batch_records=settings.max_batch_records,
        max_batch_bytes=settings.max_batch_bytes,
    )
