"""Create a partitioned topic through the Pulsar admin API, for the tools and tests.

>>> create_topic("http://127.0.0.1:8080", "orders", partitions=2)

Idempotent: a topic that already exists (409) is fine, whatever its partition count.
The sidecar would create a missing topic itself (with its default partition count); the
tools create theirs first so the count is theirs.
"""

from __future__ import annotations

import httpx

__all__ = ["TopicError", "create_topic"]


class TopicError(RuntimeError):
    """The admin API refused to create the topic (or did not answer); the message says
    which topic, where, and what the broker said."""


def create_topic(
    admin_url: str,
    topic: str,
    *,
    partitions: int = 1,
    namespace: str = "public/kafka",
    client: httpx.Client | None = None,
    timeout: float = 30.0,
) -> None:
    """PUT ``/admin/v2/persistent/<namespace>/<topic>/partitions`` with ``partitions``.

    ``topic`` is the short (Kafka) name; ``client`` is for tests (any httpx transport).
    """
    url = f"{admin_url.rstrip('/')}/admin/v2/persistent/{namespace}/{topic}/partitions"
    try:
        if client is None:
            r = httpx.put(url, json=partitions, timeout=timeout)
        else:
            r = client.put(url, json=partitions, timeout=timeout)
    except httpx.HTTPError as exc:
        raise TopicError(
            f"creating {namespace}/{topic}: no answer from {admin_url} "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if r.status_code not in (204, 409):
        raise TopicError(
            f"creating {namespace}/{topic} with {partitions} partitions at {admin_url}: "
            f"{r.status_code} {r.text.strip()}"
        )
