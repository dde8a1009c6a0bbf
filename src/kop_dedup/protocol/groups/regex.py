"""Subscriptions by regular expression of the consumer group protocol (KIP-848: a
ConsumerGroupHeartbeat v1's ``SubscribedTopicRegex``, sent by the Java consumer for
``subscribe(SubscriptionPattern)`` and by librdkafka for a ``^``-prefixed topic), after
Kafka 4.1's ``GroupMetadataManager``: the coordinator resolves the expression over the
topics that exist, the whole name matching (RE2J's ``matches()``), and the member
subscribes to the topics it resolved to (with its topic names, if it sent any).

Kafka compiles the expression with RE2J; here it runs on RE2 (the same syntax: no
lookaround, no backreferences; linear in the name's length whatever the expression).
One that does not compile, or is longer than :data:`MAX_REGEX_CHARS`, is
INVALID_REGULAR_EXPRESSION (128) with Kafka's message. Pure: no I/O.

>>> sorted(resolve(["a.*"], ["a1", "a2", "b1", "ba"])["a.*"])
['a1', 'a2']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import re2

from kop_dedup.errors import InvalidRegularExpression
from kop_dedup.protocol.transaction_listing import Matcher

__all__ = [
    "MAX_REGEX_CHARS",
    "REFRESH_MIN_INTERVAL_MS",
    "compile_regex",
    "resolve",
    "visible_only",
]

MAX_REGEX_CHARS = 4096
"""The longest expression compiled (a longer one is 128): compiling is linear in it."""

REFRESH_MIN_INTERVAL_MS = 10_000
"""A group's expressions are resolved again on a heartbeat at most this often (Kafka's
``REGEX_BATCH_REFRESH_MIN_INTERVAL_MS``, after which Kafka refreshes once topics were
created): so a topic created later joins the subscriptions within this, plus a heartbeat
interval. An expression no member had before is resolved at once."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a client's bad expression is its answer, not our log
_OPTIONS.max_mem = 256 << 10  # a program past it does not compile (128)


def compile_regex(regex: str) -> Matcher:
    """``regex`` compiled; InvalidRegularExpression (128) as Kafka words it."""
    if len(regex) > MAX_REGEX_CHARS:
        reason = f"longer than {MAX_REGEX_CHARS} characters"
    else:
        try:
            return re2.compile(regex, _OPTIONS)  # type: ignore[no-any-return]
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args else str(exc)
    raise InvalidRegularExpression(
        f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {reason}."
    )


def resolve(regexes: Iterable[str], topics: Iterable[str]) -> dict[str, frozenset[str]]:
    """The topics each of ``regexes`` matches whole (one that does not compile: none;
    Kafka logs and ignores it, as members' expressions were checked when they came)."""
    names = list(topics)
    out: dict[str, frozenset[str]] = {}
    for regex in regexes:
        try:
            matcher = compile_regex(regex)
        except InvalidRegularExpression:
            out[regex] = frozenset()
            continue
        out[regex] = frozenset(n for n in names if matcher.fullmatch(n) is not None)
    return out


def visible_only(
    resolved: Mapping[str, frozenset[str]], allowed: Iterable[str]
) -> dict[str, frozenset[str]]:
    """``resolved`` without the topics not in ``allowed`` (Kafka keeps only the topics
    the member may describe)."""
    keep = frozenset(allowed)
    return {r: ts & keep for r, ts in resolved.items()}
