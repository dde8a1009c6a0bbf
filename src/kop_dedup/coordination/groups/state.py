"""One group's stored state, typed, as a sidecar has read it (what lag, cursors and
retention ask the coordinator for): built from the group store's docs, no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kop_dedup.protocol.groups import (
    Committed,
    Delivery,
    Group,
    Mode,
    Resets,
    TopicPartition,
)

__all__ = ["GroupState"]


@dataclass(frozen=True, slots=True)
class GroupState:
    group_id: str
    group: Group | None = None
    offsets: dict[TopicPartition, Committed] = field(default_factory=dict)
    """The group's committed offsets (``o``)."""
    member_offsets: dict[tuple[str, TopicPartition], Committed] = field(default_factory=dict)
    """Broadcast members' own (``b``)."""
    deliveries: dict[tuple[str, TopicPartition], Delivery] = field(default_factory=dict)
    resets: dict[TopicPartition, Resets] = field(default_factory=dict)
    pending: frozenset[TopicPartition] = frozenset()
    """Partitions with offsets pending in a transaction (``p``)."""
    stored: int = 0
    """Keys stored for the group."""

    @classmethod
    def from_docs(
        cls, group_id: str, docs: Iterable[tuple[list[Any], dict[str, Any]]]
    ) -> GroupState:
        group = None
        offsets, member_offsets, deliveries, resets = {}, {}, {}, {}
        pending = set()
        stored = 0
        for k, doc in docs:
            stored += 1
            kind = k[0]
            if kind == "g":
                group = Group.from_doc(doc)
            elif kind == "o":
                offsets[str(k[2]), int(k[3])] = Committed.from_doc(doc)
            elif kind == "b":
                member_offsets[str(k[2]), (str(k[3]), int(k[4]))] = Committed.from_doc(doc)
            elif kind == "d":
                deliveries[str(k[2]), (str(k[3]), int(k[4]))] = Delivery.from_doc(doc)
            elif kind == "r":
                resets[str(k[2]), int(k[3])] = Resets.from_doc(doc)
            elif kind == "p":
                pending.add((str(k[2]), int(k[3])))
        return cls(
            group_id,
            group,
            {tp: c for tp, c in offsets.items() if c is not None},
            {mk: c for mk, c in member_offsets.items() if c is not None},
            deliveries,
            resets,
            frozenset(pending),
            stored,
        )

    @property
    def mode(self) -> Mode:
        return Mode.CLUSTERING if self.group is None else self.group.mode

    def committed(self, member: str, tp: TopicPartition) -> Committed | None:
        """The offset ``member`` stands at when it has no delivery (clustering: the
        group's)."""
        if self.mode is Mode.CLUSTERING:
            return self.offsets.get(tp)
        return self.member_offsets.get((member, tp))

    def delivery(self, owner: str, tp: TopicPartition) -> Delivery:
        return self.deliveries.get((owner, tp)) or Delivery()

    def broadcast_others(self, member: str, tp: TopicPartition) -> list[tuple[int, int]]:
        """(committed offset, last seen) of the other broadcast members, those gone
        included. Last seen: its last commit, or its last call when later (a member's
        stored last call lags by up to a quarter of its session; a commit is exact)."""
        members = {} if self.group is None else self.group.members
        return [
            (c.offset, max(members[m].last_seen_ms if m in members else 0, c.seen_ms or 0))
            for (m, at), c in self.member_offsets.items()
            if at == tp and m != member
        ]

    def partitions(self) -> list[TopicPartition]:
        """The partitions of its members' topics, and any with a committed offset (the
        offsets API and transactions commit without joining)."""
        counts = {} if self.group is None else self.group.partitions
        return sorted({(t, p) for t, n in counts.items() for p in range(n)} | set(self.offsets))

    def last_seen(self) -> dict[str, int]:
        """Broadcast members with records: when each was last seen (commit or pull)."""
        seen: dict[str, int] = {}
        for (m, _), c in self.member_offsets.items():
            seen[m] = max(seen.get(m, 0), c.seen_ms or 0, c.commit_ms or 0)
        for (m, _), d in self.deliveries.items():
            if m:
                seen[m] = max(seen.get(m, 0), d.at_ms or 0)
        return seen

    def activity(self) -> list[int | None]:
        """When each record was last written, as far as it says (retention)."""
        times: list[int | None] = []
        times += [c.commit_ms for c in self.offsets.values()]
        times += [c.seen_ms or c.commit_ms for c in self.member_offsets.values()]
        times += [d.at_ms for d in self.deliveries.values()]
        times += [r.at_ms for rs in self.resets.values() for r in rs.entries]
        return times
