"""Kafka topic ids (KIP-516) for topics that live in Pulsar: a stable UUID per topic
name, the same on every sidecar and across restarts, with no state to keep.

Metadata (v10+) answers it, and the consumer protocol (KIP-848) names partitions by it:
the Java consumer maps the ids of its assignment back to names through Metadata. Kafka
gives a topic created again after a delete a new id; here a name keeps its id (Pulsar
keeps no creation identity a sidecar could read cheaply), so a client cannot tell a
recreated topic from the old one by its id.

>>> topic_id("orders") == topic_id("orders") != topic_id("payments")
True
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

__all__ = ["by_id", "topic_id"]

_NAMESPACE = uuid.UUID("6b6f702d-6465-6475-702d-746f70696373")
"""A fixed namespace for :func:`uuid.uuid5` ("kop-dedup-topics" in hex)."""


def topic_id(name: str) -> uuid.UUID:
    """The topic's id: ``uuid5`` of its Kafka name (never the zero id)."""
    return uuid.uuid5(_NAMESPACE, name)


def by_id(names: Iterable[str]) -> Mapping[uuid.UUID, str]:
    """Id -> name for ``names`` (to read the ids a client sends back)."""
    return {topic_id(n): n for n in names}
