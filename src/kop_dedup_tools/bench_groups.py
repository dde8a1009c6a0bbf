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

Results: ``<out>/groups.json`` and ``<out>/groups.png``
(:mod:`kop_dedup_tools.bench_groups_results`); the end-to-end run is
:mod:`kop_dedup_tools.bench_groups_e2e`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from kop_dedup_tools.bench_groups_results import GroupCell, summarize_groups, write_group_results
from kop_dedup_tools.bench_http import KeepAlive
from kop_dedup_tools.bench_support import BenchError, BenchMode, say, start_sidecar, step
from kop_dedup_tools.measure import percentile
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = ["MODE", "PARTITIONS", "OffsetCheck", "add_options", "run", "run_groups"]

PARTITIONS = 8
"""Partitions of each benchmark topic: 8 members get one each."""
_PULL_WAIT_MS = 100
_NS = "persistent://public/kafka"
_LEAVE_TIMEOUT_S = 60.0


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
                with step(f"filling {topic} ({members} members, rep {rep})", sc):
                    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
                    t0 = time.monotonic()
                    _fill(client, topic, per_partition, args.value_size)
                say(
                    f"bench: groups: {topic} filled with {per_partition * PARTITIONS:,} "
                    f"records in {time.monotonic() - t0:.1f}s"
                )
                order = ("sidecar", "direct") if rep % 2 else ("direct", "sidecar")
                assignment: list[list[int]] = [
                    [p for p in range(PARTITIONS) if p % members == i] for i in range(members)
                ]
                for mode in order:
                    what = f"groups {mode} cell ({members} members, rep {rep})"
                    with step(what, sc):
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
                    say(_progress(cell))
        from kop_dedup_tools.bench_groups_e2e import end_to_end  # noqa: PLC0415 - it builds on this module

        with step("the end-to-end run at half load", sc):
            e2e = end_to_end(args, sc, client, summarize_groups(cells))
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


# -- results and the command --------------------------------------------------------------


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --groups``: one sidecar for the run, stopped at the end."""
    if not all(1 <= m <= PARTITIONS for m in args.members):
        raise BenchError(f"--members must be between 1 and {PARTITIONS} (the topic's partitions)")
    sc = start_sidecar(args)
    try:
        cells, e2e = run_groups(args, sc)
    finally:
        sc.stop()
    print(write_group_results(out, cells, e2e, broker, partitions=PARTITIONS))


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


MODE = BenchMode(("groups",), add_options, run)
