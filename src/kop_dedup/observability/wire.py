"""Counters of the Kafka wire listener, for ``/metrics``.

Labels are bounded by construction: ``api`` is a name from the listener's own table
(``~unknown`` for any other key), ``error`` a name from :mod:`kop_dedup.errors` (an
answer never carries another code), ``reason`` one of :data:`CLOSE_REASONS`.

>>> stats = WireStats()
>>> stats.answered("Metadata", [0, 3])
>>> stats.requests[("Metadata", "UNKNOWN_TOPIC_OR_PARTITION")]
1
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kop_dedup import errors
from kop_dedup.observability.metrics import Counter

__all__ = ["CLOSE_REASONS", "UNKNOWN_API", "WireStats"]

UNKNOWN_API = "~unknown"
CLOSE_REASONS = (
    "client",  # the client closed it (or the network broke)
    "oversized",  # a frame over KAFKA_MAX_REQUEST_BYTES
    "malformed",  # a header or body that does not parse
    "unsupported",  # an unknown API key, or a version not served
    "auth",  # SASL refused, a request before authentication, or its credential ended
    "acks0_error",  # a Produce with acks=0 that failed (Kafka closes to tell the client)
    "shutdown",  # the sidecar stopped
    "idle",  # no request for too long
    "timeout",  # a request begun and not complete within KAFKA_REQUEST_READ_TIMEOUT_MS
    "limit",  # over KAFKA_MAX_CONNECTIONS or KAFKA_MAX_CONNECTIONS_PER_ADDRESS
)


def _error_name(code: int) -> str:
    return errors.NONE_NAME if code == errors.NONE_ERRNO else errors.error_for_code(code).name


@dataclass(slots=True)
class WireStats:
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    """(api, error name) -> requests whose answer carried that code (a request counts
    once for each distinct code it carried; an answer with none counts as NONE)."""
    closed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLOSE_REASONS, 0))
    open_connections: int = 0
    opened: int = 0

    def answered(self, api: str, codes: Iterable[int]) -> None:
        names = {_error_name(c) for c in codes} or {errors.NONE_NAME}
        for name in names:
            key = (api, name)
            self.requests[key] = self.requests.get(key, 0) + 1

    def connection_opened(self) -> None:
        self.opened += 1
        self.open_connections += 1

    def connection_closed(self, reason: str) -> None:
        self.open_connections -= 1
        self.closed[reason if reason in self.closed else "client"] += 1

    def counters(self) -> list[Counter]:
        requests: list[tuple[Mapping[str, str], float]] = [
            ({"api": api, "error": error}, n) for (api, error), n in sorted(self.requests.items())
        ]
        closed: list[tuple[Mapping[str, str], float]] = [
            ({"reason": r}, n) for r, n in self.closed.items()
        ]
        return [
            (
                "kafka_requests_total",
                "Kafka wire requests answered, by API and the error codes their answers carried.",
                requests,
            ),
            ("kafka_connections_closed_total", "Kafka client connections closed, by why.", closed),
            (
                "kafka_connections_opened_total",
                "Kafka client connections accepted.",
                [({}, self.opened)],
            ),
        ]
