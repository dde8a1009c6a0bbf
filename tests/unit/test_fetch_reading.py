"""Reading a partition as entries (``kop_dedup.pulsar.fetching``), the pure parts: how
messages group into entries within a byte budget, and the offset arithmetic of a reader
(counted from where it starts, checked against the broker's index at ledger changes,
records deleted under it noticed). The client and the broker's index are stand-ins
here; tests/integration/test_kafka_fetch.py reads a real broker."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pulsar
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup.protocol.stable import CopyHead, CopyMark
from kop_dedup.pulsar.fetching import EntryReader
from kop_dedup.pulsar.stored import RECORD_OVERHEAD, RawEntry, StoredEntry, read_available
from kop_dedup.pulsar.wire import (
    PROP_EPOCH,
    PROP_PRODUCER_ID,
    PROP_SEQUENCE,
    PROP_TIMESTAMP,
    PROP_TXN_BATCH,
    PROP_TXN_ID,
    PROP_TXN_ORDINAL,
    PROP_TXN_RECORDS,
)

# -- stand-ins for the client's messages and reader ------------------------------------------


@dataclass(frozen=True)
class _Id:
    ledger: int
    entry: int
    batch: int

    def ledger_id(self) -> int:
        return self.ledger

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.batch


@dataclass(frozen=True)
class _Msg:
    at: _Id
    value: bytes
    sequence: int
    extra: tuple[tuple[str, str], ...] = ()
    """More properties (a copy's marks)."""

    def message_id(self) -> _Id:
        return self.at

    def properties(self) -> dict[str, str]:
        return {
            PROP_PRODUCER_ID: "7",
            PROP_EPOCH: "1",
            PROP_SEQUENCE: str(self.sequence),
            PROP_TIMESTAMP: "1000",
            **dict(self.extra),
        }

    def data(self) -> bytes:
        return self.value

    def partition_key(self) -> str:
        return ""

    def event_timestamp(self) -> int:
        return 0

    def publish_timestamp(self) -> int:
        return 2000 + self.at.entry


@dataclass
class _Reader:
    queue: list[_Msg]
    more: bool = False
    """has_message_available() says so while the queue is empty (a slow delivery)."""
    calls: list[str] = field(default_factory=list)

    def read_next(self, timeout_ms: int) -> _Msg:
        self.calls.append(f"read_next({timeout_ms})")
        if not self.queue:
            raise pulsar.Timeout
        return self.queue.pop(0)

    def has_message_available(self) -> bool:
        self.calls.append("has")
        return bool(self.queue) or self.more


def _messages(sizes: list[int], value: int = 10) -> list[_Msg]:
    out, seq = [], 0
    for entry, n in enumerate(sizes):
        for b in range(n):
            out.append(_Msg(_Id(5, entry, b), b"x" * value, seq))
            seq += 1
    return out


def test_entries_are_grouped_and_a_read_ends_on_an_entry_boundary():
    reader = _Reader(_messages([3, 2, 4]))
    per_record = 10 + RECORD_OVERHEAD
    raw, held, drained = read_available(reader, None, 1)  # one byte: the first entry whole
    assert [(r.entry, len(r.records)) for r in raw] == [(0, 3)]
    assert held is not None
    assert (held.at.entry, drained) == (1, False)
    raw, held, drained = read_available(reader, held, 10_000)
    assert [(r.entry, len(r.records), r.sequence) for r in raw] == [(1, 2, 3), (2, 4, 5)]
    assert (held, drained) == (None, True)
    assert raw[0].size == 61 + 2 * per_record
    assert raw[1].last == (5, 2, 3)
    assert (raw[0].producer_id, raw[0].epoch, raw[0].publish_time_ms) == (7, 1, 2001)


def test_the_broker_is_asked_only_when_the_clients_queue_is_empty():
    reader = _Reader(_messages([50]))
    raw, _, drained = read_available(reader, None, 1 << 20)
    assert (len(raw[0].records), drained) == (50, True)
    assert reader.calls.count("has") == 1  # at the end, not per message
    assert reader.calls.count("read_next(0)") == 51


def test_a_message_the_broker_has_but_the_client_has_not_yet_ends_the_read_undrained():
    reader = _Reader([], more=True)
    raw, held, drained = read_available(reader, None, 1 << 20)
    assert (raw, held, drained) == ([], None, False)


def test_a_message_the_client_hands_out_again_after_a_reconnection_is_read_once():
    """A reader opened inclusive subscribes again at the last message it handed out and
    hands it out again: the one held back (the next entry's first), or one inside the
    entry being read. Kept, it was counted twice and every later offset shifted by one
    (tests/integration/test_reader_reconnects.py shows the client doing it)."""
    messages = _messages([2, 3])
    first, second = messages[:2], messages[2:]
    held = second[0]
    reader = _Reader([held, second[1], second[1], second[2]])  # after two reconnections
    raw, _, drained = read_available(reader, held, 1 << 20, last=(5, 0, 1))
    assert [(r.entry, len(r.records), r.last) for r in raw] == [(1, 3, (5, 1, 2))]
    assert drained
    again = _Reader([first[1], *second])  # the last counted message first, then the rest
    raw, _, _ = read_available(again, None, 1 << 20, last=(5, 0, 1))
    assert [(r.entry, len(r.records)) for r in raw] == [(1, 3)]


# -- the offsets a reader counts ---------------------------------------------------------------

layouts = st.lists(  # ledgers of entries of 1..5 messages; ledger ids 10, 20, 30...
    st.lists(st.integers(1, 5), min_size=1, max_size=6), min_size=1, max_size=5
)


def _index(layout: list[list[int]]) -> dict[tuple[int, int], tuple[int, int]]:
    """(ledger, entry) -> (offset of its first message, messages)."""
    out, offset = {}, 0
    for li, entries in enumerate(layout):
        for e, n in enumerate(entries):
            out[(10 * (li + 1), e)] = (offset, n)
            offset += n
    return out


class _Positions:
    def __init__(self, index: dict[tuple[int, int], tuple[int, int]]) -> None:
        self.index, self.asked = index, 0
        self.learnt: dict[tuple[int, int], tuple[int, int]] = {}

    def learn(self, topic: str, ledger: int, entry: int, index: int, count: int) -> None:
        self.learnt[ledger, entry] = (index, count)

    async def offset_of(self, topic: str, position: tuple[int, int, int]) -> int:
        self.asked += 1
        return self.index[position[:2]][0] + max(position[2], 0)


def _raws(index, keys, start_batch: int) -> list[RawEntry]:
    out = []
    for i, (ledger, entry) in enumerate(keys):
        first = start_batch if i == 0 else 0
        n = index[(ledger, entry)][1] - first
        out.append(
            RawEntry(ledger, entry, first, 7, 0, 0, 0, [object()] * n, 0, None)  # type: ignore[list-item]
        )
    return out


@given(layouts, st.data())
def test_a_reader_counts_the_offsets_the_index_gives_asking_only_at_ledger_changes(layout, data):
    index = _index(layout)
    keys = sorted(index)
    k = data.draw(st.integers(0, len(keys) - 1))
    b = data.draw(st.integers(0, index[keys[k]][1] - 1))
    start = index[keys[k]][0] + b
    positions = _Positions(index)
    reader = EntryReader(None, positions, "t", start, (*keys[k], b))  # type: ignore[arg-type]
    got = asyncio.run(reader._count.counted(_raws(index, keys[k:], b)))
    assert [g.base_offset for g in got] == [start] + [index[key][0] for key in keys[k + 1 :]]
    assert reader.next_offset == sum(sum(ledger) for ledger in layout)
    assert reader.skipped_from is None
    assert positions.asked == len({ledger for ledger, _ in keys[k + 1 :]} - {keys[k][0]})


@given(layouts, st.data(), st.integers(1, 4))
def test_every_entry_read_whole_is_learnt_as_the_broker_indexes_it(layout, data, reads):
    """Entries read from their first message and followed by another are learnt with the
    index of their last message and their size, even when a read ends inside one (its
    rest comes first in the next read); the last one read and one started midway are
    not (their size is not known)."""
    index = _index(layout)
    keys = sorted(index)
    k = data.draw(st.integers(0, len(keys) - 1))
    b = data.draw(st.integers(0, index[keys[k]][1] - 1))
    positions = _Positions(index)
    start = index[keys[k]][0] + b
    reader = EntryReader(None, positions, "t", start, (*keys[k], b))  # type: ignore[arg-type]
    raws = _raws(index, keys[k:], b)
    # a read may end inside an entry: cut one raw in two, the rest in the next read
    cut = data.draw(st.integers(0, len(raws) - 1))
    raw = raws[cut]
    if len(raw.records) > 1:
        at = data.draw(st.integers(1, len(raw.records) - 1))
        rest = RawEntry(
            raw.ledger, raw.entry, raw.batch_index + at, 7, 0, 0, 0, raw.records[at:], 0, None
        )
        raws[cut : cut + 1] = [
            RawEntry(raw.ledger, raw.entry, raw.batch_index, 7, 0, 0, 0, raw.records[:at], 0, None),
            rest,
        ]
    cuts = (
        st.sets(st.integers(1, len(raws) - 1), max_size=reads - 1)
        if len(raws) > 1
        else st.just(set())
    )
    bounds = sorted(data.draw(cuts))
    for lo, hi in zip([0, *bounds], [*bounds, len(raws)], strict=True):
        asyncio.run(reader._count.counted(raws[lo:hi]))
    whole = [key for key in keys[k:-1] if key != keys[k] or b == 0]
    assert positions.learnt == {
        key: (index[key][0] + index[key][1] - 1, index[key][1]) for key in whole
    }


@given(layouts.filter(lambda layout: len(layout) >= 3), st.data())
def test_a_ledger_deleted_under_a_reader_is_noticed_and_nothing_after_it_counted(layout, data):
    index = _index(layout)
    keys = sorted(index)
    gone = data.draw(st.integers(2, len(layout) - 1)) * 10  # neither the first nor the last
    reader = EntryReader(None, _Positions(index), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    read = [key for key in keys if key[0] != gone]
    got = asyncio.run(reader._count.counted(_raws(index, read, 0)))
    before = [key for key in read if key[0] < gone]
    assert [g.base_offset for g in got] == [index[key][0] for key in before]
    assert reader.skipped_from == index[(gone, 0)][0]


def test_a_reader_that_starts_before_the_offset_asked_hands_out_nothing_before_it():
    index = _index([[4, 4]])
    reader = EntryReader(None, _Positions(index), "t", 6, None)  # type: ignore[arg-type]
    got = asyncio.run(reader._count.counted(_raws(index, [(10, 0), (10, 1)], 0)))
    assert [(g.base_offset, len(g.records)) for g in got] == [(6, 2)]
    assert got[0].position == (10, 1, 2)


def test_a_reader_whose_topic_was_created_again_under_it_stops_counting():
    old = _index([[3, 3]])
    reader = EntryReader(None, _Positions(old), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    got = asyncio.run(reader._count.counted(_raws(old, [(10, 0), (10, 1)], 0)))
    assert [g.base_offset for g in got] == [0, 3]
    new = {(20, 0): (0, 2)}  # the new topic's first ledger: offset 0 again
    reader._count._positions = _Positions(new)  # type: ignore[assignment]
    assert asyncio.run(reader._count.counted(_raws(new, [(20, 0)], 0))) == []
    assert reader.skipped_from == 6


def _sent(
    ledger: int, entry: int, batches: range, head: dict[str, str] | None = None
) -> list[_Msg]:
    """The messages of an entry the client hands out (``head``: a copy's marks, the
    ordinal on every record and the batch's facts on its first)."""
    marks, first = ({}, {}) if head is None else ({PROP_TXN_ORDINAL: "1"}, head)
    return [
        _Msg(_Id(ledger, entry, b), b"x", b, tuple({**marks, **(first if b == 0 else {})}.items()))
        for b in batches
    ]


def _read(reader: EntryReader, messages: list[_Msg]) -> list[StoredEntry]:
    """What ``reader`` counts of the messages the client hands it (as its pull does)."""
    raw, _, _ = read_available(_Reader(list(messages)), None, 1 << 20, last=reader._count.last)
    return asyncio.run(reader._count.counted(raw))


def test_an_entry_sent_again_after_a_reconnection_is_not_taken_for_a_new_topic():
    """A Pulsar reader whose connection dropped subscribes again at its last message and
    gets that entry once more: it was counted already; taking it for a topic created
    again answered OFFSET_OUT_OF_RANGE, and a Kafka consumer went back to its reset
    policy's offset (the earliest: it read the whole partition again)."""
    index = _index([[3, 3, 3]])
    reader = EntryReader(None, _Positions(index), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    got = _read(reader, _sent(10, 0, range(3)) + _sent(10, 1, range(3)))
    assert [g.base_offset for g in got] == [0, 3]
    # the entry again, then the rest of the batch after its last message, then the next
    got = _read(reader, _sent(10, 1, range(3)) + _sent(10, 1, range(2, 3)) + _sent(10, 2, range(3)))
    assert [g.base_offset for g in got] == [6]
    assert reader.skipped_from is None
    assert reader.next_offset == 9


def test_an_entry_sent_again_from_its_start_after_a_read_that_ended_inside_it_gives_the_rest():
    """The same reconnection when the last read ended inside an entry: the entry comes
    again from its first message; what was counted of it is not counted again."""
    index = _index([[3, 3, 3]])
    reader = EntryReader(None, _Positions(index), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    got = _read(reader, _sent(10, 0, range(3)) + _sent(10, 1, range(1)))  # ended after (10, 1, 0)
    assert [(g.base_offset, len(g.records)) for g in got] == [(0, 3), (3, 1)]
    got = _read(reader, _sent(10, 1, range(3)) + _sent(10, 2, range(3)))
    assert [(g.base_offset, len(g.records)) for g in got] == [(4, 2), (6, 3)]
    assert got[0].position == (10, 1, 1)
    assert reader.skipped_from is None
    assert reader.next_offset == 9


# -- read_committed: the last stable offset of what a reader counted ----------------------------


def _marked(ledger, entry, first, n, mark):  # type: ignore[no-untyped-def]
    return RawEntry(ledger, entry, first, 7, 0, 0, 0, [object()] * n, 0, mark)  # type: ignore[list-item]


def test_a_read_committed_reader_hands_out_only_what_lies_before_a_copy_not_whole_yet():
    index = _index([[2, 1, 1, 1]])
    reader = EntryReader(None, _Positions(index), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    copy = lambda batch: CopyMark(7, 1, CopyHead("app", batch, 2))  # noqa: E731
    got = asyncio.run(
        reader._count.counted(
            [
                _marked(10, 0, 0, 2, None),  # plain
                _marked(10, 1, 0, 1, copy(0)),  # the copy's first batch of two
                _marked(10, 2, 0, 1, None),  # plain, after the copy's first record
            ]
        )
    )
    reader._unread.extend(got)  # as a read ahead keeps them
    assert reader.stable.lso == 2
    assert [e.base_offset for e in reader._pop(1 << 20, reader._stable_unread())] == [0]
    assert reader.next_offset == 2  # kept for the next fetch at the copy's first record
    reader._unread.extend(asyncio.run(reader._count.counted([_marked(10, 3, 0, 1, copy(1))])))
    assert [e.base_offset for e in reader._pop(1 << 20, reader._stable_unread())] == [2, 3, 4]


def test_an_entry_sent_again_from_its_start_counts_its_batch_once():
    """A read ended inside a copied batch; the reader's connection dropped and the broker
    sent the entry again from its first record: its rest counts, its head not twice."""
    index = _index([[4]])
    reader = EntryReader(None, _Positions(index), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    head = {PROP_TXN_ID: "app", PROP_TXN_BATCH: "0", PROP_TXN_RECORDS: "5"}  # one more batch
    _read(reader, _sent(10, 0, range(2), head))
    _read(reader, _sent(10, 0, range(4), head))  # again, from its start
    [copy] = reader.stable.open_copies()
    assert copy.seen == 4  # not 6: the rest's two records, the head counted once


# -- read_committed past the read-ahead bound: the reader spills and reads again ---------------


class _AsyncReader:
    """The client's async reader as :class:`EntryReader` uses it (``_reader`` for the
    blocking calls on a worker thread)."""

    def __init__(self, queue: list[_Msg]) -> None:
        self._reader = _Reader(queue)

    async def has_message_available(self) -> bool:
        return self._reader.has_message_available()

    async def close(self) -> None:
        return None


class _Log:
    """A partition's messages; a reader created at a position gets them from there."""

    def __init__(self, messages: list[_Msg]) -> None:
        self.messages, self.opened = messages, []

    async def create_reader(self, topic, start, start_message_id_inclusive):  # type: ignore[no-untyped-def]
        at = (start.ledger_id(), start.entry_id(), max(start.batch_index(), 0))
        self.opened.append(at)
        return _AsyncReader(
            [m for m in self.messages if (m.at.ledger, m.at.entry, max(m.at.batch, 0)) >= at]
        )


def _copy_log(plain_before: int, copy_batches: int, per_batch: int, plain_after: int) -> list[_Msg]:
    """Plain one-record entries, one copy of ``copy_batches`` entries, plain entries."""
    out: list[_Msg] = []
    entry = 0
    for _ in range(plain_before):
        out += _sent(10, entry, range(1))
        entry += 1
    records = copy_batches * per_batch
    for b in range(copy_batches):
        head = {PROP_TXN_ID: "app", PROP_TXN_BATCH: str(b), PROP_TXN_RECORDS: str(records)}
        out += _sent(10, entry, range(per_batch), head)
        entry += 1
    for _ in range(plain_after):
        out += _sent(10, entry, range(1))
        entry += 1
    return out


@given(
    st.integers(0, 3),
    st.integers(1, 40),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(1, 6),
    st.integers(1, 400),
    st.booleans(),
)
def test_a_read_committed_reader_reads_a_copy_larger_than_its_read_ahead_once_in_order(
    before, batches, per_batch, after_, ahead_records, fetch_bytes, ask
):
    """A copy larger than what a reader may keep back: on the build before, the reader
    stopped reading once it kept ``_AHEAD_BYTES`` and never saw the copy whole (a
    read_committed consumer got nothing, for good). Every record comes once, in order,
    at its offset, and no more than the bound (and one read's chunk) is ever kept; also
    when the reads take only what the client holds and the broker is asked apart
    (``ask=False`` and :meth:`EntryReader.probe`, as a fetch of many partitions does)."""
    from kop_dedup.pulsar import fetching

    messages = _copy_log(before, batches, per_batch, after_)
    total = len(messages)
    index = _index([[1] * before + [per_batch] * batches + [1] * after_])
    log = _Log(messages)
    reader = EntryReader(log, _Positions(index), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    per_record = 1 + RECORD_OVERHEAD
    bound, chunk = ahead_records * per_record, 2 * per_record
    saved = fetching._AHEAD_BYTES, fetching._AHEAD_CHUNK
    fetching._AHEAD_BYTES, fetching._AHEAD_CHUNK = bound, chunk
    got: list[int] = []
    try:
        for _ in range(4 * total + 10):
            if len(got) == total:
                break
            for entry in asyncio.run(reader.read(fetch_bytes, committed=True, ask=ask)):
                got.extend(range(entry.base_offset, entry.next_offset))
            if reader.unasked:
                asyncio.run(reader.probe())
            kept = sum(e.size for e in reader._unread)
            assert kept <= bound + chunk + per_batch * per_record + fetch_bytes
    finally:
        fetching._AHEAD_BYTES, fetching._AHEAD_CHUNK = saved
    assert got == list(range(total))
    assert not reader.stable.holding
    spilled = len(log.opened) > 1
    # a read that has seen no copy yet reads up to the fetch's budget in one pull, so a
    # copy within it is read whole without a spill
    unspilled = bound + chunk + per_batch * per_record + fetch_bytes
    assert spilled or batches * per_batch * per_record <= unspilled


def test_a_spilled_reader_that_handed_out_what_it_kept_says_it_stands_where_it_stopped_keeping():
    """The reader pool keeps a reader under its next offset: after a spill, once what was
    kept is handed out, that is where it stopped keeping (it reads again from there), not
    the end of what it read through."""
    from kop_dedup.pulsar import fetching

    messages = _copy_log(0, 6, 1, 0)
    index = _index([[1] * 6])
    reader = EntryReader(_Log(messages), _Positions(index), "t", 0, (10, 0, 0))  # type: ignore[arg-type]
    saved = fetching._AHEAD_BYTES, fetching._AHEAD_CHUNK
    fetching._AHEAD_BYTES, fetching._AHEAD_CHUNK = 2 * (1 + RECORD_OVERHEAD), 1
    try:
        got = asyncio.run(reader.read(1, committed=True))
        assert reader.spilled
        for entry in got:
            assert entry.base_offset < reader.next_offset or not reader._unread
        while reader._unread:
            got += asyncio.run(reader.read(1, committed=True))
        assert (reader.next_offset, reader.next_position) == (
            reader._spill[0],  # type: ignore[index]
            reader._spill[1],  # type: ignore[index]
        )
        assert reader.next_offset == sum(len(e.records) for e in got)
    finally:
        fetching._AHEAD_BYTES, fetching._AHEAD_CHUNK = saved
