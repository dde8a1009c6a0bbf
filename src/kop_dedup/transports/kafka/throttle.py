"""Byte-rate quotas on Produce and Fetch, enforced as Kafka enforces them (KIP-219).

Each node measures each role's bytes a second over Kafka's window (11 samples of a
second), produce bytes as the request's record batches, fetch bytes as the answer's.
Past the role's ``producer_byte_rate`` (or ``consumer_byte_rate``; its own quota, else
the default user's, :mod:`kop_dedup.security.client_quotas`) the answer is sent at
once carrying ``throttle_time_ms``, the time for the rate to fall back to the quota,
and the connection reads no further request until it has passed (Kafka mutes the
channel; a client also waits on its side). Like Kafka, each node enforces its quota on
its own: a role served by two nodes may use twice the rate.

Wired in :mod:`.apis` by wrapping the Produce and Fetch handlers::

    APIS = throttled(produce.APIS, PRODUCER_BYTE_RATE, request_bytes)
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from kop_dedup.protocol.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    throttle_ms,
)
from kop_dedup.transports.kafka.registry import Api, Handler, Session

__all__ = ["CONSUMER_BYTE_RATE", "PRODUCER_BYTE_RATE", "answer_bytes", "request_bytes", "throttled"]


def request_bytes(request: Any, _answer: Any) -> int:
    """Produce: the bytes of the request's record batches."""
    return sum(len(p.records or b"") for t in request.topic_data for p in t.partition_data)


def answer_bytes(_request: Any, answer: Any) -> int:
    """Fetch: the bytes of the records answered."""
    if answer is None:
        return 0
    return sum(len(p.records or b"") for t in answer.responses or () for p in t.partitions)


def _throttle(session: Session, key: str, size: int) -> int:
    """Count ``size`` bytes for the caller's role; the throttle time it earned (ms)."""
    quotas = session.runtime.authorizer.client_quotas
    if quotas is None or size <= 0:
        return 0
    role = session.identity.role
    limit = quotas.limit(role, key)
    if limit is None:
        return 0
    rates = session.shared.byte_rates
    now = time.monotonic()
    rate = rates.record((role, key), size, now)
    ms = throttle_ms(rate, limit, rates.window_s((role, key), now))
    if ms > 0:
        session.muted_until = max(session.muted_until, now + ms / 1000)
    return ms


def throttled(apis: tuple[Api, ...], key: str, measure: Any) -> tuple[Api, ...]:
    """``apis`` with handlers that count their bytes (``measure(request, answer)``)
    against the caller's ``key`` quota and throttle past it."""

    def wrap(inner: Handler) -> Handler:
        async def handle(session: Session, request: Any, version: int) -> Any:
            answer = await inner(session, request, version)
            if session.forwarded:  # counted where the client is
                return answer
            ms = _throttle(session, key, measure(request, answer))
            if ms > 0 and answer is not None and hasattr(answer, "throttle_time_ms"):
                answer.throttle_time_ms = ms
            return answer

        return handle

    return tuple(dataclasses.replace(api, handle=wrap(api.handle)) for api in apis)
