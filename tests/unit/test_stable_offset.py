"""The last stable offset as pure rules (``kop_dedup.protocol.stable``): what a reader
of a data partition decides from the entries it read in order (each copied batch says
whose transaction it is and how many records that transaction has in the partition),
and what the transaction log decides for a copy the data cannot settle.
tests/integration/test_kafka_lso.py watches a real broker and real clients."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from kop_dedup.coordination.transactions import copier, journal
from kop_dedup.protocol.stable import (
    CopyHead,
    CopyMark,
    StableTracker,
    copy_settled,
)
from kop_dedup.protocol.transactions import Partition, Transaction, TxnState
from kop_dedup.pulsar import wire
from kop_dedup.pulsar.wire import copy_mark

PID = 7


def head(ordinal: int, batch: int, records: int, pid: int = PID) -> CopyMark:
    return CopyMark(pid, ordinal, CopyHead("app", batch, records))


def rest(ordinal: int, pid: int = PID) -> CopyMark:
    return CopyMark(pid, ordinal)


class Feed:
    """Feeds a tracker entry by entry, numbering entries and offsets as a broker would."""

    def __init__(self, start: int = 0) -> None:
        self.tracker = StableTracker(start)
        self.offset, self.entry = start, 0

    def put(self, count: int, mark: CopyMark | None = None, now: float = 0.0) -> int:
        at = self.offset
        self.tracker.feed(at, count, mark, (1, self.entry), now)
        self.offset += count
        self.entry += 1
        return at


def test_plain_records_are_stable_as_soon_as_they_are_read():
    p = Feed()
    p.put(3)
    p.put(2)
    assert (p.tracker.lso, p.tracker.end, p.tracker.holding) == (5, 5, False)


def test_a_copy_holds_the_lso_at_its_first_record_until_all_its_records_are_read():
    p = Feed()
    p.put(2)
    first = p.put(1, head(1, 0, 3))
    p.put(1, head(1, 1, 3))
    assert p.tracker.lso == first == 2
    p.put(1, head(1, 2, 3))
    assert (p.tracker.lso, p.tracker.holding) == (5, False)


def test_plain_records_after_a_copy_in_progress_wait_for_it():
    p = Feed()
    first = p.put(1, head(1, 0, 2))
    p.put(4)  # a plain producer's batch lands between two batches of the copy
    assert p.tracker.lso == first
    p.put(1, head(1, 1, 2))
    assert p.tracker.lso == p.offset == 6


def test_copies_of_two_transactions_interleaved_hold_the_lso_at_the_earliest_not_whole():
    """Two sidecars copy two transactions into one partition at once (cluster mode)."""
    p = Feed()
    a = p.put(1, head(1, 0, 2, pid=1))
    b = p.put(1, head(1, 0, 2, pid=2))
    p.put(1, head(1, 1, 2, pid=2))  # b is whole, a is not
    assert p.tracker.lso == a
    p.put(1, head(1, 1, 2, pid=1))
    assert p.tracker.lso == p.offset
    assert a < b


def test_the_rest_of_an_entry_read_in_two_pieces_counts_toward_its_batch():
    t = StableTracker(0)
    t.feed(0, 2, head(1, 0, 4), (1, 0))  # a read ended inside the entry
    t.feed(2, 2, rest(1), (1, 0))  # its rest, the next read
    assert (t.lso, t.holding) == (4, False)


def test_a_batch_stored_twice_is_counted_once():
    """A build before the one-identity copy could store a batch again under a repair name."""
    p = Feed()
    first = p.put(1, head(1, 0, 3))
    p.put(1, head(1, 0, 3))  # batch 0 again, another entry
    p.put(1, head(1, 1, 3))
    assert p.tracker.lso == first  # 3 records read, 2 of its 3 batches: not whole
    p.put(1, head(1, 2, 3))
    assert not p.tracker.holding
    p.put(1, head(1, 1, 3))  # a late second copy of a whole transaction's batch
    assert (p.tracker.lso, p.tracker.holding) == (p.offset, False)


def test_a_reader_that_starts_inside_a_copy_holds_the_lso_where_it_started():
    """It did not see the copy's beginning: the copy may have begun before the reader."""
    p = Feed(start=100)
    p.put(2)  # a plain batch between two batches of the copy
    p.put(1, head(1, 2, 4))  # batch 2 of 4 records: batches 0 and 1 lie before the start
    p.put(1, head(1, 3, 4))
    assert p.tracker.lso == 100
    [copy] = p.tracker.to_ask(now=0.0, after_s=60.0)  # asked at once
    assert not copy.from_start


def test_a_reader_that_starts_inside_an_entry_cannot_count_its_batch():
    t = StableTracker(10)
    t.feed(10, 2, rest(1), (1, 5))  # the last two records of a batch whose head it missed
    assert t.lso == 10
    assert [c.key for c in t.to_ask(0.0)] == [(PID, 1)]


def test_a_copy_seen_from_its_beginning_is_asked_of_the_log_only_after_a_while():
    p = Feed()
    p.put(1, head(1, 0, 2), now=10.0)
    assert p.tracker.to_ask(now=10.5, after_s=1.0) == []
    assert [c.key for c in p.tracker.to_ask(now=11.0, after_s=1.0)] == [(PID, 1)]


def test_a_settled_copy_holds_the_lso_until_a_read_begun_after_the_log_answered_drains():
    p = Feed(start=100)
    p.put(1, head(1, 5, 9))  # met without its beginning
    in_flight = p.tracker.reading()  # a read began before the log answered
    assert not p.tracker.settling
    p.tracker.settle((PID, 1))
    assert p.tracker.settling
    p.tracker.drained(in_flight)  # it may have stopped before the copy's last records
    assert p.tracker.lso == 100
    assert p.tracker.to_ask(0.0) == []  # settled: not asked again
    after = p.tracker.reading()
    p.put(1, head(1, 6, 9))  # what that read found
    p.tracker.drained(after)
    assert (p.tracker.lso, p.tracker.holding, p.tracker.settling) == (p.offset, False, False)


def test_a_settled_copy_whose_count_closes_is_whole_at_once():
    p = Feed()
    p.put(1, head(1, 0, 2))
    p.tracker.settle((PID, 1))
    p.put(1, head(1, 1, 2))
    assert not p.tracker.holding


# -- the data against a rule that sees the whole layout ---------------------------------------


@dataclass(frozen=True)
class _Entry:
    count: int
    txn: int | None  # None: plain
    batch: int = 0


@st.composite
def layouts(draw: st.DrawFn) -> list[_Entry]:
    """A partition: plain batches and the copies of up to four transactions, each copy's
    batches in order, copies interleaved with plain batches and with each other."""
    copies = draw(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), max_size=4))
    queues = [[_Entry(n, t, b) for b, n in enumerate(sizes)] for t, sizes in enumerate(copies)]
    out: list[_Entry] = []
    while any(queues):
        pick = draw(st.integers(-1, len(queues) - 1))
        if pick < 0 or not queues[pick]:
            out.append(_Entry(draw(st.integers(1, 3)), None))
        else:
            out.append(queues[pick].pop(0))
    return out


@given(layouts(), st.data())
def test_the_lso_of_every_prefix_is_the_first_record_of_the_earliest_copy_not_whole(
    layout: list[_Entry], data: st.DataObject
) -> None:
    totals: dict[int, int] = {}
    for e in layout:
        if e.txn is not None:
            totals[e.txn] = totals.get(e.txn, 0) + e.count
    t = StableTracker(0)
    offset, first, seen = 0, {}, dict.fromkeys(totals, 0)
    for n, e in enumerate(layout):
        split = data.draw(st.integers(0, e.count - 1)) if e.count > 1 else 0
        mark = None if e.txn is None else head(e.txn, e.batch, totals[e.txn], pid=e.txn)
        if split:  # read in two pieces: the second one without the batch's first record
            t.feed(offset, split, mark, (1, n))
            t.feed(offset + split, e.count - split, mark and rest(e.txn, pid=e.txn), (1, n))
        else:
            t.feed(offset, e.count, mark, (1, n))
        if e.txn is not None:
            first.setdefault(e.txn, offset)
            seen[e.txn] += e.count
        offset += e.count
        incomplete = [first[x] for x in first if seen[x] < totals[x]]
        assert t.lso == min(incomplete, default=offset)


# -- the transaction log's word -------------------------------------------------------------


def txn(state: TxnState, ordinal: int = 3, pid: int = PID) -> Transaction:
    part = Partition("t", 0, None, "1:0", "2:5")
    return Transaction("app", pid, 0, 60_000, state, ordinal, (part,))


def test_only_a_prepare_commit_of_that_very_transaction_is_still_copying():
    assert not copy_settled(txn(TxnState.PREPARE_COMMIT), PID, 3)
    assert copy_settled(txn(TxnState.COMPLETE_COMMIT), PID, 3)
    assert copy_settled(txn(TxnState.ONGOING, ordinal=4), PID, 3)  # the next one began
    assert copy_settled(txn(TxnState.PREPARE_COMMIT, ordinal=4), PID, 3)
    assert copy_settled(txn(TxnState.PREPARE_COMMIT, pid=PID + 1), PID, 3)  # a new producer id
    assert copy_settled(None, PID, 3)  # the id expired long ago
    assert not copy_settled(txn(TxnState.COMPLETE_COMMIT, ordinal=2), PID, 3)  # a stale view


# -- the marks on the wire ------------------------------------------------------------------


def test_a_copied_records_marks_are_read_from_its_properties():
    props = {
        wire.PROP_TXN_ORDINAL: "4",
        wire.PROP_TXN_ID: "app",
        wire.PROP_TXN_BATCH: "2",
        wire.PROP_TXN_RECORDS: "300",
    }
    assert copy_mark(props, 9) == CopyMark(9, 4, CopyHead("app", 2, 300))
    assert copy_mark({wire.PROP_TXN_ORDINAL: "4"}, 9) == CopyMark(9, 4)
    assert copy_mark({}, 9) is None
    assert copy_mark({wire.PROP_TXN_ORDINAL: "x"}, 9) is None  # unreadable: a plain record


def test_the_readers_property_names_are_the_ones_the_copier_writes():
    assert wire.PROP_TXN_ORDINAL == journal.PROP_TXN_ORDINAL
    assert wire.PROP_TXN_ID == journal.PROP_TXN_ID
    assert wire.PROP_TXN_RECORDS == journal.PROP_TXN_RECORDS
    assert wire.PROP_TXN_BATCH == copier.PROP_TXN_BATCH
