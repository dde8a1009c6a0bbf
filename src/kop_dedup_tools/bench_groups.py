"""``kop-dedup bench --groups``: consumer-group pulls through the sidecar against direct
Pulsar consumers on the same topic, in one run.

Per members count (``--members``, default 1 and 8) and repetition, a fresh topic of
:data:`PARTITIONS` partitions is filled with ``--prefill`` records straight through the
Pulsar client (batched), then read by both sides, one after the other (the order
alternates between repetitions):

- **sidecar**: a clustering group (``autoOffsetReset: earliest``) of N members joined
  first; each member loops ``pull {maxRecords: --pull-records, waitMs: 100}`` then an
  empty-body ``commit`` (what was delivered) after every pull that gave records, over
  one kept-alive connection. Measured: records/s, pulls/s, pull and commit latency, the
  sidecar's CPU and RSS. Checked: every partition's offsets come without a gap or a
  repeat, and the committed offsets read back afterwards are exactly what was pulled.
- **direct**: N Pulsar consumers (one thread each), consumer i subscribed to exactly the
  partitions the group gave member i, with an ``Exclusive`` subscription of its own
  from the earliest message: one ordered reader per partition, as the group's
  assignment is (a ``Shared`` subscription would spread each partition's messages over
  consumers and acknowledge them one by one: not what a group member does). Each
  ``batch_receive`` of up to ``--pull-records`` messages is followed by a cumulative
  acknowledgement per partition of the last message received: the direct equivalent
  of pull + commit. (The client groups acknowledgements and sends them within 100 ms;
  it does not wait for the broker, where the sidecar's commit is durable when
  answered.) Subscribing is inside the timed window, as opening the sidecar's readers
  (at the first pull) is.

Each side reads for ``--seconds`` or until it has read everything, whichever comes
first, and its rate is over that time (the direct consumers usually drain the prefill
well within the window). The table, the plot and the JSON's ``summary`` show the best
repetition by records/s of each side on its own (:func:`summarize_groups`, the rule of
:mod:`kop_dedup_tools.bench_results`); the JSON keeps every repetition.

Then **end-to-end latency at half load**: records produced through ``POST
/v1/produce`` (batches of :data:`E2E_BATCH` records over the partitions, paced at half
the best sidecar records/s of the most members) while that many members long-poll
(``waitMs`` 1000) and commit; a record's value starts with the time it was sent, its
latency is when the pull that carried it was answered minus that. The direct baseline
at the same rate: a Pulsar producer per partition (batches of the same size) to the
same assignment of consumers, each message timed when ``receive`` returns it.

Results: ``<out>/groups.json`` and ``<out>/groups.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup_tools.bench import (
    BenchError,
    KeepAlive,
    _machine,
    _say,
    _sidecar,
    _step,
)
from kop_dedup_tools.bench_results import AGGREGATION, Compared, Timed, best_of, reps_label
from kop_dedup_tools.measure import percentile
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = [
    "E2E_BATCH",
    "PARTITIONS",
    "GroupCell",
    "GroupRow",
    "OffsetCheck",
    "add_options",
    "groups_summary_json",
    "render_groups_table",
    "run",
    "run_groups",
    "summarize_groups",
    "write_group_results",
]

PARTITIONS = 8
"""Partitions of each benchmark topic: 8 members get one each."""
E2E_BATCH = 50
"""Records per produced batch in the end-to-end run. Each partition's batches go one at
a time over its own connection (sequence order), so a partition takes at most one batch
per produce round trip: with 10-record batches, half the pull rate of 8 members
(~7,000 records/s, 700 batches/s, one per 11 ms per partition) asked for more batches
than a produce round trip on a busy 2-core machine allows."""
_E2E_BACKLOG_S = 1.0
"""The end-to-end run fails when the batches waiting to be produced are this many
seconds' worth: the sidecar does not keep up (a shorter hiccup only adds latency, which
is measured)."""
_PULL_WAIT_MS = 100
_E2E_WAIT_MS = 1_000
_NS = "persistent://public/kafka"
_LEAVE_TIMEOUT_S = 60.0


# -- what was measured and how it is shown ------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupCell(Timed):
    """One timed read of one side (``direct`` or ``sidecar``) with N members."""

    mode: str
    members: int
    pull_records: int
    rep: int
    records: int
    pulls: int
    """Pulls (direct: batch receives) that gave records, each followed by a commit."""
    seconds: float
    drained: bool
    """Everything prefilled was read before the window ended."""
    cycle_p50_ms: float
    cycle_p99_ms: float
    """A pull and its commit, as the member waited for them."""
    pull_p50_ms: float
    pull_p99_ms: float
    commit_p50_ms: float
    commit_p99_ms: float
    cpu_pct: float | None = None
    rss_mb: float | None = None
    gaps: int = 0
    """Records whose offset was not the next one of its partition (skipped or repeated)."""
    committed_ok: bool | None = None
    """The committed offsets read back equal what was pulled (sidecar only)."""

    @property
    def pulls_per_s(self) -> float:
        return self.pulls / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**Timed.to_dict(self), "pulls_per_s": round(self.pulls_per_s, 1)}


@dataclass(frozen=True, slots=True)
class GroupRow(Compared):
    """One members count: each side's best repetition."""

    members: int
    pull_records: int
    reps: int
    direct: GroupCell | None
    sidecar: GroupCell | None


def summarize_groups(cells: list[GroupCell]) -> list[GroupRow]:
    """The one aggregation (table, plot, JSON): per (members, pull size) and side, the
    repetition with the most records/s (:func:`~kop_dedup_tools.bench_results.best_of`)."""
    return [
        GroupRow(members, size, reps, best.get("direct"), best.get("sidecar"))
        for (members, size), reps, best in best_of(cells, lambda c: (c.members, c.pull_records))
    ]


def groups_summary_json(rows: list[GroupRow]) -> list[dict[str, Any]]:
    """The JSON's ``summary``: the rows the table and the plot show."""
    return [{"members": r.members, "pull_records": r.pull_records, **r.sides_json()} for r in rows]


def _reps_label(rows: list[GroupRow]) -> str:
    return reps_label((r.reps for r in rows), side="side")


def render_groups_table(rows: list[GroupRow]) -> str:
    """A heading that says what the figures are, then one line per members count."""
    head = (
        f"{'memb':>4} {'pull':>4} | {'direct rec/s':>12} {'p50':>6} {'p99':>6} | "
        f"{'sidecar rec/s':>13} {'pulls/s':>7} {'pull50':>6} {'pull99':>6} {'com50':>6} "
        f"{'com99':>6} {'cpu%':>5} {'rss MB':>6} | {'ratio':>5}"
    )
    lines = [
        f"{_reps_label(rows)}; a commit after every pull; latencies in ms "
        "(direct: batch receive + acknowledgement)"
        if rows
        else "no cells",
        head,
        "-" * len(head),
    ]
    for r in rows:
        d, s = r.direct, r.sidecar
        lines.append(
            f"{r.members:>4} {r.pull_records:>4} | "
            + (
                f"{d.records_per_s:>12,.0f} {d.cycle_p50_ms:>6.1f} {d.cycle_p99_ms:>6.1f} | "
                if d
                else " " * 27 + "| "
            )
            + (
                f"{s.records_per_s:>13,.0f} {s.pulls_per_s:>7,.0f} {s.pull_p50_ms:>6.1f} "
                f"{s.pull_p99_ms:>6.1f} {s.commit_p50_ms:>6.1f} {s.commit_p99_ms:>6.1f} "
                f"{s.cpu_pct or 0:>5.0f} {s.rss_mb or 0:>6.0f} | "
                if s
                else " " * 78 + "| "
            )
            + (f"{r.ratio:>5.3f}" if r.ratio is not None else f"{'-':>5}")
        )
    return "\n".join(lines)


def plot_groups(rows: list[GroupRow], e2e: dict[str, Any], path: Path) -> None:
    """records/s per members count (both sides), and the end-to-end latencies."""
    from kop_dedup_tools.bench_results import _pyplot  # noqa: PLC0415

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = list(range(len(rows)))
    for offset, mode in ((-0.2, "direct"), (0.2, "sidecar")):
        axes[0].bar(
            [x + offset for x in xs],
            [getattr(r, mode).records_per_s if getattr(r, mode) else 0 for r in rows],
            width=0.4,
            label=mode,
        )
    axes[0].set_xticks(xs, [f"{r.members} members" for r in rows])
    axes[0].set_yscale("log")
    axes[0].set_title(f"records/s, pulls of {rows[0].pull_records if rows else '-'} + commit")
    axes[0].legend(fontsize=8)
    axes[0].grid(alpha=0.3, axis="y")
    if e2e:
        labels, values = [], []
        for mode in ("direct", "sidecar"):
            for q in ("p50", "p99"):
                if e2e.get(mode):
                    labels.append(f"{mode} {q}")
                    values.append(e2e[mode][f"{q}_ms"])
        axes[1].bar(labels, values)
        axes[1].set_title(
            f"produce -> pull latency (ms) at {e2e['rate']:,.0f} rec/s, {e2e['members']} members"
        )
        axes[1].grid(alpha=0.3, axis="y")
    fig.suptitle(
        "kop-dedup consumer groups vs direct Pulsar consumers "
        f"(same broker, same topics, same run; {_reps_label(rows)})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- checking what was pulled -------------------------------------------------------------


class OffsetCheck:
    """Per partition, the next offset expected: every record must be exactly it (a topic
    filled from nothing counts from 0), so a skip or a repeat is counted.

    >>> c = OffsetCheck()
    >>> c.see(0, 0), c.see(0, 1), c.see(0, 1), c.see(1, 5)
    (True, True, False, False)
    >>> c.gaps, c.next
    (2, {0: 2, 1: 6})
    """

    def __init__(self) -> None:
        self.next: dict[int, int] = {}
        self.gaps = 0

    def see(self, partition: int, offset: int) -> bool:
        ok = offset == self.next.get(partition, 0)
        if not ok:
            self.gaps += 1
        self.next[partition] = offset + 1
        return ok


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000, 2)


# -- filling a topic ----------------------------------------------------------------------


def _fill(client: Any, topic: str, per_partition: int, value_size: int) -> None:
    """``per_partition`` records on each partition, batched, straight to Pulsar."""
    import pulsar  # noqa: PLC0415 - only the benchmark's direct side needs it

    value = b"v" * value_size
    failures: list[str] = []

    def done(result: Any, _msg_id: Any) -> None:
        if result != pulsar.Result.Ok:
            failures.append(str(result))

    producers = [
        client.create_producer(
            f"{_NS}/{topic}-partition-{p}",
            batching_enabled=True,
            batching_max_messages=1000,
            batching_max_publish_delay_ms=5,
            max_pending_messages=10_000,
            block_if_queue_full=True,
        )
        for p in range(PARTITIONS)
    ]
    try:
        for _ in range(per_partition):
            for producer in producers:
                producer.send_async(value, done)
        for producer in producers:
            producer.flush()
    finally:
        for producer in producers:
            producer.close()
    if failures:
        raise BenchError(f"prefill: {len(failures)} sends failed, first: {failures[0]}")


# -- the sidecar side ---------------------------------------------------------------------


def _join(url: str, group: str, topic: str, members: int) -> dict[str, list[int]]:
    """A clustering group from the earliest offset, ``members`` members joined; their
    partitions (all joined first, so the assignment does not move while measuring)."""
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.put(
            f"/v1/groups/{group}",
            json={"mode": "clustering", "autoOffsetReset": "earliest", "sessionTimeoutMs": 60_000},
        )
        r.raise_for_status()
        ids = [f"m-{i:02d}" for i in range(members)]
        for m in ids:
            r = c.post(f"/v1/groups/{group}/members", json={"memberId": m, "topics": [topic]})
            r.raise_for_status()
        r = c.get(f"/v1/groups/{group}")
        r.raise_for_status()
        assignment = r.json()["assignment"]
    return {m: [p for a in assignment.get(m, []) for p in a["partitions"]] for m in ids}


def _committed(url: str, group: str) -> dict[int, int]:
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.get(f"/v1/groups/{group}/offsets")
        r.raise_for_status()
        body = r.json()
    return {int(o["partition"]): int(o["offset"]) for o in body["offsets"]}


def _leave(url: str, group: str, members: list[str]) -> None:
    with httpx.Client(base_url=url, timeout=_LEAVE_TIMEOUT_S) as c:
        for m in members:
            c.delete(f"/v1/groups/{group}/members/{m}")


async def _sidecar_cell(
    sc: SidecarProcess,
    group: str,
    assignment: dict[str, list[int]],
    pull_records: int,
    seconds: float,
    per_partition: int,
    rep: int,
) -> tuple[GroupCell, dict[int, int]]:
    pull_body = json.dumps({"maxRecords": pull_records, "waitMs": _PULL_WAIT_MS}).encode()
    check = OffsetCheck()
    pulls: list[float] = []
    commits: list[float] = []
    cycles: list[float] = []
    records = 0
    clients = {m: KeepAlive(sc.url) for m in assignment}
    started = time.monotonic()
    stop = started + seconds

    async def member(m: str, parts: list[int]) -> None:
        nonlocal records
        client = clients[m]
        base = f"/v1/groups/{group}/members/{m}"
        while time.monotonic() < stop:
            if all(check.next.get(p, 0) >= per_partition for p in parts):
                return  # drained
            t0 = time.monotonic()
            status, data = await client.post(f"{base}/pull", pull_body)
            t1 = time.monotonic()
            if status != 200:
                raise RuntimeError(f"pull answered {status}: {data[:300]!r}")
            got = json.loads(data)["records"]
            pulls.append(t1 - t0)
            if not got:
                continue
            for rec in got:
                check.see(int(rec["partition"]), int(rec["offset"]))
            status, data = await client.post(f"{base}/commit", b"{}")
            t2 = time.monotonic()
            if status != 200:
                raise RuntimeError(f"commit answered {status}: {data[:300]!r}")
            commits.append(t2 - t1)
            cycles.append(t2 - t0)
            records += len(got)

    cpu0 = sc.cpu_seconds()
    try:
        await asyncio.gather(*(member(m, parts) for m, parts in assignment.items()))
        elapsed = time.monotonic() - started
        cpu = sc.cpu_seconds() - cpu0
    finally:
        for client in clients.values():
            await client.close()
    pulled = dict(check.next)
    cell = GroupCell(
        "sidecar",
        len(assignment),
        pull_records,
        rep,
        records,
        len(cycles),
        elapsed,
        all(pulled.get(p, 0) >= per_partition for p in range(PARTITIONS)),
        _ms(cycles, 50),
        _ms(cycles, 99),
        _ms(pulls, 50),
        _ms(pulls, 99),
        _ms(commits, 50),
        _ms(commits, 99),
        cpu_pct=round(100 * cpu / elapsed, 1),
        rss_mb=round(sc.rss_mb(), 1),
        gaps=check.gaps,
    )
    return cell, pulled


def _sidecar_run(
    sc: SidecarProcess,
    topic: str,
    members: int,
    pull_records: int,
    seconds: float,
    per_partition: int,
    rep: int,
) -> tuple[GroupCell, dict[str, list[int]]]:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    assignment = _join(sc.url, group, topic, members)
    cell, pulled = asyncio.run(
        _sidecar_cell(sc, group, assignment, pull_records, seconds, per_partition, rep)
    )
    committed = _committed(sc.url, group)
    ok = all(committed.get(p, 0) == n for p, n in pulled.items()) and sum(
        committed.values()
    ) == sum(pulled.values())
    _leave(sc.url, group, list(assignment))
    fields_ = {**asdict(cell), "committed_ok": ok}
    return GroupCell(**fields_), assignment


# -- the direct side ----------------------------------------------------------------------


def _direct_cell(  # noqa: PLR0915 - one timed scenario, read top to bottom
    client: Any,
    topic: str,
    assignment: list[list[int]],
    pull_records: int,
    seconds: float,
    per_partition: int,
    rep: int,
) -> GroupCell:
    """One consumer (thread) per member on exactly its partitions (see the module
    docstring); subscribing is timed."""
    import pulsar  # noqa: PLC0415 - only the benchmark's direct side needs it

    sub = f"bench-direct-{uuid.uuid4().hex[:8]}"
    lock = threading.Lock()
    receives: list[float] = []
    acks: list[float] = []
    cycles: list[float] = []
    counts = [0] * len(assignment)
    pulls = [0] * len(assignment)
    failures: list[BaseException] = []
    go = threading.Barrier(len(assignment) + 1)
    started = 0.0

    def consume(i: int, parts: list[int]) -> None:
        try:
            go.wait()
            consumer = client.subscribe(
                [f"{_NS}/{topic}-partition-{p}" for p in parts],
                sub,
                consumer_type=pulsar.ConsumerType.Exclusive,
                initial_position=pulsar.InitialPosition.Earliest,
                batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(pull_records, -1, 10),
            )
            mine_r, mine_a, mine_c = [], [], []
            try:
                want = per_partition * len(parts)
                while counts[i] < want and time.monotonic() < started + seconds:
                    t0 = time.monotonic()
                    msgs = consumer.batch_receive()
                    t1 = time.monotonic()
                    mine_r.append(t1 - t0)
                    if not msgs:
                        continue
                    last = {}
                    for msg in msgs:
                        last[msg.topic_name()] = msg
                    for msg in last.values():
                        consumer.acknowledge_cumulative(msg)
                    t2 = time.monotonic()
                    mine_a.append(t2 - t1)
                    mine_c.append(t2 - t0)
                    counts[i] += len(msgs)
                    pulls[i] += 1
            finally:
                consumer.close()
            with lock:
                receives.extend(mine_r)
                acks.extend(mine_a)
                cycles.extend(mine_c)
        except BaseException as exc:  # raised again in the caller's thread
            failures.append(exc)

    threads = [
        threading.Thread(target=consume, args=(i, parts), daemon=True)
        for i, parts in enumerate(assignment)
    ]
    for t in threads:
        t.start()
    started = time.monotonic()
    go.wait()
    ended = started
    for t in threads:
        t.join()
    ended = time.monotonic()
    if failures:
        raise failures[0]
    total = PARTITIONS * per_partition
    return GroupCell(
        "direct",
        len(assignment),
        pull_records,
        rep,
        sum(counts),
        sum(pulls),
        ended - started,
        sum(counts) >= total,
        _ms(cycles, 50),
        _ms(cycles, 99),
        _ms(receives, 50),
        _ms(receives, 99),
        _ms(acks, 50),
        _ms(acks, 99),
    )


# -- the throughput matrix ----------------------------------------------------------------


def _client(service_url: str) -> Any:
    import pulsar  # noqa: PLC0415

    return pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def run_groups(
    args: argparse.Namespace, sc: SidecarProcess
) -> tuple[list[GroupCell], dict[str, Any]]:
    """Every (members, repetition, side) cell, then the end-to-end run at half load."""
    per_partition = max(1, args.prefill // PARTITIONS)
    cells: list[GroupCell] = []
    client = _client(args.pulsar_service_url)
    try:
        for members in args.members:
            for rep in range(1, args.reps + 1):
                topic = f"bench-groups-{uuid.uuid4().hex[:8]}"
                with _step(f"filling {topic} ({members} members, rep {rep})", sc):
                    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
                    t0 = time.monotonic()
                    _fill(client, topic, per_partition, args.value_size)
                _say(
                    f"bench: groups: {topic} filled with {per_partition * PARTITIONS:,} "
                    f"records in {time.monotonic() - t0:.1f}s"
                )
                order = ("sidecar", "direct") if rep % 2 else ("direct", "sidecar")
                assignment: list[list[int]] = [
                    [p for p in range(PARTITIONS) if p % members == i] for i in range(members)
                ]
                for mode in order:
                    what = f"groups {mode} cell ({members} members, rep {rep})"
                    with _step(what, sc):
                        if mode == "sidecar":
                            cell, given = _sidecar_run(
                                sc,
                                topic,
                                members,
                                args.pull_records,
                                args.seconds,
                                per_partition,
                                rep,
                            )
                            assignment = [given[m] for m in sorted(given)]
                        else:
                            cell = _direct_cell(
                                client,
                                topic,
                                assignment,
                                args.pull_records,
                                args.seconds,
                                per_partition,
                                rep,
                            )
                    cells.append(cell)
                    _say(_progress(cell))
        with _step("the end-to-end run at half load", sc):
            e2e = _end_to_end(args, sc, client, summarize_groups(cells))
    finally:
        client.close()
    return cells, e2e


def _progress(cell: GroupCell) -> str:
    extra = (
        f", commit p99 {cell.commit_p99_ms:.1f} ms, cpu {cell.cpu_pct:.0f}%, "
        f"gaps {cell.gaps}, committed as pulled: {cell.committed_ok}"
        if cell.mode == "sidecar"
        else ""
    )
    return (
        f"bench: groups {cell.members:>2} members rep {cell.rep} {cell.mode:>7}: "
        f"{cell.records_per_s:>9,.0f} rec/s over {cell.seconds:.2f}s"
        f"{' (drained)' if cell.drained else ''}, cycle p99 {cell.cycle_p99_ms:.1f} ms{extra}"
    )


# -- end to end at half load --------------------------------------------------------------


def _stamp(value_size: int) -> bytes:
    """A value that starts with the time it is made (ns, 20 digits)."""
    return f"{time.time_ns():020d}:".encode().ljust(value_size, b"x")


def _sent_ns(value: bytes) -> int:
    return int(value[:20])


async def _e2e_sidecar(  # noqa: C901, PLR0915 - one timed scenario, read top to bottom
    sc: SidecarProcess,
    topic: str,
    members: int,
    rate: float,
    seconds: float,
    value_size: int,
) -> dict[str, Any]:
    """Produce through the sidecar at ``rate`` while ``members`` members long-poll and
    commit; each record's latency is its pull's answer minus its send time."""
    group = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    assignment = _join(sc.url, group, topic, members)
    producer = KeepAlive(sc.url)  # init-producer-id, then each partition's own below
    senders = [KeepAlive(sc.url) for _ in range(PARTITIONS)]
    turns = [asyncio.Lock() for _ in range(PARTITIONS)]
    clients = {m: KeepAlive(sc.url) for m in assignment}
    latencies: list[float] = []
    produced = 0
    received = 0
    producing = True
    pull_body = json.dumps({"maxRecords": 100, "waitMs": _E2E_WAIT_MS}).encode()
    _, data = await producer.post("/v1/init-producer-id", b"{}")
    pid = json.loads(data)["producerId"]
    seqs = [0] * PARTITIONS

    async def produce(p: int, count: int) -> None:
        # one connection per partition, one request on it at a time (HTTP/1.1), in
        # sequence order: a paced batch that finds its partition busy waits its turn
        async with turns[p]:
            await _send(p, count)

    async def _send(p: int, count: int) -> None:
        nonlocal produced
        values = [
            base64.b64encode(_stamp(value_size)).decode() for _ in range(count)
        ]  # stamped now
        recs = ",".join(f'{{"value":"{v}"}}' for v in values)
        body = (
            f'{{"batches":[{{"topic":"{topic}","partition":{p},"producerId":{pid},'
            f'"producerEpoch":0,"baseSequence":{seqs[p] % SEQ_MODULUS},'
            f'"lastSequence":{(seqs[p] + count - 1) % SEQ_MODULUS},"records":[{recs}]}}]}}'
        ).encode()
        seqs[p] += count
        status, answer = await senders[p].post("/v1/produce", body)
        if status != 200 or json.loads(answer)["results"][0]["errorCode"] != 0:
            raise RuntimeError(f"produce answered {status}: {answer[:300]!r}")
        produced += count

    async def member(m: str, timed: Callable[[], bool]) -> None:
        nonlocal received
        client = clients[m]
        base = f"/v1/groups/{group}/members/{m}"
        while producing or received < produced:
            status, data = await client.post(f"{base}/pull", pull_body)
            now = time.time_ns()
            if status != 200:
                raise RuntimeError(f"pull answered {status}: {data[:300]!r}")
            got = json.loads(data)["records"]
            if not got:
                continue
            if timed():
                latencies.extend((now - _sent_ns(base64.b64decode(r["value"]))) / 1e9 for r in got)
            received += len(got)
            status, data = await client.post(f"{base}/commit", b"{}")
            if status != 200:
                raise RuntimeError(f"commit answered {status}: {data[:300]!r}")

    timing = False
    pending: set[asyncio.Task[None]] = set()
    try:
        tasks = [
            asyncio.create_task(member(m, lambda: timing)) for m in assignment
        ]  # readers open on the warm-up records below
        for p in range(PARTITIONS):
            await produce(p, 1)
        deadline = time.monotonic() + 60
        while received < produced and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # two counters moved by several tasks
        timing = True
        interval = E2E_BATCH / rate
        started = time.monotonic()
        next_at, n = started, 0
        while time.monotonic() < started + seconds:
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            task = asyncio.create_task(produce(n % PARTITIONS, E2E_BATCH))
            pending.add(task)
            task.add_done_callback(pending.discard)
            n += 1
            if len(pending) > max(2 * PARTITIONS, rate * _E2E_BACKLOG_S / E2E_BATCH):
                raise RuntimeError(
                    f"the sidecar does not keep up with the produce rate: more than "
                    f"{_E2E_BACKLOG_S:g} s of batches wait to be sent"
                )
        await asyncio.gather(*pending)
        producing = False
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    finally:
        producing = False
        for t in [*tasks, *pending]:
            t.cancel()
        await asyncio.gather(*tasks, *pending, return_exceptions=True)
        await producer.close()
        for client in [*senders, *clients.values()]:
            await client.close()
    await asyncio.to_thread(_leave, sc.url, group, list(assignment))
    return _latency_summary(latencies, produced - PARTITIONS)


def _latency_summary(latencies: list[float], expected: int) -> dict[str, Any]:
    return {
        "records": len(latencies),
        "expected": expected,
        "p50_ms": _ms(latencies, 50),
        "p99_ms": _ms(latencies, 99),
        "max_ms": round(max(latencies, default=0.0) * 1000, 2),
    }


def _e2e_direct(  # noqa: C901, PLR0915 - one timed scenario, read top to bottom
    client: Any,
    topic: str,
    assignment: list[list[int]],
    rate: float,
    seconds: float,
    value_size: int,
) -> dict[str, Any]:
    """The same rate through a Pulsar producer per partition (batches of
    :data:`E2E_BATCH`) to consumers on the same assignment; latency at ``receive``."""
    import pulsar  # noqa: PLC0415

    sub = f"bench-e2e-direct-{uuid.uuid4().hex[:8]}"
    consumers = [
        client.subscribe(
            [f"{_NS}/{topic}-partition-{p}" for p in parts],
            sub,
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Latest,
        )
        for parts in assignment
    ]
    producers = [
        client.create_producer(
            f"{_NS}/{topic}-partition-{p}",
            batching_enabled=True,
            batching_max_messages=E2E_BATCH,
            batching_max_publish_delay_ms=10,
        )
        for p in range(PARTITIONS)
    ]
    latencies: list[float] = []
    lock = threading.Lock()
    expected = 0
    producing = threading.Event()
    producing.set()
    failures: list[BaseException] = []

    def consume(consumer: Any) -> None:
        mine: list[float] = []
        try:
            while producing.is_set() or len(latencies) + len(mine) < expected:
                try:
                    msg = consumer.receive(200)
                except pulsar.Timeout:
                    if not producing.is_set():
                        break
                    continue
                mine.append((time.time_ns() - _sent_ns(msg.data())) / 1e9)
                consumer.acknowledge_cumulative(msg)
        except BaseException as exc:  # raised again in the caller's thread
            failures.append(exc)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=consume, args=(c,), daemon=True) for c in consumers]
    try:
        for t in threads:
            t.start()
        interval = E2E_BATCH / rate
        started = time.monotonic()
        next_at, n = started, 0
        while time.monotonic() < started + seconds:
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
            producer = producers[n % PARTITIONS]
            for _ in range(E2E_BATCH):
                producer.send_async(_stamp(value_size), None)
            expected += E2E_BATCH
            n += 1
        for producer in producers:
            producer.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if len(latencies) >= expected:
                    break
            if not any(t.is_alive() for t in threads):
                break
            time.sleep(0.05)
    finally:
        producing.clear()
        for t in threads:
            t.join(timeout=30)
        for producer in producers:
            producer.close()
        for consumer in consumers:
            consumer.close()
    if failures:
        raise failures[0]
    return _latency_summary(latencies, expected)


def _end_to_end(
    args: argparse.Namespace, sc: SidecarProcess, client: Any, rows: list[GroupRow]
) -> dict[str, Any]:
    """Half the best sidecar rate of the most members, through both paths."""
    row = max((r for r in rows if r.sidecar is not None), key=lambda r: r.members, default=None)
    if row is None or row.sidecar is None:
        return {}
    rate = row.sidecar.records_per_s / 2
    members = row.members
    assignment = [[p for p in range(PARTITIONS) if p % members == i] for i in range(members)]
    topic = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
    direct = _e2e_direct(client, topic, assignment, rate, args.seconds, args.value_size)
    topic = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
    sidecar = asyncio.run(_e2e_sidecar(sc, topic, members, rate, args.seconds, args.value_size))
    _say(
        f"bench: groups end to end at {rate:,.0f} rec/s, {members} members: direct p50 "
        f"{direct['p50_ms']:.1f} ms p99 {direct['p99_ms']:.1f} ms; sidecar p50 "
        f"{sidecar['p50_ms']:.1f} ms p99 {sidecar['p99_ms']:.1f} ms"
    )
    return {
        "rate": rate,
        "members": members,
        "produce_batch": E2E_BATCH,
        "wait_ms": _E2E_WAIT_MS,
        "direct": direct,
        "sidecar": sidecar,
        "added_p50_ms": round(sidecar["p50_ms"] - direct["p50_ms"], 2),
        "added_p99_ms": round(sidecar["p99_ms"] - direct["p99_ms"], 2),
    }


# -- results and the command --------------------------------------------------------------


def write_group_results(
    out: Path, cells: list[GroupCell], e2e: dict[str, Any], broker: dict[str, Any]
) -> str:
    """groups.json and groups.png from one aggregation of ``cells``; the report to print."""
    rows = summarize_groups(cells)
    results = {
        "machine": _machine(),
        "broker": broker,
        "aggregation": AGGREGATION.replace("mode", "side"),
        "partitions": PARTITIONS,
        "summary": groups_summary_json(rows),
        "cells": [c.to_dict() for c in cells],
        "end_to_end": e2e,
    }
    (out / "groups.json").write_text(json.dumps(results, indent=2))
    plot_groups(rows, e2e, out / "groups.png")
    report = [render_groups_table(rows)]
    if e2e:
        d, s = e2e["direct"], e2e["sidecar"]
        report.append(
            f"\nproduce -> pull at {e2e['rate']:,.0f} rec/s (half the sidecar's best with "
            f"{e2e['members']} members): sidecar p50 {s['p50_ms']:.1f} ms p99 "
            f"{s['p99_ms']:.1f} ms; direct p50 {d['p50_ms']:.1f} ms p99 {d['p99_ms']:.1f} ms"
        )
    report.append(f"\nwrote {out / 'groups.json'} and {out / 'groups.png'}")
    return "\n".join(report)


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --groups``: one sidecar for the run, stopped at the end."""
    if not all(1 <= m <= PARTITIONS for m in args.members):
        raise BenchError(f"--members must be between 1 and {PARTITIONS} (the topic's partitions)")
    sc = _sidecar(args)
    try:
        cells, e2e = run_groups(args, sc)
    finally:
        sc.stop()
    print(write_group_results(out, cells, e2e, broker))


def add_options(p: argparse.ArgumentParser) -> None:
    """The ``--groups`` options of ``kop-dedup bench``."""
    p.add_argument(
        "--groups",
        action="store_true",
        help="consumer-group pulls (a commit after each) against direct Pulsar consumers, "
        "and produce -> pull latency at half load (groups.json, groups.png)",
    )
    p.add_argument("--members", type=int, nargs="+", default=[1, 8], help="with --groups")
    p.add_argument("--pull-records", type=int, default=100, help="with --groups: maxRecords")
    p.add_argument(
        "--prefill",
        type=int,
        default=200_000,
        help="with --groups: records written per members count and repetition",
    )
