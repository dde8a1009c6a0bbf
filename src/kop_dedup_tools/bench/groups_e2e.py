"""``kop-dedup bench --groups``, end to end at half load: records produced through
``POST /v1/produce`` (batches of :data:`E2E_BATCH` records over the partitions, paced at
half the best sidecar records/s of the most members) while that many members long-poll
and commit; a record's value starts with the time it was sent, its latency is when the
pull that carried it was answered minus that. The direct baseline at the same rate: a
Pulsar producer per partition (batches of the same size) to the same assignment of
consumers, each message timed when ``receive`` returns it."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kop_dedup_tools.bench.cells import Cell, Row, Workload, extras
from kop_dedup_tools.bench.groups_cells import NAMESPACE, PARTITIONS, join, leave
from kop_dedup_tools.bench.keepalive import KeepAlive, produce_body, records_json
from kop_dedup_tools.bench.support import say
from kop_dedup_tools.measure import percentile_ms
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = ["E2E_BATCH", "WAIT_MS", "end_to_end"]

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
WAIT_MS = 1_000


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
) -> Cell:
    """Produce through the sidecar at ``rate`` while ``members`` members long-poll and
    commit; each record's latency is its pull's answer minus its send time."""
    group = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    assignment = join(sc.url, group, topic, members)
    producer = KeepAlive(sc.url)  # init-producer-id, then each partition's own below
    senders = [KeepAlive(sc.url) for _ in range(PARTITIONS)]
    turns = [asyncio.Lock() for _ in range(PARTITIONS)]
    clients = {m: KeepAlive(sc.url) for m in assignment}
    latencies: list[float] = []
    produced = 0
    received = 0
    producing = True
    pull_body = json.dumps({"maxRecords": 100, "waitMs": WAIT_MS}).encode()
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
        recs = records_json([_stamp(value_size) for _ in range(count)])  # stamped now
        body = produce_body(topic, p, pid, 0, seqs[p], count, recs)
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
    await asyncio.to_thread(leave, sc.url, group, list(assignment))
    return _cell("sidecar", members, rate, seconds, latencies, produced - PARTITIONS)


def _cell(
    target: str, members: int, rate: float, seconds: float, latencies: list[float], expected: int
) -> Cell:
    """The latencies of a paced window of ``seconds`` (its records: those timed)."""
    return Cell(
        Workload("e2e", members, E2E_BATCH, rate),
        target,
        1,
        len(latencies),
        seconds,
        percentile_ms(latencies, 50),
        percentile_ms(latencies, 99),
        extra=extras(expected=expected, max_ms=round(max(latencies, default=0.0) * 1000, 2)),
    )


def _e2e_direct(  # noqa: C901, PLR0915 - one timed scenario, read top to bottom
    client: Any,
    topic: str,
    assignment: list[list[int]],
    rate: float,
    seconds: float,
    value_size: int,
) -> Cell:
    """The same rate through a Pulsar producer per partition (batches of
    :data:`E2E_BATCH`) to consumers on the same assignment; latency at ``receive``."""
    import pulsar  # noqa: PLC0415

    sub = f"bench-e2e-direct-{uuid.uuid4().hex[:8]}"
    consumers = [
        client.subscribe(
            [f"{NAMESPACE}/{topic}-partition-{p}" for p in parts],
            sub,
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Latest,
        )
        for parts in assignment
    ]
    producers = [
        client.create_producer(
            f"{NAMESPACE}/{topic}-partition-{p}",
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
    return _cell("direct", len(assignment), rate, seconds, latencies, expected)


def end_to_end(
    args: argparse.Namespace, sc: SidecarProcess, client: Any, rows: list[Row]
) -> list[Cell]:
    """Half the best sidecar rate of the most members, through both paths."""
    row = max(
        (r for r in rows if r.subject is not None), key=lambda r: r.workload.clients, default=None
    )
    if row is None or row.subject is None:
        return []
    rate = row.subject.records_per_s / 2
    members = row.workload.clients
    assignment = [[p for p in range(PARTITIONS) if p % members == i] for i in range(members)]
    topic = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
    direct = _e2e_direct(client, topic, assignment, rate, args.seconds, args.value_size)
    say(direct.progress())
    topic = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
    sidecar = asyncio.run(_e2e_sidecar(sc, topic, members, rate, args.seconds, args.value_size))
    say(sidecar.progress())
    return [direct, sidecar]
