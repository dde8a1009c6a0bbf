"""The transaction coordinator's settings (derived from the sidecar's by the runtime)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TxnSettings"]


@dataclass(frozen=True, slots=True)
class TxnSettings:
    log_partitions: int = 8
    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 900_000
    check_back_max: int = 15
    check_back_interval_ms: int = 1_000
    """The first wait between two check-backs; it doubles, up to a minute."""
    check_back_timeout_s: float = 5.0
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
    journal_whole_batches: bool = True
    """A journal entry is one message holding the whole batch (else one per record)."""
