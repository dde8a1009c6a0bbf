"""The classic group protocol, spoken with a bare wire client (:class:`WireClient`) to
any target (the reference Kafka broker or the sidecar's listener): a JoinGroup, a
member's two-step join (KIP-394), SyncGroup, Heartbeat, OffsetCommit, DeleteGroups,
OffsetDelete and OffsetFetch, each answering what a conformance scenario compares."""

from __future__ import annotations

import time
from typing import Any

from kafka.protocol.admin import DeleteGroupsRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest

from tests.kafka_wire import WireClient

SESSION_MS = 6000


NOT_READY = (14, 15, 16)  # the coordinator loading, not available, not this broker
READY: set[str] = set()


def ready(c: WireClient, group: str) -> None:
    """Kafka creates its offsets topic at the first FindCoordinator: wait until the
    group's coordinator answers."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = c.call(FindCoordinatorRequest(key=group, key_type=0), 2)
        if answer.error_code == 0 and join(c, group, "", retry=False).error_code not in NOT_READY:
            return
        time.sleep(0.2)
    raise AssertionError(f"no coordinator for {group}")


def join(
    c: WireClient,
    group: str,
    member: str,
    *,
    protocol: str = "range",
    ptype: str = "consumer",
    session_ms: int = SESSION_MS,
    retry: bool = True,
    metadata: bytes = b"\x00",
    instance: str | None = None,
) -> Any:
    if retry and group not in READY:
        ready(c, group)
        READY.add(group)
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name=protocol, metadata=metadata)]
    return c.call(
        JoinGroupRequest(
            group_id=group,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=session_ms,
            member_id=member,
            group_instance_id=instance,
            protocol_type=ptype,
            protocols=protocols,
            reason=None,
        ),
        5,
    )


def member(c: WireClient, group: str, **kw: Any) -> Any:
    """KIP-394's round trip: an id first (79), then the join with it (0)."""
    first = join(c, group, "", **kw)
    assert first.error_code == 79, first
    assert first.member_id
    answer = join(c, group, first.member_id, **kw)
    assert answer.error_code == 0, answer
    return answer


def sync(c: WireClient, group: str, member: str, generation: int, assign: bool = True) -> int:
    a = SyncGroupRequest.SyncGroupRequestAssignment
    return c.call(
        SyncGroupRequest(
            group_id=group,
            generation_id=generation,
            member_id=member,
            group_instance_id=None,
            assignments=[a(member_id=member, assignment=b"x")] if assign else [],
        ),
        3,
    ).error_code


def beat(c: WireClient, group: str, member: str, generation: int) -> int:
    return c.call(
        HeartbeatRequest(
            group_id=group, generation_id=generation, member_id=member, group_instance_id=None
        ),
        3,
    ).error_code


def commit(
    c: WireClient,
    group: str,
    topic: str,
    member: str,
    generation: int,
    partition: int = 0,
    offset: int = 1,
) -> int:
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    return (
        c.call(
            OffsetCommitRequest(
                group_id=group,
                generation_id_or_member_epoch=generation,
                member_id=member,
                group_instance_id=None,
                topics=[
                    t(
                        name=topic,
                        partitions=[
                            t.OffsetCommitRequestPartition(
                                partition_index=partition,
                                committed_offset=offset,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            )
                        ],
                    )
                ],
            ),
            8,
        )
        .topics[0]
        .partitions[0]
        .error_code
    )


def delete_groups(c: WireClient, *groups: str) -> list[int]:
    """DeleteGroups v2: each group's code, in the order asked."""
    answer = c.call(DeleteGroupsRequest(groups_names=list(groups)), 2)
    codes = {r.group_id: r.error_code for r in answer.results}
    return [codes[g] for g in groups]


def offset_delete(c: WireClient, group: str, asked: dict[str, list[int]]) -> Any:
    """OffsetDelete v0: (top-level code, {(topic, partition): code})."""
    t = OffsetDeleteRequest.OffsetDeleteRequestTopic
    answer = c.call(
        OffsetDeleteRequest(
            group_id=group,
            topics=[
                t(
                    name=n,
                    partitions=[t.OffsetDeleteRequestPartition(partition_index=i) for i in ps],
                )
                for n, ps in asked.items()
            ],
        ),
        0,
    )
    return answer.error_code, {
        (tp.name, p.partition_index): p.error_code for tp in answer.topics for p in tp.partitions
    }


def committed(c: WireClient, group: str, topic: str, partitions: int = 1) -> list[int]:
    """OffsetFetch v7: the committed offset of each partition (-1: none)."""
    t = OffsetFetchRequest.OffsetFetchRequestTopic
    answer = c.call(
        OffsetFetchRequest(
            group_id=group,
            topics=[t(name=topic, partition_indexes=list(range(partitions)))],
            require_stable=False,
        ),
        7,
    )
    assert answer.error_code == 0, answer
    return [p.committed_offset for p in answer.topics[0].partitions]
