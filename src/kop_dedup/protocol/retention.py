"""Retention in Pulsar's units, from Kafka's, and what a start does with the data
namespace's policy (pure: no I/O).

Kafka keeps a partition's records for ``retention.ms`` and up to ``retention.bytes``
whoever read them; Pulsar keeps what a subscription has not acknowledged whatever its
age, and what every subscription has acknowledged (or what no subscription holds, as
the readers Kafka consumers read through) for its retention policy: minutes and
megabytes per topic (here: per partition, as Kafka's ``retention.bytes``), -1 for no
limit, checked ledger by ledger when a ledger rolls over. With Pulsar's default policy
(0 minutes, 0 MB) a record no subscription holds is deleted at the next roll-over (a
broker restart, a bundle move, a full ledger). So the data namespace gets Kafka's
``log.retention.ms`` / ``log.retention.bytes`` as an explicit policy when it has none,
and a policy an operator set that keeps less is reported with the command that fixes
it (:func:`namespace_plan`).

>>> Retention.from_kafka(604_800_000, -1)
Retention(minutes=10080, megabytes=-1)
>>> Retention(0, 0).keeps_at_least(Retention(10080, -1))
False
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["INFINITE", "NamespacePlan", "Retention", "Verdict", "namespace_plan"]

_MINUTE_MS = 60_000
_MB = 1 << 20
_UNBOUNDED = -1


def _ceil(value: int, unit: int) -> int:
    return value if value < 0 else -(-value // unit)


def _covers(have: int, want: int) -> bool:
    """Whether a limit ``have`` (-1: none) keeps at least as much as ``want``."""
    if have < 0:
        return True
    return want >= 0 and have >= want


@dataclass(frozen=True, slots=True)
class Retention:
    """A Pulsar retention policy: minutes and megabytes, -1 for no limit."""

    minutes: int
    megabytes: int

    @classmethod
    def from_kafka(cls, ms: int, size_bytes: int) -> Retention:
        """Kafka's ``retention.ms`` / ``retention.bytes`` rounded up to Pulsar's units
        (-1 stays unbounded; a positive value never rounds down to 0)."""
        return cls(_ceil(ms, _MINUTE_MS), _ceil(size_bytes, _MB))

    @classmethod
    def from_pulsar(cls, body: Any) -> Retention | None:
        """The admin API's answer (``{"retentionTimeInMinutes", "retentionSizeInMB"}``);
        None for an empty answer (no policy set at that level)."""
        if not isinstance(body, dict) or not body:
            return None
        return cls(
            int(body.get("retentionTimeInMinutes", 0)), int(body.get("retentionSizeInMB", 0))
        )

    def to_pulsar(self) -> dict[str, int]:
        return {"retentionTimeInMinutes": self.minutes, "retentionSizeInMB": self.megabytes}

    def keeps_at_least(self, other: Retention) -> bool:
        """Whether this policy deletes nothing that ``other`` would keep."""
        return _covers(self.minutes, other.minutes) and _covers(self.megabytes, other.megabytes)

    def describe(self) -> str:
        time = "no time limit" if self.minutes < 0 else f"{self.minutes} min"
        size = "no size limit" if self.megabytes < 0 else f"{self.megabytes} MB"
        return f"{time}, {size}"

    def cli_args(self) -> str:
        """``pulsar-admin ... set-retention`` arguments for this policy."""
        time = "-1" if self.minutes < 0 else f"{self.minutes}m"
        size = "-1" if self.megabytes < 0 else f"{self.megabytes}M"
        return f"--time {time} --size {size}"


INFINITE = Retention(_UNBOUNDED, _UNBOUNDED)
"""What a compacted topic keeps: everything (its readers read the whole log)."""


class Verdict(enum.Enum):
    SET = "set"
    """No policy at the namespace level: set Kafka's."""
    KEEP = "keep"
    """A policy that keeps at least Kafka's: left as it is."""
    SHORT = "short"
    """A policy an operator set that deletes unconsumed records sooner than Kafka would:
    reported (or a refused start); never overwritten."""


@dataclass(frozen=True, slots=True)
class NamespacePlan:
    verdict: Verdict
    current: Retention | None
    wanted: Retention
    message: str


def namespace_plan(
    namespace: str, current: Retention | None, wanted: Retention, admin_url: str = ""
) -> NamespacePlan:
    """What a start does with the data namespace's retention ``current`` (None: unset),
    Kafka's being ``wanted``; the message says it for the log."""
    if current is None:
        return NamespacePlan(
            Verdict.SET,
            None,
            wanted,
            f"namespace {namespace} had no retention policy (the broker's default applied, "
            f"0 in Pulsar's own configuration); set {wanted.describe()} "
            "(KOP_DEDUP_KAFKA_LOG_RETENTION_MS / _BYTES, Kafka's log.retention.*)",
        )
    if current.keeps_at_least(wanted):
        return NamespacePlan(
            Verdict.KEEP,
            current,
            wanted,
            f"namespace {namespace} keeps records {current.describe()}: at least Kafka's "
            f"{wanted.describe()}",
        )
    rest = "" if not admin_url else f"{admin_url.rstrip('/')}"
    return NamespacePlan(
        Verdict.SHORT,
        current,
        wanted,
        f"namespace {namespace} keeps records no subscription holds for "
        f"{current.describe()}: Kafka consumers read through readers, which hold nothing, "
        "so their records are deleted at a ledger roll-over (a broker restart, a bundle "
        f"move) sooner than Kafka's {wanted.describe()} would keep them; fix it with: "
        f"pulsar-admin namespaces set-retention {namespace} {wanted.cli_args()}  (or "
        f"POST {rest}/admin/v2/namespaces/{namespace}/retention with "
        f'{{"retentionTimeInMinutes": {wanted.minutes}, "retentionSizeInMB": '
        f"{wanted.megabytes}}}); topics with their own retention.ms or "
        "cleanup.policy=compact keep theirs",
    )
