"""Sending a Kafka request (or the part of one) to the node that owns what it names.

The request is encoded at the client's version and handled by the owner's own Kafka
handlers (``POST /internal/v1/kafka``, :mod:`kop_dedup.transports.http.internal`); its
response, at the same version, comes back decoded. An owner that cannot be reached is
a :class:`~kop_dedup.cluster.peers.PeerUnavailable` for the handler to answer with its
retriable code.

>>> answer = await forward(session, owner, ProduceResponse, 0, 9, request)
"""

from __future__ import annotations

from typing import Any

from kop_dedup.cluster.placement import Member
from kop_dedup.transports.kafka.registry import Session

__all__ = ["forward"]


async def forward(
    session: Session, owner: Member, response: Any, api_key: int, version: int, request: Any
) -> Any:
    """``request`` (a kafka-python request at ``version``) answered by ``owner``; None
    when the request gets no answer (Produce with acks=0)."""
    runtime = session.runtime
    request.with_header(client_id=session.client_id)  # a decoded request carries none
    body = bytes(request.encode(version=version))
    answer = await runtime.peers.kafka(owner, api_key, version, session.client_id, body)
    runtime.cluster.stats.forwarded += 1
    if not answer:
        return None
    decoded = response.decode(memoryview(answer), version=version)
    decoded._header = None  # a decoded message has no such slot; the connection sets it
    return decoded
