"""Which transactions ListTransactions answers, and how DescribeTransactions shows one
(pure: Kafka's ``TransactionStateManager.listTransactionStates`` rules on our state).

ListTransactions filters by state (Kafka's state names, compared case-sensitively:
an unknown name is answered back in ``unknown_state_filters`` and matches nothing), by
producer id, by how long the current transaction has been running (v1: longer than the
duration; -1: any) and by a transactional id pattern (v2: a regular expression the
whole id must match; one that does not compile is INVALID_REGULAR_EXPRESSION).

The pattern is a client's, and matched on the event loop: it runs on RE2 (linear in the
id's length, whatever the pattern), never on a backtracking engine, where ``(a+)+b``
against thirty ``a`` takes minutes. Kafka's patterns are Java's: what RE2 cannot run in
linear time (lookaround, backreferences, possessive and atomic groups) and Java syntax RE2
would read differently (a class inside a class, ``&&`` intersections) is refused with
INVALID_REQUEST and says so; a pattern no engine compiles is INVALID_REGULAR_EXPRESSION.
Compiling is bounded too (RE2 holds the GIL, so a worker thread would not help): a
pattern is at most :data:`MAX_PATTERN_CHARS` long and its compiled program at most
256 KiB (``{1000}`` repetitions expand), else INVALID_REQUEST.

>>> compile_pattern("flink-.*").fullmatch("flink-0") is not None
True

>>> unknown_states(["Ongoing", "ongoing"])
['ongoing']
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import re2

from kop_dedup.errors import InvalidRegularExpression, InvalidRequest
from kop_dedup.protocol.transaction_state import Transaction, TxnState

__all__ = [
    "KAFKA_STATES",
    "MAX_PATTERN_CHARS",
    "Filters",
    "Matcher",
    "compile_pattern",
    "select",
    "start_time",
    "topics_of",
    "unknown_states",
]

KAFKA_STATES = frozenset({s.value for s in TxnState} | {"Dead"})
"""The state names Kafka's transaction coordinator knows (``TransactionState``)."""


def unknown_states(states: Iterable[str]) -> list[str]:
    """The state filters Kafka would not know, in the order given."""
    return [s for s in states if s not in KAFKA_STATES]


@dataclass(frozen=True, slots=True)
class Filters:
    states: frozenset[str] = frozenset()
    producer_ids: frozenset[int] = frozenset()
    duration_ms: int = -1
    pattern: str | None = None


class Matcher(Protocol):
    def fullmatch(self, text: str) -> object | None: ...


MAX_PATTERN_CHARS = 4096
"""The longest transactional id pattern (a longer one is INVALID_REQUEST): parsing is
linear in it, and the backtracking engine that only judges a pattern RE2 refuses took 90 s
over 8 MiB of one."""

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a client's bad pattern is its answer, not our log
_RE2_OPTIONS.max_mem = 256 << 10  # a program past it is "pattern too large", in ~0.1 s


def compile_pattern(pattern: str) -> Matcher:
    """A transactional id pattern compiled for linear-time matching (RE2).

    Raises InvalidRequest (42) for Java syntax RE2 does not run or would read
    otherwise, InvalidRegularExpression (128) for a pattern that does not compile."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidRequest(
            f"transactional id pattern of {len(pattern)} characters; at most"
            f" {MAX_PATTERN_CHARS} are matched"
        )
    java_only = _java_class_syntax(pattern)
    if java_only is not None:
        raise InvalidRequest(
            f"transactional id pattern {pattern!r}: {java_only} is not supported here"
            " (patterns run on RE2, in linear time)"
        )
    try:
        return re2.compile(pattern, _RE2_OPTIONS)  # type: ignore[no-any-return]
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args else str(exc)
    try:  # a backtracking engine only judges whether it is a regular expression at all
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its FutureWarnings on set syntax
            re.compile(pattern)
    except re.error as exc:
        raise InvalidRegularExpression(f"transactional id pattern {pattern!r}: {exc}") from exc
    raise InvalidRequest(
        f"transactional id pattern {pattern!r}: {reason} (patterns run on RE2, in linear"
        " time: no lookaround, backreferences, possessive quantifiers or atomic groups,"
        " repetitions up to 1000)"
    )


def _java_class_syntax(pattern: str) -> str | None:
    """Java's class union (a ``[`` inside a class) or intersection (``&&``), which RE2
    would accept with another meaning; None when the pattern has neither."""
    in_class, class_start, i = False, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "[":
                return "a character class inside a class"
            if pattern.startswith("&&", i):
                return "a character class intersection (&&)"
            if c == "]" and not class_start:
                in_class = False
            class_start = class_start and c == "^"
        elif c == "[":
            in_class, class_start = True, True
        i += 1
    return None


def select(txns: Iterable[Transaction], filters: Filters, now_ms: int) -> list[Transaction]:
    """The transactions ListTransactions lists, by transactional id."""
    compiled = compile_pattern(filters.pattern) if filters.pattern else None
    out = []
    for txn in txns:
        if filters.producer_ids and txn.producer_id not in filters.producer_ids:
            continue
        if filters.states and txn.state.value not in filters.states:
            continue
        if filters.duration_ms >= 0 and now_ms - start_time(txn) <= filters.duration_ms:
            continue
        if compiled is not None and compiled.fullmatch(txn.transactional_id) is None:
            continue
        out.append(txn)
    return sorted(out, key=lambda t: t.transactional_id)


def start_time(txn: Transaction) -> int:
    """When the current transaction began (-1 when none is open, as Kafka answers)."""
    return txn.started_ms if txn.state.open else -1


def topics_of(txn: Transaction) -> dict[str, list[int]]:
    """The partitions of the open transaction by topic, those the coordinator still
    expects to complete, as Kafka's DescribeTransactions answers: none when none is
    open, and not those where a commit's copy cannot complete as decided
    (:meth:`Transaction.stuck`: ``kafka-transactions find-hanging`` names them) or was
    dropped."""
    out: dict[str, list[int]] = {}
    if txn.state.open:
        for part in txn.partitions:
            if not part.dropped and not txn.stuck(part):
                out.setdefault(part.topic, []).append(part.partition)
    return {t: sorted(p) for t, p in out.items()}
