"""The names clients choose, checked before anything stores them or builds a URL.

Topics follow Kafka's rules (:func:`~kop_dedup.pulsar.naming.validate_topic`: 1-249
characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``, plus the mapping's reserved
``-partition-``), so ``..``, ``/`` and ``%`` never reach a Pulsar admin path. Group
and transactional ids may be any non-empty text, as in Kafka (control characters
included: the metrics escape them, the JSON logs quote them); here they are bounded at
:data:`MAX_ID_LENGTH` characters (they are stored as keys and held in memory).

>>> validate_topics(["orders", "../../acme/pay/ledger"])
Traceback (most recent call last):
InvalidTopic: ...
>>> validate_group_id("payments")
"""

from __future__ import annotations

from collections.abc import Iterable

from kop_dedup import errors
from kop_dedup.pulsar.naming import validate_topic

__all__ = ["MAX_ID_LENGTH", "validate_group_id", "validate_topics", "validate_transactional_id"]

MAX_ID_LENGTH = 4096


def validate_topics(topics: Iterable[str]) -> None:
    """InvalidTopic (17) for the first name Kafka (or the mapping) refuses."""
    for topic in topics:
        validate_topic(topic)


def _problem(kind: str, value: str) -> str | None:
    if not value:
        return f"{kind} must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"{kind} is {len(value)} characters; at most {MAX_ID_LENGTH}"
    return None


def validate_group_id(group_id: str) -> None:
    """INVALID_GROUP_ID (24) for an empty or overlong group id."""
    problem = _problem("a group id", group_id)
    if problem is not None:
        raise errors.InvalidGroupId(problem)


def validate_transactional_id(transactional_id: str) -> None:
    """INVALID_REQUEST (42, as Kafka answers an empty one) for an empty or overlong
    transactional id."""
    problem = _problem("a transactional id", transactional_id)
    if problem is not None:
        raise errors.InvalidRequest(problem)
