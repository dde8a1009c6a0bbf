"""Being listed on a topic: a consumer that receives nothing and carries properties, so
that the topic's stats name every live holder (what cluster membership is built on)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulsar

from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["be_listed"]


async def be_listed(
    client: PulsarClient,
    topic: str,
    subscription: str,
    name: str,
    properties: Mapping[str, str],
) -> Any:
    """A consumer named ``name`` on ``topic``'s Shared subscription ``subscription``,
    listed in the topic's stats with ``properties`` for as long as its connection lives
    (close it with :func:`kop_dedup.pulsar.tables.discard`)."""
    return await client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        consumer_name=name,
        properties=dict(properties),
        receiver_queue_size=1,
    )
