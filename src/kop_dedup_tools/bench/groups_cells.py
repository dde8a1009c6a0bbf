"""The cells of ``kop-dedup bench --groups``: a topic filled, then read by each side.

- **sidecar** (:func:`sidecar_run`): a clustering group (``autoOffsetReset: earliest``)
  of N members joined first; each member loops ``pull {maxRecords: --pull-records,
  waitMs: 100}`` then an empty-body ``commit`` (what was delivered) after every pull
  that gave records, over one kept-alive connection. Measured: records/s, pulls/s, pull
  and commit latency, the sidecar's CPU and RSS. Checked: every partition's offsets
  come without a gap or a repeat (:class:`OffsetCheck`), and the committed offsets read
  back afterwards are exactly what was pulled.
- **direct** (:func:`direct_cell`): N Pulsar consumers (one thread each), consumer i
  subscribed to exactly the partitions the group gave member i, with an ``Exclusive``
  subscription of its own from the earliest message: one ordered reader per partition,
  as the group's assignment is (a ``Shared`` subscription would spread each partition's
  messages over consumers and acknowledge them one by one: not what a group member
  does). Each ``batch_receive`` of up to ``--pull-records`` messages is followed by a
  cumulative acknowledgement per partition of the last message received: the direct
  equivalent of pull + commit. (The client groups acknowledgements and sends them
  within 100 ms; it does not wait for the broker, where the sidecar's commit is durable
  when answered.) Subscribing is inside the timed window, as opening the sidecar's
  readers (at the first pull) is.

Each side reads for ``--seconds`` or until it has read everything, whichever comes
first, and its rate is over that time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import httpx

from kop_dedup_tools.bench.cells import Cell, Workload, extras
from kop_dedup_tools.bench.keepalive import KeepAlive
from kop_dedup_tools.bench.support import BenchError
from kop_dedup_tools.measure import percentile_ms
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = [
    "NAMESPACE",
    "PARTITIONS",
    "OffsetCheck",
    "committed_offsets",
    "direct_cell",
    "fill",
    "group_cell",
    "join",
    "leave",
    "pulsar_client",
    "sidecar_run",
]

PARTITIONS = 8
"""Partitions of each benchmark topic: 8 members get one each."""
_PULL_WAIT_MS = 100
NAMESPACE = "persistent://public/kafka"
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


def group_cell(
    workload: Workload,
    target: str,
    rep: int,
    records: int,
    seconds: float,
    timings: tuple[list[float], list[float], list[float]],
    *,
    sidecar_cpu_s: float | None = None,
    rss_mb: float | None = None,
    **figures: Any,
) -> Cell:
    """A cell of members reading: ``timings`` are the cycles (a pull and its commit: the
    cell's latency), the pulls alone and the commits alone; ``figures`` its own."""
    cycles, pulls, commits = timings
    return Cell(
        workload,
        target,
        rep,
        records,
        seconds,
        percentile_ms(cycles, 50),
        percentile_ms(cycles, 99),
        sidecar_cpu_s,
        rss_mb,
        extras(
            pulls=len(cycles),
            pull_p50_ms=percentile_ms(pulls, 50),
            pull_p99_ms=percentile_ms(pulls, 99),
            commit_p50_ms=percentile_ms(commits, 50),
            commit_p99_ms=percentile_ms(commits, 99),
            **figures,
        ),
    )


# -- filling a topic ----------------------------------------------------------------------


def fill(client: Any, topic: str, per_partition: int, value_size: int) -> None:
    """``per_partition`` records on each partition, batched, straight to Pulsar."""
    import pulsar  # noqa: PLC0415 - only the benchmark's direct side needs it

    value = b"v" * value_size
    failures: list[str] = []

    def done(result: Any, _msg_id: Any) -> None:
        if result != pulsar.Result.Ok:
            failures.append(str(result))

    producers = [
        client.create_producer(
            f"{NAMESPACE}/{topic}-partition-{p}",
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


def join(url: str, group: str, topic: str, members: int) -> dict[str, list[int]]:
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


def committed_offsets(url: str, group: str) -> dict[int, int]:
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.get(f"/v1/groups/{group}/offsets")
        r.raise_for_status()
        body = r.json()
    return {int(o["partition"]): int(o["offset"]) for o in body["offsets"]}


def leave(url: str, group: str, members: list[str]) -> None:
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
) -> tuple[Cell, dict[int, int]]:
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
    cell = group_cell(
        Workload("pull", len(assignment), pull_records),
        "sidecar",
        rep,
        records,
        elapsed,
        (cycles, pulls, commits),
        sidecar_cpu_s=cpu,
        rss_mb=round(sc.rss_mb(), 1),
        drained=all(pulled.get(p, 0) >= per_partition for p in range(PARTITIONS)),
        gaps=check.gaps,
    )
    return cell, pulled


def sidecar_run(
    sc: SidecarProcess,
    topic: str,
    members: int,
    pull_records: int,
    seconds: float,
    per_partition: int,
    rep: int,
) -> tuple[Cell, dict[str, list[int]]]:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    assignment = join(sc.url, group, topic, members)
    cell, pulled = asyncio.run(
        _sidecar_cell(sc, group, assignment, pull_records, seconds, per_partition, rep)
    )
    committed = committed_offsets(sc.url, group)
    ok = all(committed.get(p, 0) == n for p, n in pulled.items()) and sum(
        committed.values()
    ) == sum(pulled.values())
    leave(sc.url, group, list(assignment))
    return replace(cell, extra={**cell.extra, "committed_ok": ok}), assignment


# -- the direct side ----------------------------------------------------------------------


def direct_cell(
    client: Any,
    topic: str,
    assignment: list[list[int]],
    pull_records: int,
    seconds: float,
    per_partition: int,
    rep: int,
    kind: str = "pull",
) -> Cell:
    """One consumer (thread) per member on exactly its partitions (see the module
    docstring); subscribing is timed. ``kind``: the workload it is the baseline of."""
    import pulsar  # noqa: PLC0415 - only the benchmark's direct side needs it

    sub = f"bench-direct-{uuid.uuid4().hex[:8]}"
    lock = threading.Lock()
    receives: list[float] = []
    acks: list[float] = []
    cycles: list[float] = []
    counts = [0] * len(assignment)
    failures: list[BaseException] = []
    go = threading.Barrier(len(assignment) + 1)
    started = 0.0

    def consume(i: int, parts: list[int]) -> None:
        try:
            go.wait()
            consumer = client.subscribe(
                [f"{NAMESPACE}/{topic}-partition-{p}" for p in parts],
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
    for t in threads:
        t.join()
    ended = time.monotonic()
    if failures:
        raise failures[0]
    return group_cell(
        Workload(kind, len(assignment), pull_records),
        "direct",
        rep,
        sum(counts),
        ended - started,
        (cycles, receives, acks),
        drained=sum(counts) >= PARTITIONS * per_partition,
    )


def pulsar_client(service_url: str) -> Any:
    """A Pulsar client for the direct side and the filling (warnings only)."""
    import pulsar  # noqa: PLC0415 - only the benchmark's direct side needs it

    return pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
