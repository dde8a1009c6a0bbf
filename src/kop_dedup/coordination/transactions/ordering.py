"""The order in which committed transactions are copied into one data partition.

Decisions are applied concurrently (each transactional id has its own apply task, and
a transaction's partitions are copied at once), but two transactions that write to the
same data partition are copied there in the order they were decided on this sidecar:
each takes a :class:`Ticket` at its decision, and its copy into a partition waits for
the copy of the transaction decided before it into that partition.

A ticket released without copying (the apply gave up: another sidecar took the log
partition over, or the sidecar closes) passes its turn on only once the turn before it
has passed, so the order holds for the transactions behind it.

>>> import asyncio
>>> async def demo() -> list[str]:
...     order, done = CopyOrder(), []
...     first, second = order.ticket([("t", 0)]), order.ticket([("t", 0)])
...     async def copy(ticket: Ticket, name: str) -> None:
...         await ticket.wait(("t", 0))
...         done.append(name)
...         ticket.done(("t", 0))
...     await asyncio.gather(copy(second, "second"), copy(first, "first"))
...     return done
>>> asyncio.run(demo())
['first', 'second']
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable

__all__ = ["CopyOrder", "Ticket"]

PartKey = tuple[str, int]
Turn = tuple["asyncio.Future[None] | None", "asyncio.Future[None]"]
"""(the turn before, this turn) in one data partition."""


class Ticket:
    """One transaction's turns, one per data partition it copies into."""

    def __init__(self, turns: dict[PartKey, Turn]) -> None:
        self._turns = turns

    async def wait(self, part: PartKey) -> None:
        """Until every transaction decided before this one has copied into ``part``."""
        turn = self._turns.get(part)
        if turn is not None and turn[0] is not None and not turn[0].done():
            await asyncio.shield(turn[0])

    def done(self, part: PartKey) -> None:
        """This transaction's copy into ``part`` is complete: the next one may copy."""
        turn = self._turns.get(part)
        if turn is not None and not turn[1].done():
            turn[1].set_result(None)

    def release(self) -> None:
        """Give up the remaining turns (after the ones before them)."""
        for before, mine in self._turns.values():
            if mine.done():
                continue
            if before is None or before.done():
                mine.set_result(None)
            else:
                before.add_done_callback(functools.partial(_pass, mine))


def _pass(turn: asyncio.Future[None], _before: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)


class CopyOrder:
    """The last turn taken per data partition."""

    def __init__(self) -> None:
        self._tails: dict[PartKey, asyncio.Future[None]] = {}

    def ticket(self, parts: Iterable[PartKey]) -> Ticket:
        """Turns behind every transaction decided so far (call at the decision, with no
        await between the decision and this call)."""
        loop = asyncio.get_running_loop()
        turns: dict[PartKey, Turn] = {}
        for part in parts:
            before = self._tails.get(part)
            if before is not None and before.done():
                before = None
            mine: asyncio.Future[None] = loop.create_future()
            self._tails[part] = mine
            mine.add_done_callback(functools.partial(self._retire, part))
            turns[part] = (before, mine)
        return Ticket(turns)

    def _retire(self, part: PartKey, turn: asyncio.Future[None]) -> None:
        if self._tails.get(part) is turn:
            del self._tails[part]

    def __len__(self) -> int:
        return len(self._tails)
