"""Per-role quotas: the share of each global cap one role may hold.

Every global cap (transactional ids, consumer groups, Kafka connections) is shared by
all roles; without a share per role one role can fill it and lock every other out.
With authentication on, ``ROLE_QUOTA_PERCENT`` below 100 gives each role at most that
share of each cap (rounded down, at least one); superusers are not counted. Past it a
new one is 89 THROTTLING_QUOTA_EXCEEDED, whose message names the quota and the
setting; what the role already holds keeps working, and other roles keep their room.

Where each is counted:

===================  ========================================  ==========================
quota                counted                                   refused
===================  ========================================  ==========================
transactional ids    the owners table (every node agrees)      InitProducerId, 89 (429)
consumer groups      the owners table (every node agrees)      the group's first use, 89
Kafka connections    per node, authenticated connections       SaslAuthenticate 89, close
===================  ========================================  ==========================

>>> quota = RoleQuota("consumer groups", "MAX_GROUPS", cap=10, percent=30)
>>> quota.limit
3
>>> quota.check("alice", 3)
Traceback (most recent call last):
ThrottlingQuotaExceeded: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.settings import Settings

__all__ = ["RoleCounts", "RoleQuota", "owner_quotas", "share"]

_SETTING = "KOP_DEDUP_ROLE_QUOTA_PERCENT"


def share(cap: int, percent: int) -> int:
    """``percent`` of ``cap``, rounded down, at least one."""
    return max(1, cap * percent // 100)


@dataclass(frozen=True, slots=True)
class RoleQuota:
    """One cap's share per role: ``what`` it counts, the ``cap_setting`` it shares."""

    what: str
    cap_setting: str
    cap: int
    percent: int

    @property
    def limit(self) -> int:
        return share(self.cap, self.percent)

    def check(self, role: str, held: int) -> None:
        """89 THROTTLING_QUOTA_EXCEEDED when ``role``, holding ``held``, may take no more."""
        if held >= self.limit:
            raise errors.ThrottlingQuotaExceeded(
                f"role {role!r} holds {held} {self.what}, its quota: {self.percent}% of "
                f"KOP_DEDUP_{self.cap_setting} ({self.cap}) = {self.limit} ({_SETTING})"
            )


def owner_quotas(settings: Settings) -> dict[str, RoleQuota]:
    """The quotas the owners table enforces, by the kind of name it claims (none at
    ``ROLE_QUOTA_PERCENT=100``: the global caps alone apply, as before)."""
    percent = settings.role_quota_percent
    if percent >= 100:
        return {}
    return {
        "txn": RoleQuota(
            "transactional ids",
            "MAX_TRANSACTIONAL_IDS_IN_LOG",
            settings.max_transactional_ids_in_log,
            percent,
        ),
        "group": RoleQuota("consumer groups", "MAX_GROUPS", settings.max_groups, percent),
    }


@dataclass(slots=True)
class RoleCounts:
    """What each role holds of one per-node resource (Kafka connections), by ``quota``
    (None: nothing is refused, nothing counted)."""

    quota: RoleQuota | None
    held: dict[str, int] = field(default_factory=dict)

    @classmethod
    def connections(cls, settings: Settings) -> RoleCounts:
        percent = settings.role_quota_percent
        if percent >= 100:
            return cls(None)
        return cls(
            RoleQuota(
                "Kafka connections",
                "KAFKA_MAX_CONNECTIONS",
                settings.kafka_max_connections,
                percent,
            )
        )

    def acquire(self, role: str) -> bool:
        """Count one more for ``role`` (89 past its quota); False when nothing is counted."""
        if self.quota is None:
            return False
        held = self.held.get(role, 0)
        self.quota.check(role, held)
        self.held[role] = held + 1
        return True

    def release(self, role: str) -> None:
        left = self.held.pop(role, 1) - 1
        if left > 0:
            self.held[role] = left
