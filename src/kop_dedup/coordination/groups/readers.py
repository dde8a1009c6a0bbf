"""The group coordinator's pool of partition readers, one per (group, member,
partition), kept between pulls so a member's next pull goes on reading where the last
one ended (no lookup, no new Pulsar reader).

A reader is reused only when the next pull starts where it stands; otherwise (a
rewind, a reset, a pull answered elsewhere) it is closed and a new one opened. Readers
go when their member's partitions move (:meth:`ReaderPool.drop`) and when idle for
``idle_s`` (:meth:`ReaderPool.reap`): a member that left through another sidecar is
forgotten here within that time. A reader a pull holds (:meth:`ReaderPool.using`) is in
use however long the pull waits for records, never idle: closed under a long poll, it
read nothing more and the pull answered [] at its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kop_dedup.protocol.groups import TopicPartition
from kop_dedup.pulsar.message_ids import MessagePosition
from kop_dedup.pulsar.positions import Positions
from kop_dedup.pulsar.reading import PartitionReader
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["ReaderPool"]

_Key = tuple[str, str, TopicPartition]


@dataclass(slots=True)
class _Entry:
    reader: PartitionReader
    last_used: float
    users: int = 0


class ReaderPool:
    def __init__(self, client: PulsarClient, positions: Positions, *, idle_s: float) -> None:
        self._client, self._positions, self.idle_s = client, positions, idle_s
        self._readers: dict[_Key, _Entry] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._readers)

    def reader(
        self,
        group: str,
        member: str,
        tp: TopicPartition,
        topic: str,
        offset: int,
        at: MessagePosition,
    ) -> PartitionReader:
        """The member's reader of ``tp`` standing at ``offset`` (``topic``: its Pulsar
        partition topic; ``at``: the position of ``offset``)."""
        k = (group, member, tp)
        entry = self._readers.get(k)
        now = time.monotonic()
        if entry is not None and entry.reader.next_offset == offset and not entry.reader.closed:
            entry.last_used = now
            return entry.reader
        if entry is not None:
            self._close(k)
        reader = PartitionReader(self._client, self._positions, topic, offset, at)
        self._readers[k] = _Entry(reader, now)
        return reader

    def current(self, group: str, member: str, tp: TopicPartition) -> PartitionReader | None:
        entry = self._readers.get((group, member, tp))
        return None if entry is None else entry.reader

    def drop(self, group: str, member: str | None = None, tp: TopicPartition | None = None) -> None:
        """Close the readers of a group (of one member, of one partition)."""
        for k in [
            k
            for k in self._readers
            if k[0] == group and (member is None or k[1] == member) and (tp is None or k[2] == tp)
        ]:
            self._close(k)

    @contextlib.contextmanager
    def using(self, group: str, member: str, tps: Iterable[TopicPartition]) -> Iterator[None]:
        """Hold the member's readers of ``tps`` in use: :meth:`reap` leaves them, and
        their idle time starts when the holder lets go."""
        held = [e for tp in tps if (e := self._readers.get((group, member, tp))) is not None]
        for entry in held:
            entry.users += 1
        try:
            yield
        finally:
            now = time.monotonic()
            for entry in held:
                entry.users -= 1
                entry.last_used = now

    def reap(self) -> None:
        """Close the readers idle for ``idle_s`` (none in use)."""
        idle = time.monotonic() - self.idle_s
        for k, entry in list(self._readers.items()):
            if entry.users == 0 and entry.last_used < idle:
                self._close(k)

    async def close(self) -> None:
        for entry in list(self._readers.values()):
            await entry.reader.close()
        self._readers.clear()
        while self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _close(self, k: _Key) -> None:
        entry = self._readers.pop(k, None)
        if entry is None:
            return
        task = asyncio.ensure_future(entry.reader.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
