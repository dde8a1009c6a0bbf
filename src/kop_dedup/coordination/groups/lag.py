"""What a consumer group has left to read, counted in records, and what Pulsar sees of it.

:meth:`GroupLag.lag` answers ``GET /v1/groups/{groupId}/lag``: per partition (per
member in broadcast mode, plus the group's minimum) ``end``, ``committed``,
``pulled``, ``ready`` (end - pulled), ``inflight`` (pulled - committed), ``lag`` (end -
committed) and the age of the oldest inflight record. Offsets come from the broker's
entry index, which counts messages with no gaps (a batched entry of n messages takes
n offsets), so these differences are exact record counts; Pulsar's own backlog counts
entries.

:meth:`GroupLag.refresh` (a loop on every sidecar) computes the same numbers for the
groups whose store partition this sidecar owns and keeps them as :attr:`GroupLag.rows`
for ``/metrics``: a scrape reads memory, never the admin API.

:meth:`GroupLag.follow_cursors` (another loop, on the owner) moves one durable
subscription per group and partition, ``kop-group-<group>``, to the group's committed
offset (broadcast: the group's minimum), so Pulsar's retention keeps what the group has
not consumed and ``pulsar-admin topics stats`` shows its backlog (in entries).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from typing import Any

from kop_dedup import errors
from kop_dedup.coordination.groups.coordinator import (
    GroupCoordinator,
    TopicPartition,
    UnknownGroup,
)
from kop_dedup.protocol import groups as proto
from kop_dedup.protocol.groups import LagRow, Mode
from kop_dedup.pulsar.admin import AdminError, PulsarAdmin
from kop_dedup.pulsar.positions import Position, decode_position

__all__ = ["GroupLag", "subscription_name"]

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def subscription_name(group: str) -> str:
    """The durable Pulsar subscription that follows a group's committed offsets."""
    if _SAFE_NAME.match(group):
        return f"kop-group-{group}"
    return f"kop-group-{hashlib.sha1(group.encode()).hexdigest()[:16]}"  # noqa: S324 - a name


def _now_ms() -> int:
    return int(time.time() * 1000)


class GroupLag:
    def __init__(self, groups: GroupCoordinator, admin: PulsarAdmin) -> None:
        self._groups, self._admin = groups, admin
        self.rows: list[LagRow] = []
        """The latest refresh: groups whose store partition this sidecar owns."""
        self.refreshed_ms: int | None = None
        self._cursor_at: dict[tuple[str, TopicPartition], int] = {}

    # -- the numbers --------------------------------------------------------------------------

    async def _end(self, tp: TopicPartition, ends: dict[TopicPartition, int]) -> int:
        if tp not in ends:
            ends[tp] = (await self._groups.positions.end(self._groups.partition_topic(tp)))[0]
        return ends[tp]

    async def lag(
        self, group: str, ends: dict[TopicPartition, int] | None = None, *, read: bool = True
    ) -> dict[str, Any]:
        """The group's numbers (see the module docstring); UnknownGroup when nothing of
        it is stored. ``ends``: end offsets already known (a refresh shares them);
        ``read`` False: the caller caught up with the group's store partition already."""
        store = self._groups.store
        if read:
            await store.read(group)
        ends = {} if ends is None else ends
        doc = store.doc(group, "g")
        docs = store.docs(group)
        if doc is None and not any(k[0] == "o" for k, _ in docs):
            raise UnknownGroup(f"no group {group!r}")
        mode = Mode(doc["mode"]) if doc else Mode.CLUSTERING
        now = _now_ms()
        # the partitions of the topics its members read, and any with a committed offset
        # (the offsets API and transactions commit without joining)
        tps = sorted(
            {(t, p) for t, n in (doc or {}).get("partitions", {}).items() for p in range(int(n))}
            | {(str(k[2]), int(k[3])) for k, _ in docs if k[0] == "o"}
        )
        members = sorted((doc or {}).get("members", {}))
        rows: list[dict[str, Any]] = []
        for tp in tps:
            end = await self._end(tp, ends)
            owners = [""] if mode is Mode.CLUSTERING else members
            rows.extend(self._row(group, mode, owner, tp, end, now) for owner in owners)
            if mode is Mode.BROADCAST and doc is not None:
                minimum = proto.broadcast_minimum(
                    self._groups.broadcast_others(group, doc, "", tp),
                    now,
                    int(doc["broadcastExpireMs"]),
                )
                rows.append(
                    {
                        "topic": tp[0],
                        "partition": tp[1],
                        "member": None,
                        "groupMinimum": minimum,
                        "end": end,
                        "lag": None if minimum is None else max(end - minimum, 0),
                    }
                )
        return {
            "groupId": group,
            "mode": mode.value,
            "generation": (doc or {}).get("generation", 0),
            "partitions": rows,
        }

    def _row(
        self, group: str, mode: Mode, owner: str, tp: TopicPartition, end: int, now: int
    ) -> dict[str, Any]:
        store = self._groups.store
        committed_doc = self._groups.committed_doc(group, mode, owner, tp)
        delivery = store.doc(group, "d", owner, tp[0], tp[1]) or {}
        committed = None if committed_doc is None else int(committed_doc["offset"])
        pulled = None if delivery.get("offset") is None else int(delivery["offset"])
        c = proto.counts(end, committed, pulled)
        oldest = proto.oldest_inflight_ms(
            [(int(o), int(ms)) for o, ms in delivery.get("inflight") or []], c.committed, c.pulled
        )
        row: dict[str, Any] = {
            "topic": tp[0],
            "partition": tp[1],
            "end": c.end,
            "committed": c.committed,
            "pulled": c.pulled,
            "ready": c.ready,
            "inflight": c.inflight,
            "lag": c.lag,
            "oldestInflightMs": None if oldest is None else max(now - oldest, 0),
        }
        if mode is Mode.BROADCAST:
            row["member"] = owner
        return row

    async def refresh(self) -> None:
        """Recompute :attr:`rows` for the groups this sidecar owns (the gauges)."""
        store = self._groups.store
        ends: dict[TopicPartition, int] = {}
        rows: list[LagRow] = []
        for p in range(store.parts.count):
            if not store.parts.owned(p):
                continue
            try:  # once per partition, not once per group (hundreds of idle groups)
                await store.read_partition(p)
            except Exception as exc:
                log.debug("lag: reading store partition %d: %r", p, exc)
                continue
            for group in store.groups_in(p):
                try:
                    body = await self.lag(group, ends, read=False)
                except UnknownGroup:
                    continue
                except Exception as exc:  # one group's trouble does not hide the others
                    log.debug("lag of group %r: %r", group, exc)
                    continue
                rows.extend(_rows(group, body))
        self.rows, self.refreshed_ms = rows, _now_ms()

    # -- the Pulsar subscription that follows committed offsets -------------------------------

    async def follow_cursors(self) -> None:
        """On partitions this sidecar owns: move each group's durable subscription to its
        committed offset (clustering) or the group minimum (broadcast)."""
        store = self._groups.store
        now = _now_ms()
        for p in range(store.parts.count):
            if not store.parts.owned(p):
                continue
            for group in store.groups_in(p):
                for tp, offset, position in self._targets(group, now):
                    if self._cursor_at.get((group, tp)) == offset:
                        continue
                    try:
                        await self._move_cursor(group, tp, offset, position)
                    except (errors.KafkaError, AdminError) as exc:
                        log.debug("subscription of group %r on %s: %r", group, tp, exc)
                        continue
                    self._cursor_at[group, tp] = offset

    def _targets(self, group: str, now: int) -> list[tuple[TopicPartition, int, Position | None]]:
        store = self._groups.store
        doc = store.doc(group, "g")
        out: list[tuple[TopicPartition, int, Position | None]] = []
        if doc is None or Mode(doc["mode"]) is Mode.CLUSTERING:
            for k, d in store.docs(group):
                if k[0] == "o":
                    position = decode_position(d["position"]) if d.get("position") else None
                    out.append(((str(k[2]), int(k[3])), int(d["offset"]), position))
            return out
        seen = {m: int(v["lastSeenMs"]) for m, v in doc.get("members", {}).items()}
        best: dict[TopicPartition, tuple[int, Position | None]] = {}
        for k, d in store.docs(group):
            if k[0] != "b":
                continue
            last = max(seen.get(str(k[2]), 0), int(d.get("seenMs", 0)))
            if now - last > int(doc["broadcastExpireMs"]):
                continue
            tp, offset = (str(k[3]), int(k[4])), int(d["offset"])
            if tp not in best or offset < best[tp][0]:
                position = decode_position(d["position"]) if d.get("position") else None
                best[tp] = (offset, position)
        return [(tp, o, at) for tp, (o, at) in sorted(best.items())]

    async def _cursor_position(
        self, topic: str, offset: int, position: Position | None
    ) -> tuple[int, int, int]:
        """Where the subscription's cursor goes: the entry holding ``offset`` at its batch
        index, or the next entry once the offset is past the last message of one (the
        broker counts an entry with every message acknowledged in its backlog)."""
        positions = self._groups.positions
        if position is None:
            try:
                position = await positions.locate(topic, offset)
            except errors.OffsetOutOfRange:
                first, at = await positions.earliest(topic)
                position = at if offset < first else (await positions.end(topic))[1]
                if position is None:
                    raise
        ledger, entry, batch = position
        if batch > 0:
            found = await self._admin.entry_index(topic, ledger, entry)
            if found is not None and batch >= found[1]:
                return ledger, entry + 1, -1
        return ledger, entry, batch

    async def _move_cursor(
        self, group: str, tp: TopicPartition, offset: int, position: Position | None
    ) -> None:
        topic, sub = self._groups.partition_topic(tp), subscription_name(group)
        ledger, entry, batch = await self._cursor_position(topic, offset, position)
        try:
            await self._admin.move_subscription(topic, sub, ledger, entry, max(batch, 0))
        except AdminError as exc:
            if exc.status != 404:
                raise
            await self._admin.create_subscription(topic, sub)
            await self._admin.move_subscription(topic, sub, ledger, entry, max(batch, 0))


def _rows(group: str, body: dict[str, Any]) -> list[LagRow]:
    out = []
    for r in body["partitions"]:
        minimum = "groupMinimum" in r
        age = r.get("oldestInflightMs")
        out.append(
            LagRow(
                group=group,
                topic=r["topic"],
                partition=r["partition"],
                member=r.get("member"),
                minimum=minimum,
                end=r["end"],
                committed=r["groupMinimum"] if minimum else r["committed"],
                ready=r.get("ready"),
                inflight=r.get("inflight"),
                lag=r["lag"],
                oldest_inflight_s=None if age is None else age / 1000,
            )
        )
    return out
