"""The consumer-groups store as the transaction coordinator uses it, on the node that
coordinates each group.

A transaction's offsets are staged (pending markers, so that a stable OffsetFetch
answers UNSTABLE_OFFSET_COMMIT meanwhile) and, once it is decided, committed or
removed in the group's store partition, which only the group's coordinator writes.
:class:`RoutedOffsets` calls the local store when this node coordinates the group and
the coordinator's ``/internal/v1/groups/offsets`` otherwise (Kafka's WriteTxnMarkers to
the ``__consumer_offsets`` leader). A Kafka error the coordinator raised is raised
again here, with its code; a coordinator that cannot be reached is
COORDINATOR_NOT_AVAILABLE (retriable: the apply loop and the clients retry).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kop_dedup import errors
from kop_dedup.cluster.ownership import Cluster
from kop_dedup.cluster.peers import Peers, PeerUnavailable
from kop_dedup.cluster.placement import Member
from kop_dedup.coordination.groups.offsets import StagedOffset
from kop_dedup.coordination.groups.store import GroupStore

__all__ = ["CALL", "RoutedOffsets", "serve"]

CALL = "groups/offsets"
"""The internal call's name (``POST /internal/v1/groups/offsets``)."""


def _staged(o: StagedOffset) -> dict[str, Any]:
    return {
        "topic": o.topic,
        "partition": o.partition,
        "offset": o.offset,
        "metadata": o.metadata,
        "position": o.position,
    }


def _unstaged(d: dict[str, Any]) -> StagedOffset:
    return StagedOffset(
        str(d["topic"]),
        int(d["partition"]),
        int(d["offset"]),
        str(d.get("metadata") or ""),
        d.get("position"),
    )


class RoutedOffsets:
    def __init__(self, store: GroupStore, cluster: Cluster, peers: Peers) -> None:
        self._store, self._cluster, self._peers = store, cluster, peers

    def _remote(self, group: str) -> Member | None:
        cluster = self._cluster
        if not cluster.membership.joined:
            return None
        owner = cluster.group_coordinator(group)
        return None if owner is None or cluster.is_me(owner) else owner

    async def _call(self, owner: Member, payload: dict[str, Any]) -> Any:
        try:
            answer = await self._peers.call(owner, CALL, payload)
        except PeerUnavailable as exc:
            self._cluster.stats.forward_failures += 1
            raise errors.CoordinatorNotAvailable(
                f"the coordinator of group {payload['group']!r}, node {owner.node_id}, could "
                f"not be reached ({exc}); retry"
            ) from exc
        self._cluster.stats.forwarded += 1
        code = int(answer.get("errorCode", 0))
        if code:
            raise errors.error_for_code(code)(str(answer.get("errorMessage") or ""))
        return answer.get("result")

    async def mark_pending(
        self,
        group: str,
        keys: Iterable[tuple[str, int]],
        transactional_id: str,
        ordinal: int,
        *,
        member_id: str | None = None,
        generation: int | None = None,
        instance_id: str | None = None,
    ) -> None:
        owner = self._remote(group)
        if owner is None:
            await self._store.mark_pending(
                group,
                keys,
                transactional_id,
                ordinal,
                member_id=member_id,
                generation=generation,
                instance_id=instance_id,
            )
            return
        await self._call(
            owner,
            {
                "op": "mark",
                "group": group,
                "keys": [list(k) for k in keys],
                "transactionalId": transactional_id,
                "ordinal": ordinal,
                "memberId": member_id,
                "generation": generation,
                "instanceId": instance_id,
            },
        )

    async def commit_transaction(
        self, group: str, transactional_id: str, ordinal: int, offsets: Iterable[StagedOffset]
    ) -> list[StagedOffset]:
        owner = self._remote(group)
        if owner is None:
            return await self._store.commit_transaction(group, transactional_id, ordinal, offsets)
        result = await self._call(
            owner,
            {
                "op": "commit",
                "group": group,
                "transactionalId": transactional_id,
                "ordinal": ordinal,
                "offsets": [_staged(o) for o in offsets],
            },
        )
        return [_unstaged(d) for d in result or []]

    async def abort_transaction(
        self, group: str, keys: Iterable[tuple[str, int]], transactional_id: str, ordinal: int
    ) -> None:
        owner = self._remote(group)
        if owner is None:
            await self._store.abort_transaction(group, keys, transactional_id, ordinal)
            return
        await self._call(
            owner,
            {
                "op": "abort",
                "group": group,
                "keys": [list(k) for k in keys],
                "transactionalId": transactional_id,
                "ordinal": ordinal,
            },
        )


async def serve(store: GroupStore, payload: dict[str, Any]) -> dict[str, Any]:
    """The owner's side of a call (its JSON answer): the store's own method, here."""
    group, tid = str(payload["group"]), str(payload["transactionalId"])
    ordinal = int(payload["ordinal"])
    keys = [(str(t), int(p)) for t, p in payload.get("keys", [])]
    try:
        op = payload["op"]
        if op == "mark":
            member, generation = payload.get("memberId"), payload.get("generation")
            instance = payload.get("instanceId")
            await store.mark_pending(
                group,
                keys,
                tid,
                ordinal,
                member_id=None if member is None else str(member),
                generation=None if generation is None else int(generation),
                instance_id=None if instance is None else str(instance),
            )
            return {"errorCode": 0}
        if op == "commit":
            staged = [_unstaged(d) for d in payload.get("offsets", [])]
            done = await store.commit_transaction(group, tid, ordinal, staged)
            return {"errorCode": 0, "result": [_staged(o) for o in done]}
        if op == "abort":
            await store.abort_transaction(group, keys, tid, ordinal)
            return {"errorCode": 0}
        raise errors.InvalidRequest(f"unknown groups/offsets operation {op!r}")
    except errors.KafkaError as exc:
        return {"errorCode": exc.errno, "errorMessage": exc.message}
