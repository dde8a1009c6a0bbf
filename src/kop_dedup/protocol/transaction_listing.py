"""Which transactions ListTransactions answers, and how DescribeTransactions shows one
(pure: Kafka's ``TransactionStateManager.listTransactionStates`` rules on our state).

ListTransactions filters by state (Kafka's state names, compared case-sensitively:
an unknown name is answered back in ``unknown_state_filters`` and matches nothing), by
producer id, by how long the current transaction has been running (v1: longer than the
duration; -1: any) and by a transactional id pattern (v2: a regular expression the
whole id must match; one that does not compile is INVALID_REGULAR_EXPRESSION).

>>> unknown_states(["Ongoing", "ongoing"])
['ongoing']
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kop_dedup.errors import InvalidRegularExpression
from kop_dedup.protocol.transaction_state import Transaction, TxnState

__all__ = ["KAFKA_STATES", "Filters", "select", "start_time", "topics_of", "unknown_states"]

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


def select(txns: Iterable[Transaction], filters: Filters, now_ms: int) -> list[Transaction]:
    """The transactions ListTransactions lists, by transactional id."""
    compiled = None
    if filters.pattern:
        try:
            compiled = re.compile(filters.pattern)
        except re.error as exc:
            raise InvalidRegularExpression(
                f"transactional id pattern {filters.pattern!r}: {exc}"
            ) from exc
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
