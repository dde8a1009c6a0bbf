"""Server-side resets (RocketMQ's RIP-48): a reset's target is resolved when it is asked
for, stored durably with an epoch above every one before on the partition, and applied
by each member it targets at its next pull (:mod:`.pulls`), whichever sidecar serves
it. A partition keeps every reset that still targets someone
(:class:`~kop_dedup.protocol.groups.Resets`): a second reset of a broadcast partition
for some members leaves an earlier one pending for the others.

A Kafka group (client-side assignment: its members never pull here, they fetch their
committed offsets after each rebalance) gets the reset as its committed offsets, in
the same change, and, when it has members, a forced rebalance that fences the
generation they read under (:meth:`.classic.ClassicGroups.reset_offsets`): each member
is answered ILLEGAL_GENERATION (22) at its next heartbeat or commit, rejoins, and
starts from the reset after the rebalance; a commit of its pre-reset position is
refused. Kafka itself only resets a group with no active member
(``kafka-consumer-groups --reset-offsets``); this resets one while it runs.
"""

from __future__ import annotations

from kop_dedup import errors
from kop_dedup.clock import now_ms
from kop_dedup.coordination.groups.access import CoordinatorAccess
from kop_dedup.coordination.groups.api import (
    ResetRequest,
    ResetStatus,
    ResolvedReset,
    UnknownGroup,
)
from kop_dedup.coordination.groups.store import key
from kop_dedup.protocol.groups import Mode, Reset
from kop_dedup.pulsar.message_ids import encode_message_position
from kop_dedup.pulsar.naming import validate_topic

__all__ = ["GroupResets"]


class GroupResets:
    def __init__(self, groups: CoordinatorAccess) -> None:
        self._groups = groups

    async def reset(self, group_id: str, request: ResetRequest) -> list[ResolvedReset]:
        """Resolve the target now, store it durably with a higher epoch; each member's
        next pull starts there (a pull in flight meanwhile plans again)."""
        groups = self._groups
        validate_topic(request.topic)
        if request.to in {"timestamp", "offset"} and request.value is None:
            raise errors.InvalidRequest(f"to={request.to} needs a value")
        count = await groups.partitions_of(request.topic)
        partitions = request.partitions if request.partitions is not None else tuple(range(count))
        for part in partitions:
            if not 0 <= part < count:
                raise errors.InvalidRequest(
                    f"topic {request.topic!r} has partitions 0..{count - 1}; got {part}"
                )
        resolved = [await self._target(request, part) for part in dict.fromkeys(partitions)]

        async def change(p: int) -> list[ResolvedReset]:
            state = groups.state(group_id)
            kafka = groups.classic.is_kafka(group_id)
            if request.members is not None and (kafka or state.mode is not Mode.BROADCAST):
                raise errors.InvalidRequest(
                    f"group {group_id!r} is a {'Kafka' if kafka else 'clustering'} group: a "
                    "partition has one reader, whichever member it is; members is for "
                    "broadcast groups"
                )
            applied_at, fenced_below = "pull", None
            if kafka:
                fenced = await groups.classic.reset_offsets(p, group_id, resolved)
                if fenced is not None and fenced.members:
                    applied_at, fenced_below = "rebalance", fenced.min_generation
                else:
                    applied_at = "committed"
            elif await groups.consumer.reset_offsets(p, group_id, resolved):  # KIP-848
                applied_at = "committed"
            now = now_ms()
            out = []
            for r in resolved:
                tp = (r.topic, r.partition)
                resets = state.resets.get(tp) or groups.resets_of(group_id, tp)
                applied = [d.reset_epoch for (_, at), d in state.deliveries.items() if at == tp]
                reset = Reset(
                    resets.next_epoch(applied),
                    r.offset,
                    r.position,
                    request.to,
                    request.value,
                    request.members,
                    now,
                )
                await groups.store.write(
                    p, key("r", group_id, r.topic, r.partition), resets.added(reset).to_doc()
                )
                out.append(
                    ResolvedReset(
                        r.topic,
                        r.partition,
                        r.offset,
                        r.position,
                        r.clamped,
                        r.clamped_to,
                        reset.epoch,
                        applied_at,
                        fenced_below,
                    )
                )
            return out

        result: list[ResolvedReset] = await groups.store.owned(group_id, change)
        return result

    async def _target(self, request: ResetRequest, part: int) -> ResolvedReset:
        """A reset's target on one partition, resolved now. A timestamp before the
        earliest message or after the last is clamped to them (``clamped_to`` says
        which); an offset outside [earliest, end] is refused."""
        positions = self._groups.positions
        topic = self._groups.partition_topic((request.topic, part))
        clamped: str | None = None
        if request.to == "earliest":
            offset, position = await positions.earliest(topic)
        elif request.to == "latest":  # the last stable offset: no transaction in part
            offset, position = await self._groups.stable.exact_at(request.topic, part)
        elif request.to == "timestamp":
            offset, position, clamped = await positions.at_time(topic, request.value or 0)
        elif request.to == "offset":
            offset = request.value or 0
            position = await positions.locate(topic, offset)
        else:
            raise errors.InvalidRequest(
                f"to must be earliest, latest, timestamp or offset, not {request.to!r}"
            )
        return ResolvedReset(
            request.topic,
            part,
            offset,
            None if position is None else encode_message_position(position),
            clamped is not None,
            clamped,
        )

    async def status(self, group_id: str) -> list[ResetStatus]:
        """Each reset kept and, per member it applies to, whether it has been applied
        (members that are gone included, in broadcast mode: they apply it when they
        come back; members a later reset targets are not listed under an earlier one).
        UnknownGroup when nothing of the group is stored."""
        groups = self._groups
        await groups.read(group_id)
        state = groups.state(group_id)
        if not state.stored:
            raise UnknownGroup(f"no group {group_id!r}")
        group = state.group
        live = set() if group is None else set(group.members)
        kafka = groups.classic.group(group_id)
        out = []
        for tp, resets in sorted(state.resets.items()):
            known = live | {m for (m, at) in state.member_offsets if at == tp}
            known |= {m for (m, at) in state.deliveries if at == tp and m}
            for reset in resets.entries:
                status = {}
                if kafka is not None:  # applied once the rebalance the reset forced is done
                    done = kafka.generation >= kafka.min_generation
                    status = dict.fromkeys(sorted(kafka.members), "applied" if done else "pending")
                elif state.mode is Mode.CLUSTERING:
                    applied = state.delivery("", tp).reset_epoch >= reset.epoch
                    for m in sorted(live):
                        if group is not None and tp in group.assigned(m):
                            status[m] = "applied" if applied else "pending"
                else:
                    for m in sorted(reset.members or known):
                        if resets.superseded_for(reset, m):
                            continue
                        applied = state.delivery(m, tp).reset_epoch >= reset.epoch
                        status[m] = "applied" if applied else "pending"
                out.append(
                    ResetStatus(
                        tp[0],
                        tp[1],
                        reset.epoch,
                        reset.offset,
                        reset.to,
                        reset.value,
                        reset.at_ms,
                        status,
                    )
                )
        return out
