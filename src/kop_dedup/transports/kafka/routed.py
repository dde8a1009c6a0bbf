"""Every Kafka request goes through :func:`handle`: authorized first
(:mod:`.authorize`), then a coordinator's API asked of a node
that does not coordinate the key it names is refused there (cluster mode: 16
NOT_COORDINATOR, so that the client finds the coordinator again) or forwarded to the
coordinator (sidecar mode: the client can reach no other node), before its handler
runs; what the API does where its client is (``Api.after_forward``: InitProducerId
gives the producer id to the caller's role) is done before the answer goes back. A
request another node forwarded is served where it lands.

Partition-level routing (Produce, Fetch, ListOffsets: 6 NOT_LEADER_OR_FOLLOWER) is the
handlers' own, since one request names partitions of several leaders.
"""

from __future__ import annotations

from typing import Any

from kop_dedup import errors
from kop_dedup.cluster.peers import PeerUnavailable
from kop_dedup.transports.kafka import topology
from kop_dedup.transports.kafka.authorize import authorize
from kop_dedup.transports.kafka.forward import forward
from kop_dedup.transports.kafka.registry import Api, Session

__all__ = ["group_key", "handle", "txn_key"]


def group_key(request: Any, _version: int) -> tuple[int, str] | None:
    """A request naming one group (``group_id``)."""
    group = getattr(request, "group_id", None)
    return None if not group else (0, str(group))


def txn_key(request: Any, _version: int) -> tuple[int, str] | None:
    """A request naming a transactional id (none: any node serves it)."""
    tid = getattr(request, "transactional_id", None)
    return None if not tid else (1, str(tid))


async def handle(session: Session, api: Api, request: Any, version: int) -> Any:
    """Run ``api``'s handler here, or refuse/forward a coordinator request this node does
    not coordinate (see the module docstring)."""
    await authorize(session, api.key, request, version)
    if api.coordinator_key is None or session.forwarded or request is None:
        return await api.handle(session, request, version)
    key = api.coordinator_key(request, version)
    if key is None:
        return await api.handle(session, request, version)
    kind, name = key
    cluster = session.runtime.cluster
    if cluster.mode == "sidecar" and cluster.membership.joined and api.response is not None:
        owner = cluster.group_coordinator(name) if kind == 0 else cluster.txn_coordinator(name)
        if owner is None or cluster.is_me(owner):
            return await api.handle(session, request, version)
        try:
            answer = await forward(session, owner, api.response, api.key, version, request)
        except PeerUnavailable as exc:
            cluster.stats.forward_failures += 1
            raise errors.CoordinatorNotAvailable(
                f"the coordinator of {name!r}, node {owner.node_id}, could not be reached "
                f"({exc}); retry"
            ) from exc
        if api.after_forward is not None and answer is not None:
            await api.after_forward(session, answer)
        return answer
    refused = topology.not_coordinator(session, kind, name)
    if refused is not None:
        raise refused
    return await api.handle(session, request, version)
