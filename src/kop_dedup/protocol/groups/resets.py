"""Server-side resets of one partition of a group (RocketMQ's RIP-48), as pure data.

A reset is stored with an epoch higher than any before on the partition, and applied
by each member it targets at its next pull: the member's delivery then carries the
epoch (:attr:`~kop_dedup.protocol.groups.metadata.Delivery.reset_epoch`), so it is
applied once. A reset targets every member (``members`` None: also members that come
later or come back) or, in a broadcast group, the members it names.

A partition keeps every reset that still targets someone (:class:`Resets`, the
``["r", group, topic, partition]`` doc): a later reset for some members does not drop
an earlier one for the others. What applies to a member is the latest reset that
targets it (:meth:`Resets.for_member`); one is dropped once later ones target all of
its members.

>>> rs = Resets().added(Reset(1, 2, None, "offset", 2, None, 0))
>>> rs = rs.added(Reset(2, 6, None, "offset", 6, ("a",), 0))
>>> rs.for_member("a").epoch, rs.for_member("b").epoch
(2, 1)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Reset", "Resets"]

Doc = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reset:
    epoch: int
    offset: int
    position: str | None
    to: str
    """earliest, latest, timestamp or offset"""
    value: int | None
    members: tuple[str, ...] | None
    """None: every member."""
    at_ms: int

    def targets(self, member: str) -> bool:
        return self.members is None or member in self.members

    @classmethod
    def from_doc(cls, doc: Doc) -> Reset:
        members = doc.get("members")
        return cls(
            int(doc["epoch"]),
            int(doc["offset"]),
            doc.get("position"),
            str(doc["to"]),
            None if doc.get("value") is None else int(doc["value"]),
            None if members is None else tuple(members),
            int(doc.get("atMs", 0)),
        )

    def to_doc(self) -> Doc:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "position": self.position,
            "to": self.to,
            "value": self.value,
            "members": None if self.members is None else list(self.members),
            "atMs": self.at_ms,
        }


@dataclass(frozen=True, slots=True)
class Resets:
    """The resets of one partition that still target someone, oldest first."""

    entries: tuple[Reset, ...] = ()
    version: int = 0

    def for_member(self, member: str) -> Reset | None:
        """The latest reset that targets ``member`` (pending unless it applied it)."""
        for reset in reversed(self.entries):
            if reset.targets(member):
                return reset
        return None

    def latest_epoch(self) -> int:
        return max((r.epoch for r in self.entries), default=0)

    def next_epoch(self, applied: Iterable[int] = ()) -> int:
        """Above every reset kept and every epoch a delivery applied (a reset dropped
        since must not look applied already)."""
        return max(self.latest_epoch(), *applied, 0) + 1

    def added(self, reset: Reset) -> Resets:
        """With ``reset`` as the latest; earlier ones it supersedes for all their members
        are dropped."""
        return replace(self, entries=_pruned((*self.entries, reset)))

    def superseded_for(self, reset: Reset, member: str) -> bool:
        """Whether a later reset than ``reset`` targets ``member``."""
        return any(r.epoch > reset.epoch and r.targets(member) for r in self.entries)

    def without(self, gone: Iterable[str]) -> Resets:
        """Resets no longer naming members that are forgotten (those left naming nobody
        are dropped)."""
        gone = set(gone)
        entries = []
        for reset in self.entries:
            kept = reset
            if reset.members is not None:
                kept = replace(reset, members=tuple(m for m in reset.members if m not in gone))
                if not kept.members:
                    continue
            entries.append(kept)
        return replace(self, entries=tuple(entries))

    @classmethod
    def from_doc(cls, doc: Doc | None) -> Resets:
        if doc is None:
            return cls()
        if "resets" in doc:
            entries = tuple(Reset.from_doc(r) for r in doc["resets"])
        else:  # stored before a partition kept several: the doc is the one reset
            entries = (Reset.from_doc(doc),)
        return cls(entries, int(doc.get("v", 0)))

    def to_doc(self) -> Doc:
        return {"resets": [r.to_doc() for r in self.entries]}


def _pruned(entries: tuple[Reset, ...]) -> tuple[Reset, ...]:
    kept: list[Reset] = []
    covered: set[str] = set()
    everyone = False
    for r in reversed(entries):  # newest first
        if everyone:
            continue
        if r.members is None:
            kept.append(r)
            everyone = True
        elif not set(r.members) <= covered:
            kept.append(r)
            covered |= set(r.members)
    return tuple(reversed(kept))
