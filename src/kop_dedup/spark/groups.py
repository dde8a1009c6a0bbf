"""A consumer group's offsets against the data the audit read.

>>> snapshot = read_group("http://127.0.0.1:8090", "payments", ["orders"],
...                       admin_url="http://127.0.0.1:8080")
>>> rows, mismatches = check_groups(records, [snapshot])   # records: kafka_records(...)

Per partition (per member in broadcast mode, plus the group's minimum) the group's
offsets split the partition into ranges, and the audit counts the records each range
holds **in the data it read**:

=============  ======================  ================================================
``consumed``   before ``committed``    the records the group is past (from the earliest
                                       still stored)
``inflight``   ``committed..pulled``   delivered to a member, not committed
``ready``      ``pulled..end``         on the server, not handed out yet
``lag``        ``committed..end``      what the group is behind (inflight + ready)
``later``      from ``end`` on         written after the group's offsets were read
=============  ======================  ================================================

**Where the offsets come from.** A sidecar's ``GET /v1/groups/{group}/lag`` (any sidecar
serves any group): ``end``, ``committed`` and ``pulled`` per partition, as the group's
store has them. They are read **before** the data, so everything below ``end`` was
stored when the data was read (barring retention deleting it meanwhile).

**How offsets meet records.** Offsets are the broker's entry index (messages counted
with no gaps, see :mod:`kop_dedup.pulsar.positions`); the Spark connector gives each
record its Pulsar position (``__messageId``: ledger, entry, batch index) but not its
index. So each boundary offset is located once as a position through the admin API
(a binary search over the entries' index), each record read is placed by its own
position, and the records are counted between the positions. The counts are of
records in the data; the offsets' differences say how many there must be. Any range
where they differ is a **mismatch** (the data does not hold what the index says: a
record not read, or one deleted by retention while the audit ran) and fails the audit.

A committed offset past the end (a client may commit any offset) is clamped to the end
and reported as ``ahead``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from kop_dedup import errors
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.message_ids import MessagePosition
from kop_dedup.pulsar.naming import Naming
from kop_dedup.pulsar.positions import Positions

__all__ = [
    "RANGES",
    "GroupPartition",
    "GroupReportError",
    "GroupSnapshot",
    "check_groups",
    "message_id_decoder",
    "read_group",
    "reconcile",
]

T = TypeVar("T")
Bound = tuple[int, int, int]
BEFORE_ALL: Bound = (-1, -1, -1)
"""The position of an offset in a partition that held nothing: every record is after it."""

RANGES = ("consumed", "inflight", "ready", "lag", "later")
_EXAMPLES = 10


class GroupReportError(RuntimeError):
    """The group's offsets could not be read (unknown group, sidecar away, no entry
    index on the broker)."""


@dataclass(frozen=True)
class GroupPartition:
    """One row of a group's offsets, with the position of each."""

    topic: str
    partition: int
    member: str | None
    """Broadcast: the member; None in clustering mode and for the group's minimum."""
    minimum: bool
    """Broadcast: the group's minimum (``committed`` is it; nothing is pulled)."""
    first: int
    """The earliest offset still stored when the offsets were read."""
    end: int
    committed: int | None
    pulled: int | None
    at: dict[str, Bound] = field(default_factory=dict)
    """Positions of ``first``, ``committed``, ``pulled`` and ``end`` (each clamped to
    first..end), the order records are compared in."""
    oldest_inflight_ms: int | None = None


@dataclass(frozen=True)
class GroupSnapshot:
    group: str
    mode: str
    generation: int
    source: str
    """Where the offsets were read (the lag endpoint's URL)."""
    partitions: list[GroupPartition]
    not_audited: list[str] = field(default_factory=list)
    """Topics the group reads that this audit did not."""


# -- the offsets, from a sidecar -------------------------------------------------------------


def read_group(
    url: str,
    group: str,
    topics: Sequence[str],
    *,
    admin_url: str,
    tenant: str = "public",
    namespace: str = "kafka",
    token: str | None = None,
    timeout_s: float = 30.0,
) -> GroupSnapshot:
    """The group's offsets on ``topics`` (Kafka names) from the sidecar at ``url``, each
    located as a Pulsar position through the broker at ``admin_url``."""
    source = f"{url.rstrip('/')}/v1/groups/{quote(group, safe='')}/lag"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(source, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise GroupReportError(f"group {group!r}: cannot ask {source}: {exc!r}") from exc
    if response.status_code != 200:
        raise GroupReportError(
            f"group {group!r}: {source} answered {response.status_code}: {response.text[:500]}"
        )
    body = response.json()
    wanted = set(topics)
    rows = [r for r in body.get("partitions", []) if r["topic"] in wanted]
    naming = Naming(tenant, namespace, "kop")
    try:
        partitions = _run(_locate(admin_url, naming, rows))
    except errors.KafkaError as exc:
        raise GroupReportError(f"group {group!r}: {exc.message}") from exc
    return GroupSnapshot(
        group=group,
        mode=str(body.get("mode", "clustering")),
        generation=int(body.get("generation", 0)),
        source=source,
        partitions=partitions,
        not_audited=sorted({r["topic"] for r in body.get("partitions", [])} - wanted),
    )


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to the end, also from a thread whose event loop is running (a
    notebook's): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _locate(
    admin_url: str, naming: Naming, rows: list[dict[str, Any]]
) -> list[GroupPartition]:
    admin = PulsarAdmin(admin_url, naming)
    positions = Positions(admin)
    located: dict[tuple[str, int], Bound] = {}
    earliest: dict[str, tuple[int, Bound]] = {}

    async def position(ptopic: str, offset: int, first: int, end: int) -> Bound:
        offset = min(max(offset, first), end)
        if (ptopic, offset) not in located:
            located[ptopic, offset] = _bound(await positions.locate(ptopic, offset))
        return located[ptopic, offset]

    out = []
    try:
        for r in rows:
            topic, part, end = str(r["topic"]), int(r["partition"]), int(r["end"])
            ptopic = naming.partition_topic(topic, part)
            if ptopic not in earliest:
                first, first_at = await positions.earliest(ptopic)
                earliest[ptopic] = (first, _bound(first_at))
            first, first_at = earliest[ptopic]
            first = min(first, end)
            minimum = "groupMinimum" in r
            committed = r.get("groupMinimum") if minimum else r.get("committed")
            pulled = None if minimum else r.get("pulled")
            at = {"first": first_at, "end": await position(ptopic, end, first, end)}
            for name, offset in (("committed", committed), ("pulled", pulled)):
                if offset is not None:
                    at[name] = await position(ptopic, int(offset), first, end)
            out.append(
                GroupPartition(
                    topic=topic,
                    partition=part,
                    member=r.get("member") or None,
                    minimum=minimum,
                    first=first,
                    end=end,
                    committed=None if committed is None else int(committed),
                    pulled=None if pulled is None else int(pulled),
                    at=at,
                    oldest_inflight_ms=r.get("oldestInflightMs"),
                )
            )
    finally:
        await admin.close()
    return out


def _bound(position: MessagePosition | None) -> Bound:
    """A position as the audit compares it: a message sent without batching (batch
    index -1) is batch index 0 of its entry."""
    if position is None:
        return BEFORE_ALL
    return position[0], position[1], max(position[2], 0)


# -- records placed by position ---------------------------------------------------------------


def message_id_decoder() -> Callable[[str | None], tuple[int, int, int] | None]:  # noqa: C901
    """A function from the hex of a serialized Pulsar message id (the connector's
    ``__messageId``: a ``MessageIdData`` protobuf) to (ledger, entry, batch index, -1
    -> 0). Built in a function so that Spark ships it by value: executors need no
    kop-dedup."""

    def decode(hex_id: str | None) -> tuple[int, int, int] | None:  # noqa: C901 - a protobuf walk
        if hex_id is None:
            return None
        data = bytes.fromhex(hex_id)
        fields = {1: -1, 2: -1, 4: -1}
        i, n = 0, len(data)

        def varint() -> int:
            nonlocal i
            value, shift = 0, 0
            while True:
                byte = data[i]
                i += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    return value

        while i < n:
            tag = varint()
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                value = varint()
                if number in fields:
                    fields[number] = value - (1 << 64) if value >= 1 << 63 else value
            elif wire == 1:
                i += 8
            elif wire == 2:
                i += varint()
            elif wire == 5:
                i += 4
            else:
                return None
        if fields[1] < 0 or fields[2] < 0:
            return None
        return fields[1], fields[2], max(fields[4], 0)

    return decode


def check_groups(
    records: Any, snapshots: Sequence[GroupSnapshot]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per group partition with its counts, the mismatches) in one Spark job
    over ``records`` (shaped like :func:`kop_dedup.spark.audit.kafka_records`)."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415
    from pyspark.sql import types as T  # noqa: N812, PLC0415

    rows = [(s, p) for s in snapshots for p in s.partitions]
    if not rows:
        return [], []
    spark = records.sparkSession
    pos = T.StructType(
        [
            T.StructField("ledger", T.LongType()),
            T.StructField("entry", T.LongType()),
            T.StructField("batch", T.LongType()),
        ]
    )
    names = ("committed", "pulled", "end")
    bounds = spark.createDataFrame(
        [(k, p.topic, p.partition, *(p.at.get(n) for n in names)) for k, (_, p) in enumerate(rows)],
        T.StructType(
            [
                T.StructField("row", T.IntegerType()),
                T.StructField("topic", T.StringType()),
                T.StructField("partition", T.IntegerType()),
                *(T.StructField(n, pos) for n in names),
            ]
        ),
    )
    place = F.udf(message_id_decoder(), pos)
    # only the groups' partitions are placed (a Python function per record), each once
    # however many rows a partition has (broadcast: one per member and the minimum)
    placed = (
        records.join(F.broadcast(bounds), ["topic", "partition"], "left_semi")
        .select("topic", "partition", place("message_id").alias("at"))
        .join(F.broadcast(bounds), ["topic", "partition"])
    )
    at, c, p, e = F.col("at"), F.col("committed"), F.col("pulled"), F.col("end")

    def count(condition: Any) -> Any:
        return F.sum(F.when(condition, 1).otherwise(0))

    counted = {
        r["row"]: r.asDict()
        for r in placed.groupBy("row")
        .agg(
            count(at < c).alias("consumed"),
            count((at >= c) & (at < p)).alias("inflight"),
            count((at >= p) & (at < e)).alias("ready"),
            count((at >= c) & (at < e)).alias("lag"),
            count(at >= e).alias("later"),
            count(at.isNull()).alias("unplaced"),
        )
        .collect()
    }
    out, mismatches = [], []
    for k, (snapshot, partition) in enumerate(rows):
        row, bad = reconcile(snapshot.group, partition, counted.get(k, {}))
        out.append(row)
        mismatches += bad
    return out, mismatches


def _expected(partition: GroupPartition) -> dict[str, int | None]:
    """How many records each range must hold, from the offsets alone."""
    first, end = partition.first, partition.end

    def clamp(offset: int | None) -> int | None:
        return None if offset is None else min(max(offset, first), end)

    c, p = clamp(partition.committed), clamp(partition.pulled)
    return {
        "consumed": None if c is None else c - first,
        "inflight": None if c is None or p is None else max(p - c, 0),
        "ready": None if p is None else end - p,
        "lag": None if c is None else end - c,
    }


def reconcile(
    group: str, partition: GroupPartition, counted: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The report row of one group partition (the records counted in each range) and
    a mismatch for each range whose count differs from the offsets' difference."""
    expected = _expected(partition)
    row: dict[str, Any] = {
        "group": group,
        "topic": partition.topic,
        "partition": partition.partition,
        "member": partition.member,
        "minimum": partition.minimum,
        "first": partition.first,
        "committed": partition.committed,
        "pulled": partition.pulled,
        "end": partition.end,
        "ahead": max(partition.committed - partition.end, 0)
        if partition.committed is not None
        else 0,
        "oldestInflightMs": partition.oldest_inflight_ms,
    }
    mismatches = []
    for name in RANGES:
        got = int(counted.get(name) or 0)
        want = expected.get(name, 0)
        if name != "later" and want is None:
            row[name] = None
            continue
        row[name] = got
        if name != "later" and got != want:
            mismatches.append(
                {
                    "group": group,
                    "topic": partition.topic,
                    "partition": partition.partition,
                    "member": partition.member,
                    "range": name,
                    "offsets": want,
                    "records": got,
                }
            )
    if counted.get("unplaced"):
        mismatches.append(
            {
                "group": group,
                "topic": partition.topic,
                "partition": partition.partition,
                "range": "unplaced",
                "records": int(counted["unplaced"]),
            }
        )
    return row, mismatches


def render_groups(
    snapshots: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    mismatches: int,
    examples: Sequence[dict[str, Any]],
) -> list[str]:
    """The group part of the text report."""
    lines = []
    for s in snapshots:
        lines.append(
            f"  group {s['group']} ({s['mode']}, generation {s['generation']}): "
            f"offsets from {s['source']}"
        )
        if s.get("not_audited"):
            lines.append(f"    not audited here: {', '.join(s['not_audited'])}")
        mine = [r for r in rows if r["group"] == s["group"]]
        if not mine:
            lines.append("    no partition of the audited topics")
            continue
        width = max(len(_label(r)) for r in mine)
        lines.append(
            f"    {'partition':<{width}}  {'committed':>9} {'pulled':>9} {'end':>9} |"
            f" {'consumed':>9} {'inflight':>9} {'ready':>9} {'lag':>9} {'later':>7}"
        )
        for r in mine:
            cells = " ".join(f"{_cell(r[n]):>9}" for n in ("consumed", "inflight", "ready", "lag"))
            ahead = f"  (committed {r['ahead']} past the end)" if r.get("ahead") else ""
            lines.append(
                f"    {_label(r):<{width}}  {_cell(r['committed']):>9} {_cell(r['pulled']):>9}"
                f" {r['end']:>9} | {cells} {r['later']:>7}{ahead}"
            )
    if snapshots:
        lines.append(
            "    (records read: consumed before committed, inflight from committed to "
            "pulled, ready from pulled to end, lag from committed to end, later from end on)"
        )
    lines.append(f"  group mismatches    {mismatches}")
    lines += [f"  GROUP-MISMATCH {json.dumps(m, default=str)}" for m in examples[:_EXAMPLES]]
    return lines


def _label(row: dict[str, Any]) -> str:
    if row.get("minimum"):
        return f"{row['topic']}-{row['partition']} (group minimum)"
    who = f" {row['member']}" if row.get("member") else ""
    return f"{row['topic']}-{row['partition']}{who}"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
