"""Consumer groups as pure, typed data (Kafka's ``GroupMetadata``, RocketMQ's RIP-48
rules), without I/O or a clock: unit-tested on their own.

* :mod:`.metadata`: a group's configuration and membership (:class:`Group`), its
  deliveries (:class:`Delivery`) and committed offsets (:class:`Committed`), and the
  membership transitions (join, leave, session expiry: a new generation and
  assignment, and the deliveries that go back to their committed offsets).
* :mod:`.deliveries`: where a member starts reading a partition, what a pull records,
  what a commit takes, inflight ages and the counts of the lag view.
* :mod:`.resets`: server-side resets of a partition and their epochs.
* :mod:`.retention`: which state is forgotten, and when.
* :mod:`.classic`: a Kafka classic group (JoinGroup and the rest, client-side
  assignment) and its transitions, Kafka's ``ClassicGroup``.

Modes: in **clustering** a group's partitions are spread over its live members (one
reader per partition); in **broadcast** every member reads every partition and commits
under its own identity. A member that misses its session (no heartbeat or pull for
``session_timeout_ms``) leaves; each change of membership bumps the generation and
reassigns.

>>> assign(Mode.CLUSTERING, {"a": ("t",), "b": ("t",)}, {"t": 3})
{'a': (('t', 0), ('t', 2)), 'b': (('t', 1),)}
"""

from __future__ import annotations

from kop_dedup.protocol.groups.deliveries import (
    Counts,
    LagRow,
    PlannedStart,
    Start,
    broadcast_minimum,
    commit_offsets,
    committed_at_reset,
    counts,
    delivery_after_commit,
    delivery_after_pull,
    inflight_after_commit,
    inflight_after_pull,
    oldest_inflight_ms,
    plan_start,
    same_standing,
    start_offset,
    started_at,
)
from kop_dedup.protocol.groups.metadata import (
    AutoReset,
    Committed,
    Delivery,
    Group,
    GroupConfig,
    InflightEntry,
    Member,
    Mode,
    StaleMember,
    TopicPartition,
    assign,
    expired,
)
from kop_dedup.protocol.groups.resets import Reset, Resets
from kop_dedup.protocol.groups.retention import departed_broadcast_members, group_expired

__all__ = [
    "AutoReset",
    "Committed",
    "Counts",
    "Delivery",
    "Group",
    "GroupConfig",
    "InflightEntry",
    "LagRow",
    "Member",
    "Mode",
    "PlannedStart",
    "Reset",
    "Resets",
    "StaleMember",
    "Start",
    "TopicPartition",
    "assign",
    "broadcast_minimum",
    "commit_offsets",
    "committed_at_reset",
    "counts",
    "delivery_after_commit",
    "delivery_after_pull",
    "departed_broadcast_members",
    "expired",
    "group_expired",
    "inflight_after_commit",
    "inflight_after_pull",
    "oldest_inflight_ms",
    "plan_start",
    "same_standing",
    "start_offset",
    "started_at",
]
