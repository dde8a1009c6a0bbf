"""Which consumer-group state is forgotten, and when (bounded state), as pure rules.

* A group with no members, no transaction offsets pending and nothing done for
  ``retention_ms`` (no commit, no change of membership or configuration, no reset,
  no pull recorded) is forgotten whole: offsets, resets, deliveries. Kafka's
  ``offsets.retention.minutes`` (7 days) counts from when a group became empty, or
  from the last commit of a group that never had members; so does this.
* A broadcast member that left (or missed its session) keeps its records while it
  counts for the group minimum, ``broadcast_expire_ms`` after it was last seen; then
  they go (a member that comes back later starts as a new one).

>>> group_expired(None, [1_000], pending=False, now_ms=5_000, retention_ms=4_000)
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kop_dedup.protocol.groups.metadata import Group, Mode

__all__ = ["departed_broadcast_members", "group_expired"]


def group_expired(
    group: Group | None,
    activity_ms: Iterable[int | None],
    *,
    pending: bool,
    now_ms: int,
    retention_ms: int,
) -> bool:
    """Whether a group is forgotten now. ``activity_ms``: when each of its records was
    last written (None: not known); a group none of whose times is known is kept (its
    owner starts the clock)."""
    if pending or (group is not None and group.members):
        return False
    times = [t for t in activity_ms if t is not None]
    if group is not None and group.changed_ms is not None:
        times.append(group.changed_ms)
    return bool(times) and now_ms - max(times) >= retention_ms


def departed_broadcast_members(
    group: Group, last_seen_ms: Mapping[str, int], now_ms: int
) -> list[str]:
    """The broadcast members whose records go: not in the group, and last seen (their
    last commit or pull, ``last_seen_ms``) more than ``broadcast_expire_ms`` ago."""
    if group.mode is not Mode.BROADCAST:
        return []
    expire = group.config.broadcast_expire_ms
    return sorted(
        m for m, seen in last_seen_ms.items() if m not in group.members and now_ms - seen > expire
    )
