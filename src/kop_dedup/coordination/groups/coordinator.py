"""The group coordinator: membership, pulls, commits, server-side resets and lag, with
all state in the group store (so any sidecar serves any member of any group).

A change to a group runs on the owner of its store partition (taken on demand);
reads catch up with the store first. A pull is planned as the owner (where each
assigned partition stands, resets applied), reads outside the lock (long poll), and
records the new delivery position as the owner again, after checking nothing moved
meanwhile (a rebalance, a reset, another pull): only then are the records answered.
What was answered but not committed comes again when the member rejoins, misses its
session or its partition moves, and after a crash: the delivery position goes back to
the committed offset then.

Offsets are Kafka-style integers from the broker's entry index
(:mod:`kop_dedup.pulsar.positions`); each is kept with its Pulsar position when known,
so a pull starts reading without a lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.groups.store import Doc, GroupStore, key
from kop_dedup.protocol import groups as proto
from kop_dedup.protocol.groups import AutoReset, GroupConfig, Member, Mode, Start
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.naming import Naming, validate_topic
from kop_dedup.pulsar.positions import Position, Positions, decode_position, encode_position
from kop_dedup.pulsar.reading import PartitionReader, Pulled, after
from kop_dedup.pulsar.tables import PulsarClient

__all__ = ["GroupCoordinator", "GroupSettings", "PullResult", "ResetRequest", "StaleMember"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_POLL_S = 0.02
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def _now_ms() -> int:
    return int(time.time() * 1000)


class StaleMember(errors.KafkaError):
    """A commit or call from a member the group moved on from (HTTP 409); ``error`` is
    Kafka's code for it (22 ILLEGAL_GENERATION or 25 UNKNOWN_MEMBER_ID)."""

    def __init__(self, error: errors.KafkaError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, slots=True)
class GroupSettings:
    cursor_interval_s: float = 5.0
    sweep_interval_s: float = 1.0
    reader_idle_s: float = 60.0
    default_session_timeout_ms: int = 30_000
    default_broadcast_expire_ms: int = 120_000
    max_pull_records: int = 10_000
    max_wait_ms: int = 60_000


@dataclass(frozen=True, slots=True)
class ResetRequest:
    topic: str
    to: str
    """earliest, latest, timestamp or offset"""
    value: int | None = None
    partitions: tuple[int, ...] | None = None
    members: tuple[str, ...] | None = None


@dataclass(slots=True)
class PullResult:
    records: list[tuple[TopicPartition, Pulled]]
    generation: int
    assignment: list[TopicPartition]
    resets_applied: list[dict[str, Any]] = field(default_factory=list)
    clamped: list[dict[str, Any]] = field(default_factory=list)
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Plan:
    tp: TopicPartition
    offset: int
    position: Position | None
    reset_epoch: int
    version: int
    """The delivery doc's version when planned (0: none): a pull that finds it moved
    since answers nothing."""
    start: Start
    reset: dict[str, Any] | None = None


@dataclass(slots=True)
class _Reader:
    reader: PartitionReader
    last_used: float


def _config(doc: Doc) -> GroupConfig:
    return GroupConfig(
        Mode(doc["mode"]),
        AutoReset(doc["autoOffsetReset"]),
        int(doc["sessionTimeoutMs"]),
        int(doc["broadcastExpireMs"]),
    )


def _members(doc: Doc) -> dict[str, Member]:
    return {
        m: Member(m, tuple(d["topics"]), int(d["joinedMs"]), int(d["lastSeenMs"]))
        for m, d in doc.get("members", {}).items()
    }


def _assignment(doc: Doc, member: str) -> list[TopicPartition]:
    return [(t, int(p)) for t, p in doc.get("assignment", {}).get(member, [])]


def subscription_name(group: str) -> str:
    """The durable Pulsar subscription that follows a group's committed offsets."""
    if _SAFE_NAME.match(group):
        return f"kop-group-{group}"
    return f"kop-group-{hashlib.sha1(group.encode()).hexdigest()[:16]}"  # noqa: S324 - a name


class GroupCoordinator:
    def __init__(
        self,
        store: GroupStore,
        client: PulsarClient,
        admin: PulsarAdmin,
        naming: Naming,
        *,
        partitions_of: Callable[[str], Awaitable[int]],
        settings: GroupSettings,
    ) -> None:
        self.store, self._client, self._admin, self._naming = store, client, admin, naming
        self.positions = Positions(admin)
        self._partitions_of = partitions_of
        self.settings = settings
        self._readers: dict[tuple[str, str, TopicPartition], _Reader] = {}
        self._member_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._cursor_moved: dict[tuple[str, TopicPartition], str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        store.on_acquired(self._acquired)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(
                self._every(self.settings.sweep_interval_s, self.sweep), name="group-sweeper"
            ),
            asyncio.create_task(
                self._every(self.settings.cursor_interval_s, self.follow_cursors),
                name="group-cursors",
            ),
        ]

    async def close(self) -> None:
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for entry in list(self._readers.values()):
            await entry.reader.close()
        self._readers.clear()

    async def _every(self, interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
        while not self._closing:
            await asyncio.sleep(interval_s)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("group job %s failed: %r", getattr(job, "__name__", job), exc)

    async def _acquired(self, _partition: int) -> None:
        return  # sessions are swept and cursors followed on owned partitions by the loops

    def _ptopic(self, tp: TopicPartition) -> str:
        return self._naming.partition_topic(tp[0], tp[1])

    # -- configuration ------------------------------------------------------------------------

    async def configure(
        self,
        group: str,
        *,
        mode: Mode | None,
        auto_offset_reset: AutoReset | None,
        session_timeout_ms: int | None,
        broadcast_expire_ms: int | None,
    ) -> Doc:
        """Create or update a group (PUT). The mode of a group with members is fixed."""

        async def change(p: int) -> Doc:
            doc = self.store.doc(group, "g") or self._new_group()
            if mode is not None and mode.value != doc["mode"] and doc.get("members"):
                raise errors.InvalidRequest(
                    f"group {group!r} has members; its mode stays {doc['mode']} until they leave"
                )
            updates = {
                "mode": mode.value if mode else None,
                "autoOffsetReset": auto_offset_reset.value if auto_offset_reset else None,
                "sessionTimeoutMs": session_timeout_ms,
                "broadcastExpireMs": broadcast_expire_ms,
            }
            doc = {**doc, **{k: v for k, v in updates.items() if v is not None}}
            return await self.store.write(p, key("g", group), doc)

        result: Doc = await self.store.owned(group, change)
        return result

    def _new_group(self) -> Doc:
        s = self.settings
        return {
            "mode": Mode.CLUSTERING.value,
            "autoOffsetReset": AutoReset.LATEST.value,
            "sessionTimeoutMs": s.default_session_timeout_ms,
            "broadcastExpireMs": s.default_broadcast_expire_ms,
            "generation": 0,
            "members": {},
            "assignment": {},
            "partitions": {},
        }

    async def describe(self, group: str) -> Doc | None:
        await self.store.read(group)
        return self.store.doc(group, "g")

    # -- membership ---------------------------------------------------------------------------

    async def join(
        self, group: str, member_id: str | None, topics: Sequence[str]
    ) -> tuple[str, int, list[TopicPartition]]:
        """Join (or rejoin) a group: a client-chosen member id keeps its identity. What
        the member had been given but not committed comes again."""
        for topic in topics:
            validate_topic(topic)
        member = member_id or f"m-{hashlib.sha1(str(time.time_ns()).encode()).hexdigest()[:12]}"  # noqa: S324
        counts = {t: await self._partitions_of(t) for t in dict.fromkeys(topics)}

        async def change(p: int) -> tuple[int, list[TopicPartition]]:
            doc = self.store.doc(group, "g") or self._new_group()
            now = _now_ms()
            members = dict(doc.get("members", {}))
            members[member] = {
                "topics": list(dict.fromkeys(topics)),
                "joinedMs": now,
                "lastSeenMs": now,
            }
            doc = await self._rebalance(
                p, group, {**doc, "members": members}, counts, back=[member]
            )
            return int(doc["generation"]), _assignment(doc, member)

        generation, assignment = await self.store.owned(group, change)
        self._drop_readers(group, member)
        log.info("group %r: member %r joined (generation %d)", group, member, generation)
        return member, generation, assignment

    async def _rebalance(
        self,
        p: int,
        group: str,
        doc: Doc,
        counts: dict[str, int] | None = None,
        back: Sequence[str] = (),
    ) -> Doc:
        """Write the group with a new generation and assignment; partitions that moved,
        and everything of the members in ``back`` (rejoined), go back to their
        committed offsets."""
        config = _config(doc)
        members = _members(doc)
        partitions = dict(doc.get("partitions", {}))
        partitions.update(counts or {})
        old = doc.get("assignment", {})
        new = proto.assign(config.mode, {m: v.topics for m, v in members.items()}, partitions)
        doc = {
            **doc,
            "generation": int(doc.get("generation", 0)) + 1,
            "partitions": partitions,
            "assignment": {m: [list(tp) for tp in tps] for m, tps in new.items()},
        }
        written = await self.store.write(p, key("g", group), doc)
        for m, tps in old.items():
            kept = set(new.get(m, ())) if m not in back else set()
            for t, part in tps:
                if (t, int(part)) not in kept:
                    await self._undeliver(p, group, config.mode, m, (t, int(part)))
        return written

    async def _undeliver(
        self, p: int, group: str, mode: Mode, member: str, tp: TopicPartition
    ) -> None:
        """Deliveries of a partition go back to its committed offset (the reset epoch
        the member or group applied is kept: a reset is applied once)."""
        owner = "" if mode is Mode.CLUSTERING else member
        k = key("d", group, owner, tp[0], tp[1])
        doc = self.store.doc(group, "d", owner, tp[0], tp[1])
        if doc is not None and doc.get("offset") is not None:
            await self.store.write(
                p, k, {**doc, "offset": None, "position": None, "inflightMs": None}
            )
        self._drop_readers(group, member, tp)

    async def heartbeat(self, group: str, member: str) -> tuple[int, list[TopicPartition]]:
        async def change(p: int) -> tuple[int, list[TopicPartition]]:
            doc = await self._seen(p, group, member)
            return int(doc["generation"]), _assignment(doc, member)

        result: tuple[int, list[TopicPartition]] = await self.store.owned(group, change)
        return result

    async def _seen(self, p: int, group: str, member: str) -> Doc:
        """The group, the member checked in it and its session refreshed (written only
        when the stored last-seen time is a quarter of a session old)."""
        doc = self.store.doc(group, "g")
        members = (doc or {}).get("members", {})
        if doc is None or member not in members:
            raise StaleMember(
                errors.UnknownMemberId(
                    f"member {member!r} is not in group {group!r} (its session expired, or it "
                    "left): join again"
                )
            )
        now = _now_ms()
        entry = members[member]
        if now - int(entry["lastSeenMs"]) >= int(doc["sessionTimeoutMs"]) // 4:
            members = {**members, member: {**entry, "lastSeenMs": now}}
            doc = await self.store.write(p, key("g", group), {**doc, "members": members})
        return doc

    async def leave(self, group: str, member: str) -> None:
        async def change(p: int) -> None:
            doc = self.store.doc(group, "g")
            if doc is None or member not in doc.get("members", {}):
                raise StaleMember(
                    errors.UnknownMemberId(f"member {member!r} is not in group {group!r}")
                )
            members = {m: v for m, v in doc["members"].items() if m != member}
            await self._rebalance(p, group, {**doc, "members": members}, back=[member])

        await self.store.owned(group, change)
        self._drop_readers(group, member)

    async def sweep(self) -> None:
        """Members that missed their session leave (on partitions this sidecar owns)."""
        now = _now_ms()
        for p in range(self.store.parts.count):
            if not self.store.parts.owned(p):
                continue
            for group in self.store.groups_in(p):
                doc = self.store.doc(group, "g")
                if doc is None:
                    continue
                config = _config(doc)
                gone = [m for m in _members(doc).values() if proto.expired(m, config, now)]
                if gone:
                    await self._expire(group, [m.member_id for m in gone])

    async def _expire(self, group: str, gone: list[str]) -> None:
        async def change(p: int) -> None:
            doc = self.store.doc(group, "g")
            if doc is None:
                return
            config = _config(doc)
            now = _now_ms()
            members = _members(doc)
            expired = [m for m in gone if m in members and proto.expired(members[m], config, now)]
            if not expired:
                return
            kept = {m: v for m, v in doc["members"].items() if m not in expired}
            await self._rebalance(p, group, {**doc, "members": kept}, back=expired)
            log.info("group %r: members %s missed their session; rebalanced", group, expired)

        await self.store.owned(group, change)
        for member in gone:
            self._drop_readers(group, member)

    # -- where a member stands ----------------------------------------------------------------

    def _committed(self, group: str, mode: Mode, member: str, tp: TopicPartition) -> Doc | None:
        if mode is Mode.CLUSTERING:
            return self.store.doc(group, "o", tp[0], tp[1])
        return self.store.doc(group, "b", member, tp[0], tp[1])

    def _others(
        self, group: str, doc: Doc, member: str, tp: TopicPartition
    ) -> list[tuple[int, int]]:
        """(committed offset, last seen) of the group's other broadcast members."""
        seen = {m: int(v["lastSeenMs"]) for m, v in doc.get("members", {}).items()}
        out = []
        for k, d in self.store.docs(group):
            if k[0] == "b" and k[2] != member and (k[3], int(k[4])) == tp:
                out.append((int(d["offset"]), seen.get(k[2], int(d.get("seenMs", 0)))))
        return out

    async def _resolve(
        self, tp: TopicPartition, start: Start, offset: int | None
    ) -> tuple[int, Position | None, bool]:
        """(offset, position, clamped) for a planned start."""
        topic = self._ptopic(tp)
        if start is Start.EARLIEST:
            first, at = await self.positions.earliest(topic)
            return first, at, False
        if start is Start.LATEST:
            end, at = await self.positions.end(topic)
            return end, at, False
        if offset is None:
            raise errors.KafkaError("a start offset is missing")
        try:
            return offset, await self.positions.locate(topic, offset), False
        except errors.OffsetOutOfRange:
            first, at = await self.positions.earliest(topic)
            if offset < first:  # deleted by retention: clamped to the earliest still there
                return first, at, True
            end, at = await self.positions.end(topic)
            return end, at, True

    # -- pull ---------------------------------------------------------------------------------

    async def pull(
        self,
        group: str,
        member: str,
        *,
        max_records: int,
        max_bytes: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> PullResult:
        """Up to ``max_records`` records from the member's positions, waiting up to
        ``wait_ms`` for some to arrive (``gone``: the client went away: nothing is
        answered, nothing moves)."""
        lock = self._member_locks.setdefault((group, member), asyncio.Lock())
        async with lock:
            plans, doc, resets, clamped = await self.store.owned(
                group, lambda p: self._plan(p, group, member)
            )
            mode = _config(doc).mode
            records = await self._read(group, member, plans, max_records, max_bytes, wait_ms, gone)
            if gone is not None and await gone():
                self._rewind(group, member, plans)
                return PullResult([], int(doc["generation"]), _assignment(doc, member))
            ok = await self.store.owned(
                group, lambda p: self._record(p, group, member, mode, doc, plans, records)
            )
            if not ok:  # the group moved meanwhile: nothing is answered, nothing is lost
                self._rewind(group, member, plans)
                latest = self.store.doc(group, "g") or doc
                return PullResult([], int(latest["generation"]), _assignment(latest, member))
        result = PullResult(
            [(plan.tp, r) for plan in plans for r in records.get(plan.tp, [])],
            int(doc["generation"]),
            _assignment(doc, member),
            resets,
            clamped,
        )
        for plan in plans:
            got = records.get(plan.tp)
            result.next_offsets[plan.tp] = got[-1].offset + 1 if got else plan.offset
        for plan in plans:
            entry = self._readers.get((group, member, plan.tp))
            if entry is not None and entry.reader.clamped_from is not None:
                result.clamped.append(
                    {
                        "topic": plan.tp[0],
                        "partition": plan.tp[1],
                        "from": entry.reader.clamped_from,
                    }
                )
                entry.reader.clamped_from = None
        return result

    async def _plan(
        self, p: int, group: str, member: str
    ) -> tuple[list[_Plan], Doc, list[dict[str, Any]], list[dict[str, Any]]]:
        doc = await self._seen(p, group, member)
        config = _config(doc)
        owner = "" if config.mode is Mode.CLUSTERING else member
        now = _now_ms()
        plans, resets, clamped = [], [], []
        for tp in _assignment(doc, member):
            delivery = self.store.doc(group, "d", owner, tp[0], tp[1]) or {}
            reset = self.store.doc(group, "r", tp[0], tp[1])
            applied = int(delivery.get("resetEpoch", 0))
            epoch = applied
            offset: int | None
            position: Position | None = None
            start: Start
            if (
                reset is not None
                and int(reset["epoch"]) > applied
                and (reset.get("members") is None or member in reset["members"])
            ):
                epoch = int(reset["epoch"])
                offset, start = int(reset["offset"]), Start.FLOOR
                position = decode_position(reset["position"]) if reset.get("position") else None
                resets.append(
                    {
                        "topic": tp[0],
                        "partition": tp[1],
                        "offset": offset,
                        "epoch": epoch,
                        "to": reset["to"],
                    }
                )
            else:
                committed = self._committed(group, config.mode, member, tp)
                floor_doc = self.store.doc(group, "o", tp[0], tp[1])
                offset, start = proto.start_offset(
                    config.mode,
                    delivered=delivery.get("offset"),
                    own=None if committed is None else int(committed["offset"]),
                    others=self._others(group, doc, member, tp)
                    if config.mode is Mode.BROADCAST
                    else (),
                    floor=None if floor_doc is None else int(floor_doc["offset"]),
                    auto_offset_reset=config.auto_offset_reset,
                    now_ms=now,
                    expire_ms=config.broadcast_expire_ms,
                )
                if start is Start.DELIVERED and delivery.get("position"):
                    position = decode_position(delivery["position"])
                elif start is Start.COMMITTED and committed and committed.get("position"):
                    position = decode_position(committed["position"])
            if position is None:
                offset, position, was_clamped = await self._resolve(tp, start, offset)
                if was_clamped:
                    clamped.append({"topic": tp[0], "partition": tp[1], "to": offset})
            if offset is None:
                raise errors.KafkaError("no start offset")
            plans.append(_Plan(tp, offset, position, epoch, int(delivery.get("v", 0)), start))
        return plans, doc, resets, clamped

    async def _read(
        self,
        group: str,
        member: str,
        plans: list[_Plan],
        max_records: int,
        max_bytes: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[bool]] | None,
    ) -> dict[TopicPartition, list[Pulled]]:
        deadline = time.monotonic() + wait_ms / 1000
        readers = [
            (plan, self._reader(group, member, plan)) for plan in plans if plan.position is not None
        ]
        out: dict[TopicPartition, list[Pulled]] = {}
        while True:
            left = max_records - sum(len(v) for v in out.values())
            budget = max_bytes
            for plan, reader in readers:
                if left <= 0:
                    break
                got = await reader.read(left, budget)
                if got:
                    out.setdefault(plan.tp, []).extend(got)
                    left -= len(got)
                    if budget is not None:
                        budget -= sum(r.size for r in got)
                        if budget <= 0:
                            left = 0
            if out or time.monotonic() >= deadline or not readers:
                return out
            if gone is not None and await gone():
                return out
            await asyncio.sleep(_POLL_S)

    def _reader(self, group: str, member: str, plan: _Plan) -> PartitionReader:
        k = (group, member, plan.tp)
        entry = self._readers.get(k)
        now = time.monotonic()
        if entry is not None and entry.reader.next_offset == plan.offset:
            entry.last_used = now
            return entry.reader
        if entry is not None:
            self._readers.pop(k)
            task = asyncio.ensure_future(entry.reader.close())
            task.add_done_callback(lambda _t: None)
        assert plan.position is not None
        reader = PartitionReader(
            self._client, self.positions, self._ptopic(plan.tp), plan.offset, plan.position
        )
        self._readers[k] = _Reader(reader, now)
        return reader

    def _rewind(self, group: str, member: str, plans: list[_Plan]) -> None:
        """Records read but not answered: the readers go (the next pull reads again)."""
        for plan in plans:
            self._drop_readers(group, member, plan.tp)

    def _drop_readers(self, group: str, member: str, tp: TopicPartition | None = None) -> None:
        for k in [
            k
            for k in self._readers
            if k[0] == group and k[1] == member and (tp is None or k[2] == tp)
        ]:
            entry = self._readers.pop(k)
            task = asyncio.ensure_future(entry.reader.close())
            task.add_done_callback(lambda _t: None)

    async def _record(
        self,
        p: int,
        group: str,
        member: str,
        mode: Mode,
        planned: Doc,
        plans: list[_Plan],
        records: dict[TopicPartition, list[Pulled]],
    ) -> bool:
        """Store where deliveries now stand, unless the group moved since the plan."""
        doc = self.store.doc(group, "g")
        if doc is None or int(doc["generation"]) != int(planned["generation"]):
            return False
        if member not in doc.get("members", {}):
            return False
        owner = "" if mode is Mode.CLUSTERING else member
        now = _now_ms()
        for plan in plans:
            current = self.store.doc(group, "d", owner, plan.tp[0], plan.tp[1]) or {}
            if int(current.get("v", 0)) != plan.version:
                return False  # another pull of this member (through another sidecar) moved it
        for plan in plans:
            got = records.get(plan.tp, [])
            current = self.store.doc(group, "d", owner, plan.tp[0], plan.tp[1]) or {}
            committed = self._committed(group, mode, member, plan.tp)
            committed_offset = None if committed is None else int(committed["offset"])
            offset = got[-1].offset + 1 if got else plan.offset
            position = after(got[-1].position) if got else plan.position
            inflight = current.get("inflightMs") if current.get("offset") is not None else None
            if committed_offset is not None and offset <= committed_offset:
                inflight = None
            elif got and inflight is None:
                inflight = now
            fresh = {
                "offset": offset,
                "position": None if position is None else encode_position(position),
                "resetEpoch": plan.reset_epoch,
                "inflightMs": inflight,
                "member": member,
            }
            unchanged = {k: current.get(k) for k in fresh} == fresh
            if not unchanged:
                await self.store.write(p, key("d", group, owner, plan.tp[0], plan.tp[1]), fresh)
        return True

    # -- commit -------------------------------------------------------------------------------

    async def commit(
        self,
        group: str,
        member: str,
        offsets: Sequence[tuple[str, int, int]] | None,
        generation: int | None,
    ) -> list[dict[str, Any]]:
        """Commit what was delivered to the member (``offsets`` None), or the given
        (topic, partition, next offset) of partitions assigned to it."""

        async def change(p: int) -> list[dict[str, Any]]:
            doc = await self._seen(p, group, member)
            if generation is not None and generation != int(doc["generation"]):
                raise StaleMember(
                    errors.IllegalGeneration(
                        f"generation {generation} is stale: group {group!r} is at generation "
                        f"{doc['generation']}; heartbeat or pull for the new assignment"
                    )
                )
            mode = _config(doc).mode
            owner = "" if mode is Mode.CLUSTERING else member
            assigned = set(_assignment(doc, member))
            wanted: list[tuple[TopicPartition, int | None]]
            if offsets is None:
                wanted = [(tp, None) for tp in sorted(assigned)]
            else:
                wanted = [((t, part), o) for t, part, o in offsets]
            done = []
            now = _now_ms()
            for tp, asked in wanted:
                if tp not in assigned:
                    raise StaleMember(
                        errors.IllegalGeneration(
                            f"{tp[0]}-{tp[1]} is not assigned to member {member!r} in generation "
                            f"{doc['generation']}"
                        )
                    )
                delivery = self.store.doc(group, "d", owner, tp[0], tp[1]) or {}
                reset = self.store.doc(group, "r", tp[0], tp[1])
                if (
                    reset is not None
                    and int(reset["epoch"]) > int(delivery.get("resetEpoch", 0))
                    and (reset.get("members") is None or member in reset["members"])
                ):
                    raise StaleMember(
                        errors.IllegalGeneration(
                            f"{tp[0]}-{tp[1]} was reset (to offset {reset['offset']}) after this "
                            "member's last pull: pull again before committing; a commit of an "
                            "earlier position would undo the reset"
                        )
                    )
                if asked is None:
                    if delivery.get("offset") is None:
                        continue  # nothing delivered on it: nothing to commit
                    offset, position = int(delivery["offset"]), delivery.get("position")
                else:
                    offset = asked
                    position = (
                        delivery.get("position") if delivery.get("offset") == offset else None
                    )
                k = (
                    key("o", group, tp[0], tp[1])
                    if mode is Mode.CLUSTERING
                    else key("b", group, member, tp[0], tp[1])
                )
                await self.store.write(
                    p,
                    k,
                    {
                        "offset": offset,
                        "position": position,
                        "metadata": "",
                        "commitMs": now,
                        "seenMs": now,
                    },
                )
                if (
                    delivery.get("offset") is not None
                    and int(delivery["offset"]) <= offset
                    and delivery.get("inflightMs")
                ):
                    await self.store.write(
                        p, key("d", group, owner, tp[0], tp[1]), {**delivery, "inflightMs": None}
                    )
                done.append({"topic": tp[0], "partition": tp[1], "offset": offset})
            return done

        result: list[dict[str, Any]] = await self.store.owned(group, change)
        return result

    # -- reset --------------------------------------------------------------------------------

    async def reset(self, group: str, request: ResetRequest) -> list[dict[str, Any]]:
        """Resolve the target now, store it durably with a higher epoch; each member's
        next pull starts there."""
        validate_topic(request.topic)
        count = await self._partitions_of(request.topic)
        partitions = request.partitions if request.partitions is not None else tuple(range(count))
        for part in partitions:
            if not 0 <= part < count:
                raise errors.InvalidRequest(
                    f"topic {request.topic!r} has partitions 0..{count - 1}; got {part}"
                )
        resolved = [await self._target(request, part) for part in partitions]

        async def change(p: int) -> list[dict[str, Any]]:
            now = _now_ms()
            out = []
            for r in resolved:
                k = key("r", group, request.topic, r["partition"])
                current = self.store.doc(group, "r", request.topic, r["partition"])
                epoch = (int(current["epoch"]) if current else 0) + 1
                await self.store.write(
                    p,
                    k,
                    {
                        "epoch": epoch,
                        "offset": r["offset"],
                        "position": r["position"],
                        "to": request.to,
                        "value": request.value,
                        "members": list(request.members) if request.members is not None else None,
                        "atMs": now,
                    },
                )
                out.append({**r, "epoch": epoch})
            return out

        result: list[dict[str, Any]] = await self.store.owned(group, change)
        for member_key in [k for k in self._readers if k[0] == group and k[2][0] == request.topic]:
            self._drop_readers(group, member_key[1], member_key[2])
        return result

    async def _target(self, request: ResetRequest, part: int) -> dict[str, Any]:
        """A reset's target on one partition, resolved now (before the earliest or after
        the end, a timestamp is clamped to them; an offset outside is refused)."""
        topic = self._ptopic((request.topic, part))
        clamped = False
        if request.to == "earliest":
            offset, position = await self.positions.earliest(topic)
        elif request.to == "latest":
            offset, position = await self.positions.end(topic)
        elif request.to in {"timestamp", "offset"} and request.value is None:
            raise errors.InvalidRequest(f"to={request.to} needs a value")
        elif request.to == "timestamp":
            first, _ = await self.positions.earliest(topic)
            offset, position = await self.positions.at_time(topic, request.value or 0)
            clamped = offset == first
        elif request.to == "offset":
            offset = request.value or 0
            position = await self.positions.locate(topic, offset)
        else:
            raise errors.InvalidRequest(
                f"to must be earliest, latest, timestamp or offset, not {request.to!r}"
            )
        return {
            "topic": request.topic,
            "partition": part,
            "offset": offset,
            "position": None if position is None else encode_position(position),
            "clamped": clamped,
        }

    async def reset_status(self, group: str) -> list[dict[str, Any]]:
        """Each reset and, per member, whether it has been applied."""
        await self.store.read(group)
        doc = self.store.doc(group, "g") or {}
        mode = Mode(doc.get("mode", Mode.CLUSTERING.value))
        members = sorted(doc.get("members", {}))
        out = []
        for k, r in self.store.docs(group):
            if k[0] != "r":
                continue
            tp = (k[2], int(k[3]))
            targets = r.get("members") or members
            status = {}
            for m in targets:
                owner = "" if mode is Mode.CLUSTERING else m
                delivery = self.store.doc(group, "d", owner, tp[0], tp[1]) or {}
                applied = int(delivery.get("resetEpoch", 0)) >= int(r["epoch"])
                if mode is Mode.CLUSTERING and tp not in _assignment(doc, m):
                    continue
                status[m] = "applied" if applied else "pending"
            out.append(
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "epoch": r["epoch"],
                    "offset": r["offset"],
                    "to": r["to"],
                    "value": r.get("value"),
                    "atMs": r["atMs"],
                    "members": status,
                }
            )
        return out

    # -- lag ----------------------------------------------------------------------------------

    async def lag(self, group: str) -> dict[str, Any]:
        """Per partition (and per member in broadcast mode): end, committed, pulled,
        ready (end - pulled), inflight (pulled - committed), lag (end - committed), all in
        records (the broker's entry index counts messages, not entries), and the age of
        the oldest inflight record."""
        await self.store.read(group)
        doc = self.store.doc(group, "g")
        if doc is None:
            raise errors.InvalidRequest(f"no group {group!r}")
        config = _config(doc)
        now = _now_ms()
        topics = sorted(
            {t for m in _members(doc).values() for t in m.topics} | set(doc.get("partitions", {}))
        )
        rows = []
        for topic in topics:
            count = int(doc.get("partitions", {}).get(topic) or await self._partitions_of(topic))
            for part in range(count):
                tp = (topic, part)
                end, _ = await self.positions.end(self._ptopic(tp))
                owners = [""] if config.mode is Mode.CLUSTERING else sorted(doc.get("members", {}))
                for owner in owners:
                    committed_doc = self._committed(group, config.mode, owner, tp)
                    delivery = self.store.doc(group, "d", owner, topic, part) or {}
                    committed = None if committed_doc is None else int(committed_doc["offset"])
                    pulled = delivery.get("offset")
                    pulled = committed if pulled is None else int(pulled)
                    row = {
                        "topic": topic,
                        "partition": part,
                        "end": end,
                        "committed": committed,
                        "pulled": pulled,
                        "ready": None if pulled is None else max(end - pulled, 0),
                        "inflight": None
                        if pulled is None or committed is None
                        else max(pulled - committed, 0),
                        "lag": None if committed is None else max(end - committed, 0),
                        "oldestInflightMs": (now - int(delivery["inflightMs"]))
                        if delivery.get("inflightMs")
                        else None,
                    }
                    if config.mode is Mode.BROADCAST:
                        row["member"] = owner
                    rows.append(row)
                if config.mode is Mode.BROADCAST:
                    mins = proto.broadcast_minimum(
                        self._others(group, doc, "", tp), now, config.broadcast_expire_ms
                    )
                    rows.append(
                        {
                            "topic": topic,
                            "partition": part,
                            "member": None,
                            "groupMinimum": mins,
                            "end": end,
                            "lag": None if mins is None else max(end - mins, 0),
                        }
                    )
        return {
            "groupId": group,
            "mode": config.mode.value,
            "generation": doc["generation"],
            "partitions": rows,
        }

    # -- the Pulsar subscription that follows committed offsets -------------------------------

    async def follow_cursors(self) -> None:
        """On partitions this sidecar owns: move each group's durable subscription to its
        committed position (clustering) or the group minimum (broadcast), so Pulsar keeps
        unconsumed data and pulsar-admin shows the group's backlog."""
        for p in range(self.store.parts.count):
            if not self.store.parts.owned(p):
                continue
            for group in self.store.groups_in(p):
                for k, d in self.store.docs(group):
                    if k[0] != "o" or not d.get("position"):
                        continue
                    tp = (k[2], int(k[3]))
                    if self._cursor_moved.get((group, tp)) == d["position"]:
                        continue
                    await self._move_cursor(group, tp, decode_position(d["position"]))
                    self._cursor_moved[group, tp] = d["position"]

    async def _move_cursor(self, group: str, tp: TopicPartition, position: Position) -> None:
        topic, sub = self._ptopic(tp), subscription_name(group)
        try:
            await self._admin.move_subscription(
                topic, sub, position[0], position[1], max(position[2], 0)
            )
        except AdminError as exc:
            if exc.status != 404:
                raise
            await self._admin.create_subscription(topic, sub)
            await self._admin.move_subscription(
                topic, sub, position[0], position[1], max(position[2], 0)
            )
