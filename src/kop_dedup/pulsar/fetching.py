"""Reading a partition as the Kafka batches it stores: one Pulsar entry, one batch.

One Kafka batch is one Pulsar batch entry (``producers.py``), and the broker's entry
index numbers every message (``positions.py``), so an :class:`EntryReader` started at a
known (offset, position) hands out :class:`StoredEntry` values: the records of one
entry, in order, with the offset of the first, the producer id, epoch and sequence
they were written with and the entry's publish time. A read may end inside an entry
(the rest comes first in the next read, as a batch of its own, at the right offsets).

Offsets are counted, not looked up (:mod:`.counting`: the index has no gaps, so the
message after one of known offset has the next; checked against the broker where the
count could be wrong). A message found later than counted sets
:attr:`EntryReader.skipped_from`: the records asked for are gone, Kafka's
OFFSET_OUT_OF_RANGE.

Every piece a reader takes from Pulsar is fed to its
:class:`~kop_dedup.protocol.stable.StableTracker`, which knows the last stable offset of
what was read; a read with ``committed`` (read_committed) hands out only what lies below
it, reading on while a copy holds it and keeping what lies beyond for a later read. What
it keeps is bounded (``_AHEAD_BYTES``), the size of a transaction is not: past the bound
the reader *spills*: it reads on without keeping (each piece still fed to the tracker,
so a copy of any size closes, by its count or by the log's word and the end), remembers
where it stopped keeping, and once what it kept is handed out reads that part again
from the log (fed to the tracker only past what was fed already). Kafka's LSO moves at
the commit marker whatever the transaction's size; here it moves once the copy is read
through, at the cost of reading a large copy twice.

Reads take what is available now, on a worker thread, in one loop hop (the blocking
calls of the client, as :mod:`.reading` does). Waiting for more is push, not poll:
:meth:`EntryReader.arrival` asks the client for the next message asynchronously and
keeps it when it comes, even after the caller stopped waiting (a cancelled receive
would lose it), so long polls cost nothing while they wait.

>>> reader = EntryReader(client, positions, ptopic, offset=40, position=(12, 3, 0))
>>> entries = await reader.read(max_bytes=1 << 20)   # [] when nothing is there yet
>>> reader.unread(entries[2:])                       # hand back what did not fit
>>> await reader.arrival()                           # None: something to read now
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import pulsar

from kop_dedup.protocol.stable import StableTracker
from kop_dedup.pulsar.counting import Count
from kop_dedup.pulsar.message_ids import MessagePosition
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.stored import (
    ENTRY_OVERHEAD,
    RECORD_OVERHEAD,
    StoredEntry,
    arriving,
    position_of,
    read_available,
)
from kop_dedup.pulsar.tables import Discards, PulsarClient, discard

__all__ = ["ENTRY_OVERHEAD", "RECORD_OVERHEAD", "EntryReader", "StoredEntry"]

_AHEAD_BYTES = 8 << 20
"""What a read_committed read keeps back at most while a copy holds the last stable
offset (per reader: a partition held by a copy in progress costs no more). Past it the
reader spills (see the module docstring): a copy larger than this is read through
without being kept, then read again."""
_AHEAD_CHUNK = 1 << 20


class EntryReader:
    """A reader of one partition topic from ``offset`` at ``position`` (None: from the
    earliest message, for a topic that held none when it was opened)."""

    def __init__(
        self,
        client: PulsarClient,
        positions: Positions,
        topic: str,
        offset: int,
        position: MessagePosition | None,
    ) -> None:
        self.topic = topic
        self._client, self._positions = client, positions
        self._start = position
        self.stable = StableTracker(offset)
        """The last stable offset of what this reader has read (every piece it takes
        from Pulsar is fed to it once, whatever the caller's isolation)."""
        self._count = Count(positions, topic, offset, position, self.stable)
        """Where the reader stands in the offsets (after ``_unread`` and ``_held``)."""
        self._unread: collections.deque[StoredEntry] = collections.deque()
        self._held: Any = None
        """A message taken from Pulsar and not counted yet (the next entry's first)."""
        self._reader: Any = None
        self._thread: asyncio.Future[Any] | None = None
        """The read running on a worker thread on :attr:`_reader` (:meth:`_take`)."""
        self._given_up = Discards()
        self._arriving: asyncio.Future[Any] | None = None
        self._reading = False
        self._closed = False
        self.drained = False
        """The last read found nothing more in the topic: its end is :attr:`read_offset`."""
        self._drained_at = 0.0
        """When the broker last said it had nothing more for this reader."""
        self.unasked = False
        """The last read took all the client held without asking the broker whether it
        has more (``read(ask=False)``): :meth:`probe` asks."""
        self._coming = False
        """The broker said it has more than the client handed out (:meth:`probe`): on
        its way, so :meth:`arrival` waits for it."""
        self.last_used = time.monotonic()
        self._spill: tuple[int, MessagePosition] | None = None
        """(offset, position) of the first record read and not kept (the read-ahead was
        full): read again from there once what was kept is handed out."""
        self._front = offset
        """The offset after everything taken from Pulsar before the last spill's
        rewind."""

    @property
    def skipped_from(self) -> int | None:
        """Set when a message came later than counted (records deleted by retention):
        the offset the reader was at."""
        return self._count.skipped_from

    @property
    def next_offset(self) -> int:
        """The offset of the next record :meth:`read` returns."""
        if self._unread:
            return self._unread[0].base_offset
        if self._spill is not None:  # read again from there
            return self._spill[0]
        return self._count.read_offset

    @property
    def next_position(self) -> MessagePosition | None:
        """Where the next record is, when known without a lookup."""
        if self._unread:
            return self._unread[0].position
        if self._spill is not None:
            return self._spill[1]
        if self._held is not None:
            return position_of(self._held)
        return self._count.expected

    @property
    def read_offset(self) -> int:
        """The offset after everything taken from Pulsar so far (read again after a
        spill or not)."""
        return max(self._count.read_offset + (1 if self._held is not None else 0), self._front)

    @property
    def spilled(self) -> bool:
        """Whether records were read and not kept (to be read again from the log)."""
        return self._spill is not None

    @property
    def closed(self) -> bool:
        return self._closed

    async def open(self) -> None:
        """Connect to the broker now (else the first read does): a fetch of many
        partitions opens its new readers at once, not one after another."""
        if not self._closed and not self._reading:
            await self._open()

    async def _open(self) -> Any:
        if self._reader is None:
            start = (
                pulsar.MessageId.earliest
                if self._start is None
                else pulsar.MessageId(-1, *self._start)
            )
            self._reader = await self._client.create_reader(
                self.topic, start, start_message_id_inclusive=True
            )
        return self._reader

    def unread(self, entries: list[StoredEntry]) -> None:
        """Hand back entries read but not answered: the next read returns them first."""
        self._unread.extendleft(reversed(entries))

    def _stable_unread(self) -> int:
        """How many of the entries handed back lie below the last stable offset."""
        lso, n = self.stable.lso, 0
        for entry in self._unread:
            if entry.next_offset > lso:
                break
            n += 1
        return n

    async def arrival(self, *, committed: bool = False) -> asyncio.Future[Any] | None:
        """None when something can be read now (or the reader is closed); else a future
        that completes when a message arrives (never cancel it: wait with
        ``asyncio.wait``). The message is kept for the next read. ``committed``: only
        what lies below the last stable offset counts as something to read."""
        unread = self._stable_unread() if committed else len(self._unread)
        if self._spill is not None and not self._unread:
            return None  # the part not kept is there to read again
        if self._closed or unread or self._held is not None or self.unasked:
            return None
        if not self.drained and not self._coming:
            return None
        if self._arriving is None:
            self._arriving = arriving((await self._open())._reader)
        return self._arriving

    def _take_arrival(self) -> bool:
        """Move an arrived message into ``_held``; False while one is still awaited."""
        future = self._arriving
        if future is None:
            return True
        if not future.done():
            return False
        self._arriving = None
        if future.cancelled() or future.exception() is not None:
            self.drained = False  # the next read asks again
            return True
        self._held = future.result()
        return True

    async def read(
        self,
        max_bytes: int,
        *,
        committed: bool = False,
        ask: bool = True,
        fresh_s: float = 0.0,
    ) -> list[StoredEntry]:
        """Entries available now from :attr:`next_offset`, about ``max_bytes`` of them
        (whole entries; at least one when any is there). [] when nothing is there yet,
        the reader is closed, or records were skipped (see :attr:`skipped_from`).

        ``committed`` (read_committed): only entries below the last stable offset; while
        a copy holds it, the reader reads on (up to ``_AHEAD_BYTES`` kept back, then
        spilling) to see the copy whole, and keeps what lies beyond for a later read.

        ``ask=False``: only what the client holds now, taken on the loop's thread (no
        worker hop, no broker round trip); a read that empties it sets :attr:`unasked`
        (:meth:`probe` asks the broker), unless it took nothing and the broker said it
        had nothing more less than ``fresh_s`` ago (the reader stays :attr:`drained`:
        what comes later is pushed, and :meth:`arrival` waits for it)."""
        if self._closed or self._reading or self.skipped_from is not None:
            return []
        self.last_used = time.monotonic()
        if committed:
            await self._read_ahead(max_bytes, ask, fresh_s)
            return self._pop(max_bytes, self._stable_unread())
        await self._rewind_spent()
        out = self._pop(max_bytes, len(self._unread))
        budget = max_bytes - sum(e.size for e in out)
        if (budget <= 0 and out) or self._spill is not None:
            return out  # what was not kept comes next, read again
        out.extend(await self._pull(max(budget, 1), ask, fresh_s))
        return out

    async def probe(self) -> None:
        """After a read that emptied the client's queue without asking
        (:attr:`unasked`): ask the broker whether it has more (GetLastMessageId, async:
        a fetch asks for all its partitions at once). Nothing more: :attr:`drained`, and
        a copy the log settled is let go; more: :meth:`arrival` waits for it."""
        if not self.unasked or self._closed or self._reading or self._held is not None:
            return
        if self._arriving is not None:
            return
        self.unasked = False
        self._reading = True
        try:
            token = self.stable.reading()
            more = await (await self._open()).has_message_available()
        finally:
            self._reading = False
            if self._closed:
                await self._discard()
        if self._closed:
            return
        self._coming = more
        if not more:
            self.drained, self._drained_at = True, time.monotonic()
            self.stable.drained(token)

    def _pop(self, max_bytes: int, available: int) -> list[StoredEntry]:
        """Up to ``max_bytes`` of the first ``available`` entries handed back (at least
        one when there is one)."""
        out: list[StoredEntry] = []
        budget = max_bytes
        while available and (budget > 0 or not out):
            entry = self._unread.popleft()
            out.append(entry)
            budget -= entry.size
            available -= 1
        return out

    def _ahead(self) -> int:
        return sum(e.size for e in self._unread)

    async def _read_ahead(self, max_bytes: int, ask: bool = True, fresh_s: float = 0.0) -> None:
        """Read into the entries handed back until ``max_bytes`` of them are stable, or,
        while a copy holds the last stable offset, until it is whole or nothing more
        is there now (at most ``_AHEAD_BYTES`` kept back: past it, what is read is fed
        to the tracker and not kept, and read again once what was kept is handed out)."""
        while not self._closed and self.skipped_from is None:
            await self._rewind_spent()
            stable_n = self._stable_unread()
            stable = sum(e.size for e in list(self._unread)[:stable_n])
            holding = self.stable.holding
            if stable >= max_bytes and not holding:
                return
            if self._spill is not None and (stable_n or not holding):
                return  # what was kept is stable now: hand it out, then read again
            full = holding and self._ahead() >= _AHEAD_BYTES
            if full and self._spill is None:
                self._spill = (self._count.read_offset, self._pulsar_next())
            got = await self._pull(_AHEAD_CHUNK if holding else max_bytes - stable, ask, fresh_s)
            if self._spill is None:
                self._unread.extend(got)
            if not got or self.drained:  # nothing more now
                return

    def _pulsar_next(self) -> MessagePosition:
        """Where the next record to take from Pulsar is (known after a first read)."""
        if self._held is not None:
            return position_of(self._held)
        expected = self._count.expected
        assert expected is not None, "a reader that has read knows where it stands"
        return expected

    async def _rewind_spent(self) -> None:
        """After a spill, once what was kept is handed out: read again from where the
        reader stopped keeping (what was fed to the tracker is not fed again)."""
        if self._spill is None or self._unread or self._reading:
            return
        offset, position = self._spill
        self._spill, self._front = None, self.read_offset
        self._arriving = None  # asked of the reader that goes; _retrieve sees its end
        await self._discard()
        self._start, self._held = position, None
        self._count.restart(offset, position)
        self.drained = False

    async def _pull(
        self, max_bytes: int, ask: bool = True, fresh_s: float = 0.0
    ) -> list[StoredEntry]:
        """What Pulsar has now from where the reader stands (about ``max_bytes``;
        ``ask``, ``fresh_s``: see :meth:`read`)."""
        if not self._take_arrival():  # still waiting for the next message: nothing more now
            if self.stable.settling:  # unless the broker has more, a settled copy is read
                token = self.stable.reading()
                if not await (await self._open()).has_message_available():
                    self.stable.drained(token)
            return []
        self._reading, self._coming, was = True, False, self._held
        try:
            reader = await self._open()
            token = self.stable.reading()
            raw, held, drained = await self._take(reader._reader, max(max_bytes, 1), ask)
        finally:
            self._reading = False
            if self._closed:
                self._give_up()
        if self._closed:
            return []
        if not ask and held is None:  # the client's queue ran out, the broker not asked
            if not raw and was is None and self._still_drained(fresh_s):
                return []
            self.unasked = True
        else:
            self.unasked = False
        self._held, self.drained = held, drained
        if drained:
            self._drained_at = time.monotonic()
        out = await self._count.counted(raw)
        if drained and self.skipped_from is None:
            self.stable.drained(token)
        return out

    async def _take(self, reader: Any, max_bytes: int, ask: bool) -> tuple[Any, Any, bool]:
        """:func:`read_available` from where the reader stands: on a worker thread when
        the broker may be asked (it blocks), else (only what the client holds) here.
        Cut short (cancelled, or failing after it took messages), it closes the reader:
        what it took is never counted, so nothing reads on after it. The thread's read is
        shielded: cut short, the thread reads on, and the reader is closed once it
        returns (:meth:`_give_up`), never under it (that races in the C++ client)."""
        try:
            if not ask:
                return read_available(reader, self._held, max_bytes, self._count.last, ask=False)
            self._thread = asyncio.get_running_loop().run_in_executor(
                None, read_available, reader, self._held, max_bytes, self._count.last
            )
            taken: tuple[Any, Any, bool] = await asyncio.shield(self._thread)
        except BaseException:
            self._closed = True  # the Pulsar reader goes as the read ends (see _pull)
            raise
        self._thread = None
        return taken

    def _still_drained(self, fresh_s: float) -> bool:
        """Whether a read that found the client's queue empty, without asking, may take
        the broker's last "nothing more" as still true: said less than ``fresh_s`` ago
        and nothing came since (what comes later is pushed: :meth:`arrival` sees it), and
        no copy the log settled waits for the broker's word."""
        return (
            self.drained
            and time.monotonic() - self._drained_at < fresh_s
            and not self.stable.settling
        )

    async def close(self) -> None:
        """Close now, or when the read running meanwhile returns."""
        self._closed = True
        if not self._reading:
            await self._discard()
        await self._given_up.wait()

    def _give_up(self) -> None:
        """Give the reader of a read cut short up at once (no await: the read may be
        cancelled); it is closed in the background once its thread's read returns."""
        reader, self._reader = self._reader, None
        thread, self._thread = self._thread, None
        if reader is not None:
            self._given_up.later(reader, thread)

    async def _discard(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await discard(reader)
