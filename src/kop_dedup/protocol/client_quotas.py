"""Kafka's client quotas over roles: what DescribeClientQuotas and AlterClientQuotas
mean here, and the byte-rate throttle, as pure data and arithmetic.

A quota entity is one Kafka ``user`` (a role; ``None`` names the default user, which
applies to every role without its own); its values are ``producer_byte_rate`` and
``consumer_byte_rate`` (bytes a second, per node, as in Kafka where each broker
enforces them on its own). Client-id and ip entities, and Kafka's other keys
(``request_percentage``, ``controller_mutation_rate``, ``connection_creation_rate``)
are refused with Kafka's INVALID_REQUEST and a message saying so. Validation gives
the reference broker's own codes and messages (checked against Kafka 4.1).

>>> check_alteration([("user", "alice")], [("producer_byte_rate", 1048576.0, False)])
>>> check_alteration([("user", "alice")], [("producer_byte_rate", 1.5, False)])
'producer_byte_rate cannot be a fractional value.'
>>> throttle_ms(rate=2048.0, quota=1024.0, window_s=10.0)
10000
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kop_dedup import errors

__all__ = [
    "CONSUMER_BYTE_RATE",
    "KEYS",
    "PRODUCER_BYTE_RATE",
    "USER",
    "ByteRate",
    "Filter",
    "check_alteration",
    "check_filter",
    "entity_text",
    "matches",
    "throttle_ms",
    "values_of",
]

USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
_KAFKA_ONLY_KEYS = ("request_percentage", "controller_mutation_rate", "connection_creation_rate")
_MATCH_EXACT, _MATCH_DEFAULT, _MATCH_SPECIFIED = 0, 1, 2

WINDOW_SAMPLES, SAMPLE_S = 11, 1.0
"""Kafka's ``quota.window.num`` and ``quota.window.size.seconds``."""


def entity_text(user: str | None) -> str:
    """How Kafka names the entity in its messages: ``ClientQuotaEntity(entries={user=x})``."""
    return f"ClientQuotaEntity(entries={{user={'null' if user is None else user}}})"


def _entity_problem(entity: Sequence[tuple[str, str | None]]) -> str | None:
    if not entity:
        return "Invalid empty client quota entity"
    for kind, name in entity:
        if kind not in (USER, CLIENT_ID, IP):
            return f"Unhandled client quota entity type: {kind}"
        if kind == USER and name == "":
            return "Empty user not supported"
    kinds = [kind for kind, _ in entity]
    if kinds != [USER]:
        return (
            f"quotas are kept per user (a role) only; an entity of {', '.join(kinds)} "
            "is not served here"
        )
    return None


def _op_problem(key: str, value: float, remove: bool) -> str | None:
    if key in _KAFKA_ONLY_KEYS:
        return f"quota {key} is not served here (only {', '.join(KEYS)})"
    if key not in KEYS:
        return f"Invalid configuration key {key}"
    if remove:
        return None
    if not value > 0:
        return f"Quota {key} must be greater than 0"
    if not math.isfinite(value) or value != int(value):
        return f"{key} cannot be a fractional value."
    return None


def check_alteration(
    entity: Sequence[tuple[str, str | None]], ops: Sequence[tuple[str, float, bool]]
) -> str | None:
    """Why Kafka (or this mapping) refuses an AlterClientQuotas entry, as its
    INVALID_REQUEST message; None when it is valid."""
    problem = _entity_problem(entity)
    seen: set[str] = set()
    for key, value, remove in ops:
        if problem is not None:
            break
        if key in seen:
            return f"Ignoring duplicate entity {entity_text(entity[0][1])}"
        seen.add(key)
        problem = _op_problem(key, value, remove)
    return problem


@dataclass(frozen=True, slots=True)
class Filter:
    """A DescribeClientQuotas filter on the user component: ``exact`` (True: only
    ``name``, None being the default), else any user; ``strict``: no other components."""

    exact: bool = False
    name: str | None = None
    any_user: bool = True
    strict: bool = False


def _component(kind: str, match_type: int, match: str | None) -> None:
    if kind not in (USER, CLIENT_ID, IP):
        raise errors.UnsupportedVersion(f"Unsupported entity type {kind}")
    if match_type == _MATCH_EXACT and match is None:
        raise errors.InvalidRequest(
            "Request specified MATCH_TYPE_EXACT, but set match string to null."
        )
    if match_type == _MATCH_DEFAULT and match is not None:
        raise errors.InvalidRequest(
            "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
        )
    if match_type == _MATCH_SPECIFIED and match is not None:
        raise errors.InvalidRequest(
            "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
        )
    if match_type not in (_MATCH_EXACT, _MATCH_DEFAULT, _MATCH_SPECIFIED):
        raise errors.UnsupportedVersion(f"Unknown match type {match_type}")


def check_filter(components: Iterable[tuple[str, int, str | None]], strict: bool) -> Filter:
    """The filter of a DescribeClientQuotas request; INVALID_REQUEST (42) or
    UNSUPPORTED_VERSION (35) as Kafka answers a malformed one."""
    seen: dict[str, tuple[int, str | None]] = {}
    for kind, match_type, match in components:
        if not kind:
            raise errors.InvalidRequest("Invalid empty entity type.")
        if kind in seen:
            raise errors.InvalidRequest(
                f"Entity type {kind} cannot appear more than once in the filter."
            )
        _component(kind, match_type, match)
        seen[kind] = (match_type, match)
    if IP in seen and (USER in seen or CLIENT_ID in seen):
        raise errors.InvalidRequest(
            "Invalid entity filter component combination. IP filter component should not "
            "be used with user or clientId filter component."
        )
    if CLIENT_ID in seen or IP in seen:  # every entity here is a user alone
        return Filter(any_user=False)
    if USER not in seen:
        return Filter(any_user=not strict, strict=strict)
    match_type, match = seen[USER]
    if match_type == _MATCH_SPECIFIED:
        return Filter(strict=strict)
    return Filter(exact=True, name=match, strict=strict)


def matches(flt: Filter, user: str | None) -> bool:
    """Whether the user entity ``user`` (None: the default) passes ``flt``."""
    if not flt.any_user:
        return False
    return not flt.exact or flt.name == user


def throttle_ms(rate: float, quota: float, window_s: float) -> int:
    """Kafka's throttle time (``ClientQuotaManager.throttleTime``): how long the client
    must wait for its rate over the window to fall back to the quota, at most the whole
    window of samples."""
    if rate <= quota:
        return 0
    wait = (rate - quota) / quota * window_s
    return int(min(wait, WINDOW_SAMPLES * SAMPLE_S) * 1000)


@dataclass(slots=True)
class ByteRate:
    """Bytes a second over Kafka's window (``WINDOW_SAMPLES`` samples of ``SAMPLE_S``),
    per key (a role and a quota key), as Kafka's ``Rate`` measures: the window is
    the elapsed time since the oldest sample, at least all samples but one."""

    samples: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)

    def record(self, key: tuple[str, str], size: float, now: float | None = None) -> float:
        """Count ``size`` bytes for ``key``; its rate now (bytes a second)."""
        now = time.monotonic() if now is None else now
        kept = self.samples.setdefault(key, [])
        start = now - now % SAMPLE_S
        if kept and kept[-1][0] == start:
            kept[-1] = (start, kept[-1][1] + size)
        else:
            kept.append((start, size))
        oldest = now - WINDOW_SAMPLES * SAMPLE_S
        while kept and kept[0][0] + SAMPLE_S <= oldest:
            kept.pop(0)
        return sum(s for _, s in kept) / self.window_s(key, now)

    def window_s(self, key: tuple[str, str], now: float) -> float:
        kept = self.samples.get(key)
        elapsed = now - kept[0][0] if kept else 0.0
        return max(elapsed, (WINDOW_SAMPLES - 1) * SAMPLE_S)


def values_of(mapping: Mapping[str, object]) -> dict[str, float]:
    """Only the served keys of a stored mapping, with a number as their value."""
    return {
        k: float(v)
        for k, v in mapping.items()
        if k in KEYS and isinstance(v, int | float) and not isinstance(v, bool)
    }
