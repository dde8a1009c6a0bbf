"""The group coordinator: membership, pulls, commits and server-side resets, with all
state in the group store (so any sidecar serves any member of any group).

A change to a group runs on the owner of its store partition (taken on demand);
reads catch up with the store first. A pull is planned as the owner (where each
assigned partition stands, resets applied), reads outside the lock (long poll), and
records the new delivery position as the owner again, after checking nothing moved
meanwhile (a rebalance, a reset, another pull of the member): only then are the
records answered. When something moved, nothing is answered from that read and the
pull is planned again (within its wait), so a pull that says a reset was applied
holds nothing from before the reset. What was answered but not committed comes again
when the member rejoins, misses its session or its partition moves, and when the
sidecar that recorded it went away (crash or stop): the new owner of the store
partition sends deliveries back to the committed offsets
(:meth:`GroupStore.on_orphan <kop_dedup.coordination.groups.store.GroupStore.on_orphan>`).

Offsets are Kafka-style integers from the broker's entry index
(:mod:`kop_dedup.pulsar.positions`); each is kept with its Pulsar position when known,
so a pull starts reading without a lookup. Lag (:mod:`.lag`) counts them exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.groups.store import Doc, GroupStore, key
from kop_dedup.protocol import groups as proto
from kop_dedup.protocol.groups import AutoReset, GroupConfig, Member, Mode, Start
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming, validate_topic
from kop_dedup.pulsar.positions import Position, Positions, decode_position, encode_position
from kop_dedup.pulsar.reading import PartitionReader, Pulled, after
from kop_dedup.pulsar.tables import PulsarClient

__all__ = [
    "GroupCoordinator",
    "GroupSettings",
    "PullResult",
    "ResetRequest",
    "StaleMember",
    "UnknownGroup",
]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_POLL_S = 0.02
_PULL_ATTEMPTS = 3
_EMPTY_POLL_S = 0.1
"""How often a long poll on partitions that are all still empty plans again."""
"""Plans of one pull when the group keeps moving under it; then it answers nothing."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class StaleMember(errors.KafkaError):
    """A commit or call from a member the group moved on from (HTTP 409); ``error`` is
    Kafka's code for it (22 ILLEGAL_GENERATION or 25 UNKNOWN_MEMBER_ID)."""

    def __init__(self, error: errors.KafkaError) -> None:
        super().__init__(error.message)
        self.error = error


def _unknown_member(group: str, member: str) -> StaleMember:
    return StaleMember(
        errors.UnknownMemberId(
            f"member {member!r} is not in group {group!r} (its session expired, or it "
            "left): join again"
        )
    )


def _stale_generation(group: str, generation: int, current: int) -> StaleMember:
    return StaleMember(
        errors.IllegalGeneration(
            f"generation {generation} is stale: group {group!r} is at generation "
            f"{current}; heartbeat or pull for the new assignment"
        )
    )


class UnknownGroup(errors.GroupIdNotFound):
    """No such group: nothing of it is stored (HTTP 404)."""


@dataclass(frozen=True, slots=True)
class GroupSettings:
    cursor_interval_s: float = 5.0
    sweep_interval_s: float = 1.0
    lag_interval_s: float = 10.0
    reader_idle_s: float = 60.0
    default_session_timeout_ms: int = 30_000
    default_broadcast_expire_ms: int = 120_000
    max_pull_records: int = 10_000
    max_wait_ms: int = 60_000
    answer_delay_s: float = 0.0
    """Fault injection: wait this long between recording a pull and answering it."""


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
    """Partitions whose start had been deleted by retention: ``from`` (the offset it
    would have started at), ``to`` (the earliest still stored, where it started)."""
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
    reset_version: int
    """The reset doc's version when planned (0: none): a reset that lands meanwhile
    makes the pull plan again."""
    start: Start
    clamped: dict[str, Any] | None = None


_Answer = tuple[list[_Plan], Doc, list[dict[str, Any]], dict[TopicPartition, list[Pulled]]]
"""What a recorded pull answers: its plans, the group, the resets applied, the records."""


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


async def _present() -> bool:
    return False


def _targets(reset: Doc, member: str) -> bool:
    """Whether a reset applies to a member (None: every member)."""
    members = reset.get("members")
    return members is None or member in members


def _inflight(delivery: Doc) -> list[proto.InflightEntry]:
    return [(int(o), int(ms)) for o, ms in delivery.get("inflight") or []]


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
        self._closing_readers: set[asyncio.Task[None]] = set()
        self._member_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.pulls_in_flight = 0
        """Pulls this sidecar is serving now (long polls included)."""
        store.on_orphan(self._recover)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, *jobs: tuple[float, Callable[[], Awaitable[None]], str]) -> None:
        """The session sweeper and reader reaper, and ``jobs`` ((interval, job, name):
        the lag and cursor loops) on their own tasks."""
        loops = [(self.settings.sweep_interval_s, self.sweep, "group-sweeper"), *jobs]
        self._tasks = [
            asyncio.create_task(self._every(interval, job), name=name)
            for interval, job, name in loops
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
        while self._closing_readers:
            await asyncio.gather(*self._closing_readers, return_exceptions=True)

    async def _every(self, interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
        while not self._closing:
            await asyncio.sleep(interval_s)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("group job %s failed: %r", getattr(job, "__name__", job), exc)

    def partition_topic(self, tp: TopicPartition) -> str:
        return self._naming.partition_topic(tp[0], tp[1])

    async def _recover(self, p: int) -> None:
        """This sidecar took store partition ``p`` from an owner that went away, which
        may have recorded pulls it never answered: every delivery not committed goes back
        to the committed offset (the records come again; a reset applied stays applied)."""
        rewound = 0
        for group in self.store.groups_in(p):
            doc = self.store.doc(group, "g")
            mode = Mode(doc["mode"]) if doc else Mode.CLUSTERING
            for k, delivery in self.store.docs(group):
                if k[0] != "d" or delivery.get("offset") is None:
                    continue
                member, tp = str(k[2]), (str(k[3]), int(k[4]))
                committed = self.committed_doc(group, mode, member, tp)
                if committed is not None and int(committed["offset"]) >= int(delivery["offset"]):
                    continue
                await self.store.write(
                    p,
                    key("d", group, member, tp[0], tp[1]),
                    {**delivery, "offset": None, "position": None, "inflight": []},
                )
                rewound += 1
            self._drop_readers(group)
        if rewound:
            log.warning(
                "consumer groups: took partition %d from an owner that went away: %d "
                "deliveries not committed go back to their committed offsets (sent again)",
                p,
                rewound,
            )

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
        and everything of the members in ``back`` (rejoined, left, expired), go back to
        their committed offsets."""
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
            await self.store.write(p, k, {**doc, "offset": None, "position": None, "inflight": []})
        self._drop_readers(group, member, tp)

    async def heartbeat(self, group: str, member: str) -> tuple[int, list[TopicPartition]]:
        async def change(p: int) -> tuple[int, list[TopicPartition]]:
            doc = await self._seen(p, group, member)
            return int(doc["generation"]), _assignment(doc, member)

        result: tuple[int, list[TopicPartition]] = await self.store.owned(group, change)
        return result

    async def check_member(self, group: str, member: str | None, generation: int | None) -> None:
        """Fencing of a transactional offset commit made for a member (Kafka's KIP-447):
        raises what the member's own commit would, StaleMember wrapping 25
        UNKNOWN_MEMBER_ID (``member`` not in the group) or 22 ILLEGAL_GENERATION
        (``generation`` not the group's), checked in that order, as Kafka's
        TxnOffsetCommit does. ``None`` skips a check. Reads the group (every change
        made before the call, through any sidecar); changes nothing."""
        if member is None and generation is None:
            return
        await self.store.read(group)
        doc = self.store.doc(group, "g")
        if member is not None and (doc is None or member not in doc.get("members", {})):
            raise _unknown_member(group, member)
        if generation is not None and generation != int((doc or {}).get("generation", 0)):
            raise _stale_generation(group, generation, int((doc or {}).get("generation", 0)))

    async def _seen(self, p: int, group: str, member: str) -> Doc:
        """The group, the member checked in it and its session refreshed (written only
        when the stored last-seen time is a quarter of a session old)."""
        doc = self.store.doc(group, "g")
        members = (doc or {}).get("members", {})
        if doc is None or member not in members:
            raise _unknown_member(group, member)
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
        self._member_locks.pop((group, member), None)

    async def sweep(self) -> None:
        """Members that missed their session leave (on partitions this sidecar owns);
        readers idle for ``reader_idle_s`` close."""
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
        idle = time.monotonic() - self.settings.reader_idle_s
        for k, entry in list(self._readers.items()):
            if entry.last_used < idle:
                self._close_reader(k)

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
            self._member_locks.pop((group, member), None)

    # -- where a member stands ----------------------------------------------------------------

    def committed_doc(self, group: str, mode: Mode, member: str, tp: TopicPartition) -> Doc | None:
        if mode is Mode.CLUSTERING:
            return self.store.doc(group, "o", tp[0], tp[1])
        return self.store.doc(group, "b", member, tp[0], tp[1])

    def broadcast_others(
        self, group: str, doc: Doc, member: str, tp: TopicPartition
    ) -> list[tuple[int, int]]:
        """(committed offset, last seen) of the group's other broadcast members, those
        gone included. Last seen: its last commit, or its last call when later (a member's
        stored last call lags by up to a quarter of its session; a commit is exact)."""
        seen = {m: int(v["lastSeenMs"]) for m, v in doc.get("members", {}).items()}
        out = []
        for k, d in self.store.docs(group):
            if k[0] == "b" and k[2] != member and (k[3], int(k[4])) == tp:
                last = max(seen.get(k[2], 0), int(d.get("seenMs", 0)))
                out.append((int(d["offset"]), last))
        return out

    async def _resolve(
        self, tp: TopicPartition, start: Start, offset: int | None
    ) -> tuple[int, Position | None, bool]:
        """(offset, position, clamped) for a planned start."""
        topic = self.partition_topic(tp)
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
        ``wait_ms`` (at most half the group's session) for some to arrive (``gone``:
        the client went away: nothing is answered, nothing moves)."""
        lock = self._member_locks.setdefault((group, member), asyncio.Lock())
        self.pulls_in_flight += 1
        try:
            async with lock:
                answered = await self._pull(
                    group, member, max_records, max_bytes, wait_ms, gone or _present
                )
        finally:
            self.pulls_in_flight -= 1
        if isinstance(answered, PullResult):
            return answered
        plans, doc, resets, records = answered
        result = PullResult(
            [(plan.tp, r) for plan in plans for r in records.get(plan.tp, [])],
            int(doc["generation"]),
            _assignment(doc, member),
            resets,
        )
        for plan in plans:
            got = records.get(plan.tp)
            result.next_offsets[plan.tp] = got[-1].offset + 1 if got else plan.offset
            if plan.clamped is not None:
                result.clamped.append(plan.clamped)
            entry = self._readers.get((group, member, plan.tp))
            if entry is not None and entry.reader.clamped_from is not None and got:
                result.clamped.append(
                    {
                        "topic": plan.tp[0],
                        "partition": plan.tp[1],
                        "from": entry.reader.clamped_from,
                        "to": got[0].offset,
                    }
                )
                entry.reader.clamped_from = None
        return result

    async def _pull(
        self,
        group: str,
        member: str,
        max_records: int,
        max_bytes: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[bool]],
    ) -> PullResult | _Answer:
        """Plan, read, record (under the member's lock); an empty PullResult when nothing
        is to be answered."""
        began = time.monotonic()
        attempts = 0
        while attempts < _PULL_ATTEMPTS:
            plans, doc, resets = await self.store.owned(
                group, lambda p: self._plan(p, group, member)
            )
            config = _config(doc)
            deadline = began + min(wait_ms, config.session_timeout_ms // 2) / 1000
            records = await self._read(
                group, member, doc, plans, max_records, max_bytes, deadline, gone
            )
            if await gone():
                self._rewind(group, member, plans)
                return PullResult([], int(doc["generation"]), _assignment(doc, member))
            if (
                plans
                and all(plan.position is None for plan in plans)
                and time.monotonic() < deadline
                and not resets
            ):
                # every partition is still empty (no position to read from): the long
                # poll waits for a first record by planning again
                await asyncio.sleep(min(_EMPTY_POLL_S, max(0.0, deadline - time.monotonic())))
                continue
            attempts += 1
            written = await self.store.owned(
                group,
                functools.partial(
                    self._record,
                    group=group,
                    member=member,
                    mode=config.mode,
                    planned=doc,
                    plans=plans,
                    records=records,
                ),
                caught_up=True,  # by the plan: a takeover since fails the record's write
            )
            if written is not None:
                break
            # the group moved meanwhile (a rebalance, a reset, another pull): what was
            # read is not answered; plan again from where the member now stands
            self._rewind(group, member, plans)
        else:
            latest = self.store.doc(group, "g") or doc
            return PullResult([], int(latest["generation"]), _assignment(latest, member))
        if self.settings.answer_delay_s:
            await asyncio.sleep(self.settings.answer_delay_s)
        if written and await gone():
            # recorded, but the client is gone: put the deliveries back as they were,
            # so that what it was not answered stays ready
            await self.store.owned(group, lambda p: self._unrecord(p, written))
            self._rewind(group, member, plans)
            return PullResult([], int(doc["generation"]), _assignment(doc, member))
        return plans, doc, resets, records

    async def _plan(
        self, p: int, group: str, member: str
    ) -> tuple[list[_Plan], Doc, list[dict[str, Any]]]:
        doc = await self._seen(p, group, member)
        config = _config(doc)
        owner = "" if config.mode is Mode.CLUSTERING else member
        now = _now_ms()
        plans, resets = [], []
        for tp in _assignment(doc, member):
            delivery = self.store.doc(group, "d", owner, tp[0], tp[1]) or {}
            reset = self.store.doc(group, "r", tp[0], tp[1])
            applied = int(delivery.get("resetEpoch", 0))
            epoch = applied
            offset: int | None
            position: Position | None = None
            start: Start
            if reset is not None and int(reset["epoch"]) > applied and _targets(reset, member):
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
                committed = self.committed_doc(group, config.mode, member, tp)
                floor_doc = self.store.doc(group, "o", tp[0], tp[1])
                offset, start = proto.start_offset(
                    config.mode,
                    delivered=delivery.get("offset"),
                    own=None if committed is None else int(committed["offset"]),
                    others=self.broadcast_others(group, doc, member, tp)
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
            clamped = None
            if position is None:
                asked = offset
                offset, position, was_clamped = await self._resolve(tp, start, offset)
                if was_clamped:
                    clamped = {"topic": tp[0], "partition": tp[1], "from": asked, "to": offset}
            if offset is None:
                raise errors.KafkaError("no start offset")
            plans.append(
                _Plan(
                    tp,
                    offset,
                    position,
                    epoch,
                    int(delivery.get("v", 0)),
                    int(reset.get("v", 0)) if reset else 0,
                    start,
                    clamped,
                )
            )
        return plans, doc, resets

    def _moved(self, group: str, member: str, planned: Doc, plans: list[_Plan]) -> bool:
        """Whether this sidecar has seen the group move since the plan (a rebalance or a
        reset made here): a long poll stops waiting then. The owner's check when
        recording is the one that counts."""
        doc = self.store.doc(group, "g")
        if doc is None or int(doc["generation"]) != int(planned["generation"]):
            return True
        for plan in plans:
            reset = self.store.doc(group, "r", plan.tp[0], plan.tp[1])
            if (
                reset is not None
                and int(reset.get("v", 0)) != plan.reset_version
                and _targets(reset, member)
            ):
                return True
        return False

    async def _read(
        self,
        group: str,
        member: str,
        planned: Doc,
        plans: list[_Plan],
        max_records: int,
        max_bytes: int | None,
        deadline: float,
        gone: Callable[[], Awaitable[bool]] | None,
    ) -> dict[TopicPartition, list[Pulled]]:
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
            if self._moved(group, member, planned, plans):
                return out
            if gone is not None and await gone():
                return out
            await asyncio.sleep(_POLL_S)

    def _reader(self, group: str, member: str, plan: _Plan) -> PartitionReader:
        k = (group, member, plan.tp)
        entry = self._readers.get(k)
        now = time.monotonic()
        if (
            entry is not None
            and entry.reader.next_offset == plan.offset
            and not entry.reader.closed
        ):
            entry.last_used = now
            return entry.reader
        if entry is not None:
            self._close_reader(k)
        assert plan.position is not None
        reader = PartitionReader(
            self._client, self.positions, self.partition_topic(plan.tp), plan.offset, plan.position
        )
        self._readers[k] = _Reader(reader, now)
        return reader

    def _rewind(self, group: str, member: str, plans: list[_Plan]) -> None:
        """Records read but not answered: the readers go (the next pull reads again)."""
        for plan in plans:
            self._drop_readers(group, member, plan.tp)

    def _close_reader(self, k: tuple[str, str, TopicPartition]) -> None:
        entry = self._readers.pop(k, None)
        if entry is None:
            return
        task = asyncio.ensure_future(entry.reader.close())
        self._closing_readers.add(task)
        task.add_done_callback(self._closing_readers.discard)

    def _drop_readers(
        self, group: str, member: str | None = None, tp: TopicPartition | None = None
    ) -> None:
        for k in [
            k
            for k in self._readers
            if k[0] == group and (member is None or k[1] == member) and (tp is None or k[2] == tp)
        ]:
            self._close_reader(k)

    async def _record(
        self,
        p: int,
        *,
        group: str,
        member: str,
        mode: Mode,
        planned: Doc,
        plans: list[_Plan],
        records: dict[TopicPartition, list[Pulled]],
    ) -> list[tuple[str, Doc | None, int]] | None:
        """Store where deliveries now stand, unless the group moved since the plan (then
        None); what was written: (key, the doc before, the version written)."""
        doc = self.store.doc(group, "g")
        if doc is None or int(doc["generation"]) != int(planned["generation"]):
            return None
        if member not in doc.get("members", {}):
            return None
        owner = "" if mode is Mode.CLUSTERING else member
        now = _now_ms()
        for plan in plans:
            current = self.store.doc(group, "d", owner, plan.tp[0], plan.tp[1]) or {}
            if int(current.get("v", 0)) != plan.version:
                return None  # another pull of this member (through another sidecar) moved it
            reset = self.store.doc(group, "r", plan.tp[0], plan.tp[1]) or {}
            if int(reset.get("v", 0)) != plan.reset_version and _targets(reset, member):
                return None  # a reset landed meanwhile: the next plan applies it
        writes: list[tuple[str, Doc]] = []
        befores: list[Doc | None] = []
        for plan in plans:
            got = records.get(plan.tp, [])
            current = self.store.doc(group, "d", owner, plan.tp[0], plan.tp[1]) or {}
            committed = self.committed_doc(group, mode, member, plan.tp)
            committed_offset = None if committed is None else int(committed["offset"])
            offset = got[-1].offset + 1 if got else plan.offset
            position = after(got[-1].position) if got else plan.position
            inflight = proto.inflight_after_pull(
                _inflight(current) if current.get("offset") is not None else [],
                committed_offset,
                got[0].offset if got else offset,
                offset,
                now,
            )
            fresh = {
                "offset": offset,
                "position": None if position is None else encode_position(position),
                "resetEpoch": plan.reset_epoch,
                "inflight": [list(e) for e in inflight],
                "member": member,
            }
            unchanged = {k: current.get(k) for k in fresh} == fresh
            if not unchanged:
                writes.append((key("d", group, owner, plan.tp[0], plan.tp[1]), fresh))
                befores.append(current or None)
        # every partition's delivery in one round trip (a member may read many partitions)
        stored = await self._write_all(p, writes)
        return [
            (k, before, int(new["v"]))
            for (k, _), before, new in zip(writes, befores, stored, strict=True)
        ]

    async def _write_all(self, p: int, writes: Sequence[tuple[str, Doc]]) -> list[Doc]:
        """Store several keys at once, each at most once (``p``'s owner, inside
        :meth:`GroupStore.owned`): the state writer batches what is sent together, so
        this costs about one round trip to the broker instead of one per key. Returns
        once every write has ended (what was written, in order); the first failure is
        raised then, so no write outlives the change that made it."""
        keys = [k for k, _ in writes]
        if len(set(keys)) != len(keys):
            raise ValueError(f"a key written twice at once: {keys}")
        results = await asyncio.gather(
            *(self.store.write(p, k, doc) for k, doc in writes), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [r for r in results if not isinstance(r, BaseException)]

    async def _unrecord(self, p: int, written: list[tuple[str, Doc | None, int]]) -> None:
        """Put deliveries back as they were before a pull that was not answered (those
        nothing wrote to since)."""
        for k, before, version in written:
            current = self.store.view_doc(p, k)
            if current is None or int(current.get("v", 0)) != version:
                continue
            restored = (
                dict(before)
                if before is not None
                else {"offset": None, "position": None, "inflight": [], "resetEpoch": 0}
            )
            restored.pop("v", None)  # a reset this pull applied is pending again
            await self.store.write(p, k, {**current, **restored})

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
                raise _stale_generation(group, generation, int(doc["generation"]))
            mode = _config(doc).mode
            owner = "" if mode is Mode.CLUSTERING else member
            wanted = self._commitable(group, member, doc, offsets)
            done = []
            writes: list[tuple[str, Doc]] = []
            now = _now_ms()
            for tp, asked in wanted:
                delivery = self.store.doc(group, "d", owner, tp[0], tp[1]) or {}
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
                stored = self.committed_doc(group, mode, member, tp)
                if not (
                    asked is None
                    and mode is Mode.CLUSTERING
                    and stored is not None
                    and int(stored["offset"]) == offset
                    and stored.get("position") == position
                ):  # else nothing was delivered on it since it was committed: stored already
                    # (a broadcast member's commit is written anyway: it counts as seen)
                    writes.append(
                        (
                            k,
                            {
                                "offset": offset,
                                "position": position,
                                "metadata": "",
                                "commitMs": now,
                                "seenMs": now,
                            },
                        )
                    )
                if delivery.get("offset") is not None and delivery.get("inflight"):
                    kept = proto.inflight_after_commit(_inflight(delivery), offset)
                    if int(delivery["offset"]) <= offset:
                        kept = []
                    if kept != _inflight(delivery):
                        writes.append(
                            (
                                key("d", group, owner, tp[0], tp[1]),
                                {**delivery, "inflight": [list(e) for e in kept]},
                            )
                        )
                done.append({"topic": tp[0], "partition": tp[1], "offset": offset})
            await self._write_all(p, writes)
            return done

        result: list[dict[str, Any]] = await self.store.owned(group, change)
        return result

    def _commitable(
        self,
        group: str,
        member: str,
        doc: Doc,
        offsets: Sequence[tuple[str, int, int]] | None,
    ) -> list[tuple[TopicPartition, int | None]]:
        """The partitions a commit names (all assigned ones for an empty body), each
        checked: assigned to the member, and no reset it has not pulled since (its
        commit would undo the reset). Nothing is written unless all pass."""
        mode = _config(doc).mode
        owner = "" if mode is Mode.CLUSTERING else member
        assigned = set(_assignment(doc, member))
        wanted: list[tuple[TopicPartition, int | None]]
        if offsets is None:
            wanted = [(tp, None) for tp in sorted(assigned)]
        else:
            wanted = [((t, part), o) for t, part, o in offsets]
        for tp, _ in wanted:
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
                and _targets(reset, member)
            ):
                raise StaleMember(
                    errors.IllegalGeneration(
                        f"{tp[0]}-{tp[1]} was reset (to offset {reset['offset']}) after this "
                        "member's last pull: pull again before committing; a commit of an "
                        "earlier position would undo the reset"
                    )
                )
        return wanted

    # -- reset --------------------------------------------------------------------------------

    async def reset(self, group: str, request: ResetRequest) -> list[dict[str, Any]]:
        """Resolve the target now, store it durably with a higher epoch; each member's
        next pull starts there (a pull in flight meanwhile plans again)."""
        validate_topic(request.topic)
        if request.to in {"timestamp", "offset"} and request.value is None:
            raise errors.InvalidRequest(f"to={request.to} needs a value")
        count = await self._partitions_of(request.topic)
        partitions = request.partitions if request.partitions is not None else tuple(range(count))
        for part in partitions:
            if not 0 <= part < count:
                raise errors.InvalidRequest(
                    f"topic {request.topic!r} has partitions 0..{count - 1}; got {part}"
                )
        resolved = [await self._target(request, part) for part in dict.fromkeys(partitions)]

        async def change(p: int) -> list[dict[str, Any]]:
            doc = self.store.doc(group, "g")
            if request.members is not None and doc and doc["mode"] != Mode.BROADCAST.value:
                raise errors.InvalidRequest(
                    f"group {group!r} is a clustering group: a partition has one reader, "
                    "whichever member it is; members is for broadcast groups"
                )
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
        return result

    async def _target(self, request: ResetRequest, part: int) -> dict[str, Any]:
        """A reset's target on one partition, resolved now. A timestamp before the
        earliest message or after the last is clamped to them (``clamped`` says which);
        an offset outside [earliest, end] is refused."""
        topic = self.partition_topic((request.topic, part))
        clamped: str | None = None
        if request.to == "earliest":
            offset, position = await self.positions.earliest(topic)
        elif request.to == "latest":
            offset, position = await self.positions.end(topic)
        elif request.to == "timestamp":
            offset, position, clamped = await self.positions.at_time(topic, request.value or 0)
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
            "clamped": clamped is not None,
            "clampedTo": clamped,
        }

    async def reset_status(self, group: str) -> list[dict[str, Any]]:
        """Each reset and, per member it applies to, whether it has been applied
        (members that are gone included, in broadcast mode: they apply it when they come
        back). UnknownGroup when nothing of the group is stored."""
        await self.store.read(group)
        docs = self.store.docs(group)
        if not docs:
            raise UnknownGroup(f"no group {group!r}")
        doc = self.store.doc(group, "g") or {}
        mode = Mode(doc.get("mode", Mode.CLUSTERING.value))
        live = set(doc.get("members", {}))
        out = []
        for k, r in docs:
            if k[0] != "r":
                continue
            tp = (str(k[2]), int(k[3]))
            status = {}
            if mode is Mode.CLUSTERING:
                delivery = self.store.doc(group, "d", "", tp[0], tp[1]) or {}
                applied = int(delivery.get("resetEpoch", 0)) >= int(r["epoch"])
                for m in sorted(live):
                    if tp in _assignment(doc, m):
                        status[m] = "applied" if applied else "pending"
            else:
                known = live | {
                    str(x[2]) for x, _ in docs if x[0] in {"b", "d"} and (x[3], int(x[4])) == tp
                }
                for m in sorted(r.get("members") or known):
                    delivery = self.store.doc(group, "d", m, tp[0], tp[1]) or {}
                    applied = int(delivery.get("resetEpoch", 0)) >= int(r["epoch"])
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
