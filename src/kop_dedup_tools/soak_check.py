"""The soak's judgement: what was read back, against what was put in (pure functions).

Inputs are plain records: the input topic's values per partition (read from Pulsar at
the end, so they are what is there, whatever the seeding producer was told), and the
output as a reader saw it (:class:`OutRecord`: the partition, the offset, the value, the
copier's attempt header, and, when read from Pulsar directly, the transaction each copy
belongs to). Each check counts; :class:`CheckResult` holds the counts and a few examples.

- **duplicated**: an input value read more than once from an output topic (a value read
  3 times counts 2);
- **lost**: an input value never read (in its partition);
- **unexpected**: an output value that is in no input partition, or in another one than
  its input's (the copiers keep the partition number);
- **out of order**: within a partition, a value read (the first time) after a value that
  came later in the input;
- **aborted**: a value written by a copier attempt that was never asked to commit (the
  librdkafka copier logs ``begin`` and ``commit`` of every attempt, and tags each copy
  with the attempt in a header): an aborted transaction's record read;
- **offsets**: each group's committed offset of each input partition is the input's
  end at the end of the run, not beyond (a consumer handed records past the end) and
  not short; and each Pulsar partition's message count agrees with the broker's index
  (else the offsets the checks use are wrong);
- **LSO inside a transaction** (:func:`lso_violations`).

**LSO inside a transaction.** A read_committed reader may read a partition up to its
last stable offset (LSO), exclusive. Kafka's contract: the LSO is at most the first
offset of the earliest transaction not complete in the partition, so a reader never
sees part of an incomplete transaction. Every answer the watcher saw (ListOffsets
READ_COMMITTED, and the end a read_committed consumer stopped at) is checked against the
spans ``[first, last]`` of the committed transactions' copies in that partition, as
read back at the end (the copies carry ``kafka.txn.ordinal`` and the producer id on every
record). An answer ``L`` with ``first < L <= last`` lies strictly inside that span: the
reader could see ``first .. L-1`` and not the rest. It is a violation unless ``L`` is
the first offset of another transaction's span (copies of two transactions can
interleave in a partition; when one completes while the other is still being copied,
the LSO rightly stops at the other's start, which may lie inside the first's span: an
answer there cannot be told from a right one, so it is not counted). That makes the
check one-sided: every answer it counts is wrong.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ATTEMPT_HEADER",
    "CHECKS",
    "Answer",
    "CheckResult",
    "OutRecord",
    "Span",
    "aborted_reads",
    "committed_offsets",
    "copy_counts",
    "lso_violations",
    "spans",
]

CHECKS = ("duplicates", "lost", "order", "aborted", "offsets", "lso")
"""The checks ``--checks`` can choose (``duplicates`` also counts unexpected values)."""

ATTEMPT_HEADER = "soak.attempt"
"""The Kafka header the librdkafka copier puts on every copy: its transaction attempt."""

_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class OutRecord:
    partition: int
    offset: int
    value: str
    attempt: str | None = None
    """The librdkafka copier's attempt (header ``soak.attempt``); None from the Java one."""
    txn: tuple[int, int] | None = None
    """(producer id, ordinal): the committed transaction the copy belongs to (Pulsar
    read only)."""
    txn_id: str | None = None
    """The transactional id, on the first record of each copied batch (Pulsar read only)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One read_committed end the watcher was told, and when (seconds into the run)."""

    at_s: float
    topic: str
    partition: int
    offset: int
    source: str
    """``list-offsets`` (ListOffsets READ_COMMITTED) or ``consumer-eof`` (where a
    read_committed consumer reached the end)."""


@dataclass(frozen=True, slots=True)
class Span:
    txn: tuple[int, int]
    txn_id: str | None
    first: int
    last: int
    records: int


@dataclass(slots=True)
class CheckResult:
    name: str
    checked: int
    violations: int
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def note(self, example: str) -> None:
        self.violations += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append(example)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def copy_counts(
    inputs: Mapping[int, Sequence[str]], output: Iterable[OutRecord], *, reader: str
) -> dict[str, CheckResult]:
    """``duplicates``, ``lost`` and ``order`` of one output topic as ``reader`` read it."""
    where = {v: (p, i) for p, values in inputs.items() for i, v in enumerate(values)}
    dup = CheckResult(f"duplicates ({reader})", 0, 0)
    order = CheckResult(f"order ({reader})", 0, 0)
    seen: Counter[str] = Counter()
    in_place: set[str] = set()
    highest: dict[int, tuple[int, str]] = {}
    for rec in output:
        dup.checked += 1
        seen[rec.value] += 1
        origin = where.get(rec.value)
        if seen[rec.value] > 1:
            dup.note(f"{rec.value!r} read again at {rec.partition}@{rec.offset}")
            continue
        if origin is None or origin[0] != rec.partition:
            dup.note(f"{rec.value!r} at {rec.partition}@{rec.offset} is no input of partition")
            continue
        in_place.add(rec.value)
        order.checked += 1
        before = highest.get(rec.partition)
        if before is not None and origin[1] < before[0]:
            order.note(f"{rec.value!r} at {rec.partition}@{rec.offset} after {before[1]!r}")
        else:
            highest[rec.partition] = (origin[1], rec.value)
    lost = CheckResult(f"lost ({reader})", len(where), 0)
    for value, (p, _) in where.items():
        if value not in in_place:
            lost.note(f"{value!r} (input partition {p}) never read in its partition")
    return {"duplicates": dup, "lost": lost, "order": order}


def committed_offsets(
    committed: Mapping[int, int], ends: Mapping[int, int], *, group: str
) -> CheckResult:
    """The group's committed offset of every input partition is the partition's end."""
    result = CheckResult(f"offsets ({group})", len(ends), 0)
    for partition, end in sorted(ends.items()):
        got = committed.get(partition, 0)
        if got > end:
            result.note(f"partition {partition}: committed {got}, beyond the end {end}")
        elif got < end:
            result.note(f"partition {partition}: committed {got}, short of the end {end}")
    return result


def aborted_reads(
    output: Iterable[OutRecord], aborted_attempts: set[str], *, reader: str
) -> CheckResult:
    """Records whose attempt never asked to commit (see the module docstring)."""
    result = CheckResult(f"aborted ({reader})", 0, 0)
    for rec in output:
        if rec.attempt is None:
            continue
        result.checked += 1
        if rec.attempt in aborted_attempts:
            result.note(f"{rec.value!r} at {rec.partition}@{rec.offset} of aborted {rec.attempt}")
    return result


def spans(output: Iterable[OutRecord]) -> dict[int, list[Span]]:
    """Per partition, each transaction's ``[first, last]`` offsets (sorted by first)."""
    acc: dict[tuple[int, tuple[int, int]], list[Any]] = {}
    for rec in output:
        if rec.txn is None:
            continue
        item = acc.setdefault((rec.partition, rec.txn), [rec.offset, rec.offset, 0, None])
        item[0], item[1] = min(item[0], rec.offset), max(item[1], rec.offset)
        item[2] += 1
        item[3] = item[3] or rec.txn_id
    out: dict[int, list[Span]] = {}
    for (partition, txn), (first, last, n, tid) in acc.items():
        out.setdefault(partition, []).append(Span(txn, tid, first, last, n))
    for items in out.values():
        items.sort(key=lambda s: s.first)
    return out


def lso_violations(
    answers: Iterable[Answer], topic_spans: Mapping[str, Mapping[int, Sequence[Span]]]
) -> CheckResult:
    """Answers strictly inside a transaction's span that are no other span's start."""
    result = CheckResult("lso inside a transaction", 0, 0)
    # per partition: the spans by first offset, and the furthest last offset of the
    # spans up to each (an answer is inside some span starting before it iff that
    # furthest last reaches it)
    index: dict[tuple[str, int], tuple[list[int], list[Span], list[int], set[int]]] = {}
    for topic, by_partition in topic_spans.items():
        for partition, items in by_partition.items():
            ordered = sorted(items, key=lambda s: s.first)
            furthest: list[int] = []
            for span in ordered:
                furthest.append(max(span.last, furthest[-1] if furthest else span.last))
            firsts = [s.first for s in ordered]
            index[(topic, partition)] = (firsts, ordered, furthest, set(firsts))
    for answer in answers:
        result.checked += 1
        entry = index.get((answer.topic, answer.partition))
        if entry is None:
            continue
        firsts, ordered, furthest, starts = entry
        before = bisect.bisect_left(firsts, answer.offset)  # spans with first < answer
        if before == 0 or furthest[before - 1] < answer.offset or answer.offset in starts:
            continue
        span = next(s for s in reversed(ordered[:before]) if s.first < answer.offset <= s.last)
        result.note(
            f"{answer.source} answered {answer.offset} for {answer.topic}/"
            f"{answer.partition} at {answer.at_s:.1f}s, inside transaction "
            f"{span.txn_id or span.txn} [{span.first}, {span.last}] ({span.records} records)"
        )
    return result
