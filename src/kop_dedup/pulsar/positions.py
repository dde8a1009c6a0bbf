"""Kafka-style integer offsets on Pulsar, from the broker's entry index.

With ``brokerEntryMetadataInterceptors=...AppendIndexMetadataInterceptor`` the broker
stamps every entry with the index of its last message: per topic, messages are
counted from 0 with no gaps, batched entries included. So a message's **offset** is
``entry index - (messages in the entry - 1) + batch index``, the **end offset** (the
next offset to be written) is the last entry's index + 1, and the records between two
offsets are exactly their difference: what ``ready``/``inflight``/``lag`` count.

A position here is a :data:`~kop_dedup.pulsar.message_ids.MessagePosition`
``(ledger, entry, batch index)``: where a reader starts (inclusive); batch index -1 is a
message sent without batching. ``(L, E, n)`` with ``n`` the entry's message count means
"after entry E": a reader started there begins with the next entry. Positions travel
as ``"L:E:B"`` (``message_ids.encode_message_position``).

The Python client exposes neither the index on a message nor a way to find the
position of an offset (Pulsar's PIP-415 is newer than 4.0), so this module asks the
admin API: one lookup for the offset of a position, a binary search over the topic's
entries (about log2(entries) lookups) for the position of an offset.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

from kop_dedup import errors
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.message_ids import MessagePosition

__all__ = ["NOT_INDEXED", "Positions"]

_INDEXES_KEPT = 10_000

NOT_INDEXED = (
    "the broker does not index entries, so there are no Kafka offsets: set "
    "brokerEntryMetadataInterceptors=org.apache.pulsar.common.intercept."
    "AppendIndexMetadataInterceptor in broker.conf (the local launcher does); entries "
    "written before that have no offset"
)


class Positions:
    """Offsets and positions of one broker's partition topics (full ``persistent://``
    names), through the admin API."""

    def __init__(self, admin: PulsarAdmin) -> None:
        self._admin = admin
        self.log_start: Callable[[str], Awaitable[int]] | None = None
        """A partition's log start offset (Kafka's DeleteRecords; the runtime sets it):
        the earliest offset is never below it, though the broker may keep the records
        until retention deletes them."""
        self._indexes: OrderedDict[tuple[str, int, int], tuple[int, int]] = OrderedDict()
        """Entry indexes asked for lately: an entry's index never changes (ledger ids are
        never reused), so the lag of an idle partition costs one admin call, not two."""

    async def _index(self, topic: str, ledger: int, entry: int) -> tuple[int, int]:
        k = (topic, ledger, entry)
        if (known := self._indexes.get(k)) is not None:
            self._indexes.move_to_end(k)
            return known
        found = await self._admin.entry_index(topic, ledger, entry)
        if found is None:
            raise errors.KafkaStorageError(f"{topic}: {NOT_INDEXED}")
        self._indexes[k] = found
        if len(self._indexes) > _INDEXES_KEPT:
            self._indexes.popitem(last=False)
        return found

    def learn(self, topic: str, ledger: int, entry: int, index: int, count: int) -> None:
        """What a reader counted of an entry it read whole (the index of its last message,
        its messages): kept as the broker's answer would be, so looking up an offset
        in what was read lately (a Kafka group's commit, to move its subscription) asks
        the broker nothing for it."""
        k = (topic, ledger, entry)
        self._indexes[k] = (index, count)
        self._indexes.move_to_end(k)
        if len(self._indexes) > _INDEXES_KEPT:
            self._indexes.popitem(last=False)

    async def entry(self, topic: str, ledger: int, entry: int) -> tuple[int, int]:
        """(index of its last message, its messages) of a stored entry: asked of the
        broker once (an entry's index never changes), or learnt from a reader."""
        return await self._index(topic, ledger, entry)

    async def offset_of(self, topic: str, position: MessagePosition) -> int:
        """The offset of the message at a position (one lookup)."""
        index, count = await self._index(topic, position[0], position[1])
        return index - count + 1 + max(position[2], 0)

    async def end(self, topic: str) -> tuple[int, MessagePosition | None]:
        """(end offset, the position after the last message); (0, None) when the topic has
        never held a message."""
        last = await self._admin.last_position(topic)
        if last is None or last[1] < 0:
            first = await self._admin.first_entry(topic)
            if first is None:
                return 0, None
            last = first[0], first[1]
        index, count = await self._index(topic, last[0], last[1])
        return index + 1, (last[0], last[1], count)

    async def after(
        self, topic: str, entry: tuple[int, int] | None
    ) -> tuple[int, MessagePosition | None]:
        """(offset, position) of what comes after a stored entry ``(ledger, entry)``: where
        a reader starts to read what was written after it (the end when nothing was
        yet). ``(ledger, -1)`` (a ledger still empty) is after every entry of earlier
        ledgers; None, or an entry deleted since, is before the earliest still stored."""
        if entry is not None and entry[1] >= 0:
            try:
                index, count = await self._index(topic, entry[0], entry[1])
            except AdminError as exc:
                if exc.status != 404:
                    raise
            else:
                return index + 1, (entry[0], entry[1], count)
        elif entry is not None:
            earlier = [(lg, n) for lg, n in await self._admin.ledgers(topic) if lg < entry[0]]
            filled = [(lg, n) for lg, n in earlier if n > 0]
            if filled:
                return await self.after(topic, (filled[-1][0], filled[-1][1] - 1))
        return await self.earliest(topic)

    async def floor(self, topic: str) -> int:
        """The log start offset set on a partition topic (0: none)."""
        return 0 if self.log_start is None else await self.log_start(topic)

    async def earliest(self, topic: str) -> tuple[int, MessagePosition | None]:
        """(the first offset still stored at or after the log start offset, its
        position); the end when there is none."""
        first, at = await self._first(topic)
        floor = await self.floor(topic)
        if floor <= first:
            return first, at
        end, end_at = await self.end(topic)
        if floor >= end or end_at is None:
            return end, end_at
        return floor, await self._search(topic, floor) or end_at

    async def _first(self, topic: str) -> tuple[int, MessagePosition | None]:
        """(the first offset still stored, its position); the end when nothing is."""
        first = await self._admin.first_entry(topic)
        if first is None:
            end = await self.end(topic)
            if end[1] is None:
                return end
            # a message may have come between the two questions: the end would skip it
            first = await self._admin.first_entry(topic)
            if first is None:  # everything stored was deleted (retention): the end it is
                return end
        ledger, entry, indexed = first
        if indexed is None:
            raise errors.KafkaStorageError(f"{topic}: {NOT_INDEXED}")
        index, count = indexed
        return index - count + 1, (ledger, entry, 0)

    async def at_time(
        self, topic: str, timestamp_ms: int
    ) -> tuple[int, MessagePosition | None, str | None]:
        """The first message published at or after a time, and whether that was clamped:
        ``"earliest"`` (the time is before the earliest message still stored: the
        earliest), ``"end"`` (nothing was published that late: the end), else None.
        Entries are timed by their publish time (a batch: when it was sent)."""
        ledger, entry = await self._admin.position_at(topic, max(timestamp_ms, 0))
        last = await self._admin.last_position(topic)
        if last is None or (ledger, entry) > last:  # one past the last entry: nothing that late
            end, at = await self.end(topic)
            return end, at, "end"
        try:
            index, count = await self._index(topic, ledger, entry)
        except AdminError as exc:
            if exc.status in {404, 412}:  # past the last entry by the time we asked
                end, at = await self.end(topic)
                return end, at, "end"
            raise
        offset = index - count + 1
        if offset < await self.floor(topic):  # before the log start: the earliest
            first_offset, first_at = await self.earliest(topic)
            return first_offset, first_at, "earliest"
        clamped = None
        first = await self._admin.first_entry(topic)
        if first is not None and (first[0], first[1]) == (ledger, entry):
            published = await self._admin.entry_publish_ms(topic, ledger, entry)
            if published is not None and timestamp_ms < published:
                clamped = "earliest"
        return offset, (ledger, entry, 0), clamped

    async def locate(self, topic: str, offset: int) -> MessagePosition:
        """The position of an offset; OFFSET_OUT_OF_RANGE outside [earliest, end]."""
        first, first_at = await self.earliest(topic)
        end, end_at = await self.end(topic)
        if not first <= offset <= end:
            raise errors.OffsetOutOfRange(
                f"{topic}: offset {offset} is outside {first}..{end} (earliest still "
                "stored .. next to be written)"
            )
        if offset == end or end_at is None:
            return end_at or (0, 0, 0)
        if offset == first and first_at is not None:
            return first_at
        return await self._search(topic, offset) or end_at

    async def _search(self, topic: str, offset: int) -> MessagePosition | None:
        """Binary search over the stored entries for the one holding ``offset``."""
        entries = [(ledger, n) for ledger, n in await self._admin.ledgers(topic) if n > 0]
        total = sum(n for _, n in entries)

        def nth(k: int) -> tuple[int, int]:
            for ledger, n in entries:
                if k < n:
                    return ledger, k
                k -= n
            raise IndexError(k)

        lo, hi = 0, total - 1  # the first entry whose last index >= offset
        found: tuple[int, int, int, int] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            ledger, entry = nth(mid)
            try:
                index, count = await self._index(topic, ledger, entry)
            except AdminError as exc:
                if exc.status == 404:  # deleted by retention meanwhile: look later
                    lo = mid + 1
                    continue
                raise
            if index >= offset:
                found, hi = (ledger, entry, index, count), mid - 1
            else:
                lo = mid + 1
        if found is None:
            return None
        ledger, entry, index, count = found
        return ledger, entry, offset - (index - count + 1)
