"""The Fetch handler's rules that need no broker: KIP-74's byte limits over partitions
read in order (stand-in readers), and who may commit offsets into a group the HTTP API
manages (Kafka's OffsetCommit rules)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kop_dedup import errors
from kop_dedup.coordination.groups.simple import Route, route
from kop_dedup.protocol.groups import Group, GroupConfig, Member
from kop_dedup.protocol.records import rec
from kop_dedup.pulsar.fetching import StoredEntry
from kop_dedup.transports.kafka.fetch import _How, _Part, _pass
from kop_dedup.transports.kafka.fetched import encode_entry

# -- KIP-74 -------------------------------------------------------------------------------------


@dataclass
class _Reader:
    """Entries of the given record counts, each record ``value`` bytes."""

    entries: list[StoredEntry]
    skipped_from: int | None = None
    handed: list[StoredEntry] = field(default_factory=list)

    async def read(
        self, max_bytes: int, *, committed: bool = False, ask: bool = True, fresh_s: float = 0.0
    ) -> list[StoredEntry]:
        out, size = [], 0
        while self.entries and (size < max_bytes or not out):
            entry = self.entries.pop(0)
            out.append(entry)
            size += entry.size
        return out

    def unread(self, entries: list[StoredEntry]) -> None:
        self.entries[:0] = entries


def _entries(counts: list[int], value: int) -> list[StoredEntry]:
    out, offset = [], 0
    for n in counts:
        records = tuple(rec(b"x" * value) for _ in range(n))
        out.append(StoredEntry(offset, (1, len(out), 0), 7, 0, offset, records, 1, n * value))
        offset += n
    return out


partitions = st.lists(
    st.tuples(st.lists(st.integers(1, 8), max_size=6), st.integers(1, 400)), min_size=1, max_size=4
)


@given(partitions, st.integers(0, 3000), st.integers(0, 3000))
def test_limits_are_exceeded_only_by_the_first_batch_of_the_answer(parts, part_max, max_bytes):
    readers = [_Reader(_entries(counts, value)) for counts, value in parts]
    fetched = [_Part("t", i, 0, part_max, reader=r) for i, r in enumerate(readers)]  # type: ignore[arg-type]
    total = asyncio.run(_pass(None, fetched, max_bytes, 0, _How(False)))  # type: ignore[arg-type]
    sizes = [[len(b) for b in p.batches] for p in fetched]
    assert total == sum(map(sum, sizes))
    first = next((i for i, s in enumerate(sizes) if s), None)
    for i, s in enumerate(sizes):
        allowed = part_max if i != first else max(part_max, s[0] if s else 0)
        assert sum(s) <= allowed or (len(s) == 1 and i == first)
    rest = total - (sizes[first][0] if first is not None else 0)
    assert rest <= max(max_bytes - (sizes[first][0] if first is not None else 0), 0)
    # what did not fit stays for the next fetch, in order: nothing lost, nothing twice
    for p, r, (counts, _) in zip(fetched, readers, parts, strict=True):
        kept = [e.base_offset for e in r.entries]
        answered = len(p.batches)
        assert kept == [e.base_offset for e in _entries(counts, 1)][answered:]
    # progress: when anything is there, the answer holds at least one batch
    if any(counts for counts, _ in parts):
        assert first is not None


def test_the_first_batch_comes_whole_even_over_both_limits():
    reader = _Reader(_entries([10, 10], 100))
    part = _Part("t", 0, 0, 1, reader=reader)  # type: ignore[arg-type]
    asyncio.run(_pass(None, [part], 1, 0, _How(False)))  # type: ignore[arg-type]
    assert [len(b) for b in part.batches] == [len(encode_entry(_entries([10], 100)[0]))]
    assert [e.base_offset for e in reader.entries] == [10]


# -- who may commit -------------------------------------------------------------------------------

MISSING = errors.IllegalGeneration("no such group")
EMPTY = Group(GroupConfig(), generation=4)
GROUP = Group(GroupConfig(), generation=4, members={"m1": Member("m1", ("t",), 0, 0)})


@pytest.mark.parametrize(
    ("doc", "member", "generation", "answer"),
    [
        (None, "", -1, Route.STORE),  # a simple group: Kafka makes one
        (None, "anyone", -1, Route.STORE),
        (None, "", 0, MISSING),  # a generation of a group that is not there
        (EMPTY, "", -1, Route.STORE),  # an empty group takes admin commits
        (EMPTY, "m1", 4, errors.UnknownMemberId),
        (GROUP, "", -1, errors.UnknownMemberId),  # members: a commit must name one
        (GROUP, "m1", 4, Route.MEMBER),  # the coordinator checks member and generation
        (GROUP, "m2", 4, Route.MEMBER),
        (GROUP, "m1", -1, Route.MEMBER),
    ],
)
def test_where_a_commit_goes_or_the_error_it_gets(doc, member, generation, answer):
    """``doc`` is what the group coordinator's ``describe`` answers: a typed Group."""
    if isinstance(answer, Route):
        assert route(doc, "g", member, generation, MISSING) is answer
        return
    expected = answer if isinstance(answer, type) else type(answer)
    with pytest.raises(expected):
        route(doc, "g", member, generation, MISSING)
