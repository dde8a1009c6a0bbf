"""Where an :class:`~kop_dedup.pulsar.fetching.EntryReader` stands in its partition's
offsets: the entries it takes from Pulsar, counted.

Offsets are counted, not looked up: the broker's entry index has no gaps, so the
message after one of known offset has the next. The count is checked against the
broker where it could be wrong: the first message a reader gets, and the first of every
ledger (entries deleted by retention under a reader are skipped by the broker). A
message found later than counted (or, after the first, earlier: the topic was deleted
and created again) sets :attr:`Count.skipped_from`: the records asked for are gone,
Kafka's OFFSET_OUT_OF_RANGE.

Counting also feeds what was read to the reader's
:class:`~kop_dedup.protocol.stable.StableTracker` (once per record, also after a spill
read a part again) and teaches the positions the size of every entry read whole.

>>> count = Count(positions, ptopic, offset=40, position=(12, 3, 0), stable=tracker)
>>> entries = await count.counted(raw)   # StoredEntry values from the RawEntry ones
"""

from __future__ import annotations

import time

from kop_dedup.protocol.stable import CopyMark, EntryId, StableTracker
from kop_dedup.pulsar.message_ids import MessagePosition
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.reading import after
from kop_dedup.pulsar.stored import RawEntry, StoredEntry

__all__ = ["Count"]


def _same_place(a: MessagePosition, b: MessagePosition) -> bool:
    """Whether two positions name one message (batch index -1: a message sent without
    batching, the same as index 0)."""
    return a[:2] == b[:2] and max(a[2], 0) == max(b[2], 0)


class Count:
    """The offsets of one reader of ``topic``, from ``offset`` at ``position`` (None:
    not known, the first message is looked up)."""

    def __init__(
        self,
        positions: Positions,
        topic: str,
        offset: int,
        position: MessagePosition | None,
        stable: StableTracker,
    ) -> None:
        self._positions, self._topic, self._stable = positions, topic, stable
        self.expected: MessagePosition | None = position
        """Where the next message from Pulsar should be (None: not known, look it up)."""
        self.read_offset = offset
        """The offset of the next message from Pulsar."""
        self.last: MessagePosition | None = None
        """The position of the last message counted."""
        self.whole: tuple[int, int, int] | None = None
        """(ledger, entry, offset of its first message) of the last entry read from its
        first message: once the next entry comes, its size is known and the positions
        learn it (a later lookup of an offset in it asks the broker nothing)."""
        self.floor = offset
        """Records below the offset asked for are not handed out."""
        self.fed_to = 0
        """Records below this offset were fed to the tracker (a part read again after a
        spill is not fed twice)."""
        self.skipped_from: int | None = None
        """Set when a message came later than counted (records deleted by retention):
        the offset the reader was at."""

    def restart(self, offset: int, position: MessagePosition) -> None:
        """Count again from ``offset`` at ``position`` (a reader reading a spilled part
        again: what was fed to the tracker is not fed again)."""
        self.read_offset, self.expected, self.last, self.whole = offset, position, None, None

    def continues(self, position: MessagePosition) -> bool:
        """Whether the message at ``position`` is the one counted next, without asking:
        where the reader was told to start or stopped, or the next entry of the same
        ledger (entries are dense within a ledger)."""
        expected, last = self.expected, self.last
        if expected is not None and _same_place(position, expected):
            return True
        return (
            last is not None
            and position[0] == last[0]
            and position[1] == last[1] + 1
            and position[2] <= 0
        )

    async def counted(self, raw: list[RawEntry]) -> list[StoredEntry]:
        """The entries read, with their offsets (checked against the broker where the
        count could be wrong: a reader's first message, a new ledger)."""
        out: list[StoredEntry] = []
        for entry in raw:  # what the client sent again was dropped (read_available)
            offset = self.read_offset
            if not self.continues(entry.position):
                found = await self._positions.offset_of(self._topic, entry.position)
                # later than counted: records deleted under the reader; earlier, after the
                # first message: not the topic it counted (deleted and created again)
                if found > offset or (found < offset and self.last is not None):
                    self.skipped_from = offset
                    return out
                offset = found
            self._learn(entry, offset)
            records = tuple(entry.records)
            self._feed(offset, len(records), entry.mark, (entry.ledger, entry.entry))
            self.last, self.expected = entry.last, after(entry.last)
            self.read_offset = offset + len(records)
            skip = self.floor - offset  # a reader that started before the offset asked
            if skip >= len(records):
                continue
            stored = StoredEntry(
                offset,
                entry.position,
                entry.producer_id,
                entry.epoch,
                entry.sequence,
                records,
                entry.publish_time_ms,
                entry.size,
            )
            out.append(stored.starting_at(skip))
        return out

    def _feed(self, offset: int, count: int, mark: CopyMark | None, entry: EntryId) -> None:
        """Feed the tracker the records of a piece it was not fed yet (after a spill, the
        part read again was: a piece across that point gives only its rest, as the rest
        of a batch whose first record was fed)."""
        start = max(offset, self.fed_to)
        if start >= offset + count:
            return
        if start > offset and mark is not None:
            mark = CopyMark(mark.producer_id, mark.ordinal)
        self._stable.feed(start, offset + count - start, mark, entry, time.monotonic())
        self.fed_to = offset + count

    def _learn(self, entry: RawEntry, offset: int) -> None:
        """An entry read whole ends where the next one begins (offsets are dense): the
        positions keep its index, as the broker would answer it."""
        whole = self.whole
        if whole is not None and whole[:2] == (entry.ledger, entry.entry):
            return  # the rest of an entry a read ended inside
        if whole is not None and offset > whole[2]:
            self._positions.learn(self._topic, whole[0], whole[1], offset - 1, offset - whole[2])
        self.whole = (entry.ledger, entry.entry, offset) if entry.position[2] <= 0 else None
