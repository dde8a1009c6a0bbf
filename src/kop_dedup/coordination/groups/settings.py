"""The group coordinator's settings (built from :mod:`kop_dedup.settings` by the
runtime)."""

from __future__ import annotations

from dataclasses import dataclass

from kop_dedup import errors

__all__ = ["GroupSettings", "full"]


def full(group_id: str, members: int, cap: int) -> None:
    """GROUP_MAX_SIZE_REACHED (81, as Kafka's ``group.max.size``) when a group of
    ``members`` has no room for one more."""
    if members >= cap:
        raise errors.GroupMaxSizeReached(
            f"group {group_id!r} has {members} members, the most a group may have "
            "(KOP_DEDUP_MAX_GROUP_MEMBERS)"
        )


@dataclass(frozen=True, slots=True)
class GroupSettings:
    cursor_interval_s: float = 5.0
    sweep_interval_s: float = 1.0
    lag_interval_s: float = 10.0
    reader_idle_s: float = 60.0
    default_session_timeout_ms: int = 30_000
    default_broadcast_expire_ms: int = 120_000
    max_pull_records: int = 10_000
    max_wait_ms: int = 60_000
    kafka_min_session_timeout_ms: int = 6_000
    """The shortest session a Kafka JoinGroup may ask (Kafka's
    ``group.min.session.timeout.ms``; shorter: INVALID_SESSION_TIMEOUT 26)."""
    max_members: int = 1_000
    """Members one group may have (Kafka's ``group.max.size``); one more joining: 81."""
    answer_delay_s: float = 0.0
    """Fault injection: wait this long between recording a pull and answering it."""
