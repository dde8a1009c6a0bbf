"""``kop-dedup bench`` (the default mode): the sidecar against a direct Pulsar producer,
cell by cell over batch sizes x producer counts, then both paced at half the sidecar's
peak (the latency the sidecar adds below its limit).

**direct** publishes with the sidecar's own Pulsar producer code (``Publisher``: the
same names, sequence ids and properties); **sidecar** sends the same records through
``POST /v1/produce`` to ``--sidecars`` ``kop-dedup serve`` subprocesses over keep-alive
connections. Both keep up to 5 batches in flight per producer (:func:`drive`). Each cell
runs for ``--seconds`` per target, ``--reps`` times, direct then sidecar, each on a fresh
topic. Results: ``<out>/bench.json`` and ``bench.png``.

>>> cell = asyncio.run(direct_cell(service_url, full_topic(topic), 100, 8, 4.0, 100))
>>> cell = asyncio.run(sidecar_cell(sidecars, topic, 100, 8, 4.0, 100, rate=5_000.0))

Another producer compared with the direct one (a Kafka client, say) is a ``send(producer
index, base sequence)`` coroutine handed to :func:`drive`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup_tools.bench.cells import Cell, Compare, Workload, extras, summarize
from kop_dedup_tools.bench.keepalive import KeepAlive, produce_body, records_json
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.support import (
    Sidecars,
    full_topic,
    new_topic,
    random_values,
    running_sidecars,
    say,
    step,
)
from kop_dedup_tools.measure import percentile

__all__ = ["COMPARE", "Run", "direct_cell", "drive", "run", "run_matrix", "sidecar_cell"]

COMPARE = Compare("sidecar")
TITLE = "kop-dedup sidecar (HTTP) vs a direct Pulsar producer, same broker, same run"


@dataclass
class Run:
    """What one closed-loop (or paced) run measured."""

    batches: int
    seconds: float
    latencies: list[float]


async def drive(
    producers: int,
    batch_size: int,
    seconds: float,
    rate: float | None,
    send: Callable[[int, int], Awaitable[None]],
    in_flight: int = 5,
) -> Run:
    """Each producer sends batches for ``seconds``, up to ``in_flight`` at once, in
    sequence order.

    ``send(producer index, base sequence)`` publishes one batch and returns when it is
    acknowledged (raising when it is not). With ``rate`` (records/s over all producers)
    batches are paced; otherwise each producer sends as fast as its window allows. The
    first failure stops every producer and is raised once the batches in flight end.
    """
    latencies: list[float] = []
    failures: list[Exception] = []
    started = time.monotonic()
    stop = started + seconds

    async def run(i: int) -> None:
        seq = 0
        window = asyncio.Semaphore(in_flight)
        tasks: list[asyncio.Task[None]] = []
        interval = producers * batch_size / rate if rate else 0.0
        next_at = time.monotonic()
        while time.monotonic() < stop and not failures:
            if interval:
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await window.acquire()

            async def one(base: int = seq) -> None:
                try:
                    t0 = time.monotonic()
                    await send(i, base)
                    latencies.append(time.monotonic() - t0)
                except Exception as exc:
                    failures.append(exc)
                finally:
                    window.release()

            tasks.append(asyncio.create_task(one()))
            seq += batch_size
        await asyncio.gather(*tasks)

    await asyncio.gather(*(run(i) for i in range(producers)))
    if failures:
        raise failures[0]
    return Run(len(latencies), time.monotonic() - started, latencies)


def _cell(
    target: str,
    batch_size: int,
    producers: int,
    run: Run,
    rate: float | None,
    rep: int,
    **more: Any,
) -> Cell:
    return Cell(
        Workload("produce", producers, batch_size, rate),
        target,
        rep,
        run.batches * batch_size,
        run.seconds,
        percentile(run.latencies, 50) * 1000,
        percentile(run.latencies, 99) * 1000,
        extra=extras(batches=run.batches),
        **more,
    )


async def direct_cell(
    service_url: str,
    topic: str,
    batch_size: int,
    producers: int,
    seconds: float,
    value_size: int,
    rate: float | None = None,
    rep: int = 1,
    in_flight: int = 5,
) -> Cell:
    from kop_dedup.protocol.records import KafkaBatch, KafkaRecord  # noqa: PLC0415
    from kop_dedup.pulsar.producers import Publisher  # noqa: PLC0415

    pub = Publisher(service_url, send_timeout_ms=30_000)
    records = tuple(KafkaRecord(key=None, value=v) for v in random_values(batch_size, value_size))
    base_pid = int(uuid.uuid4().int % 10**12)
    try:
        prods = [
            await pub.create(f"{topic}-partition-0", f"kop-{base_pid + i}-0")
            for i in range(producers)
        ]

        async def send(i: int, seq: int) -> None:
            last = seq + batch_size - 1
            batch = KafkaBatch(
                topic, 0, base_pid + i, 0, seq % SEQ_MODULUS, last % SEQ_MODULUS, records
            )
            await prods[i].send_batch(batch, last + 1)

        run = await drive(producers, batch_size, seconds, rate, send, in_flight)
        for p in prods:
            await p.close()
    finally:
        await pub.close()
    return _cell("direct", batch_size, producers, run, rate, rep)


async def sidecar_cell(
    sc: Sidecars,
    topic: str,
    batch_size: int,
    producers: int,
    seconds: float,
    value_size: int,
    rate: float | None = None,
    rep: int = 1,
) -> Cell:
    recs = records_json(random_values(batch_size, value_size))
    clients = [KeepAlive(sc.url_for(i)) for i in range(min(producers, len(sc)))]
    try:
        pids = []
        for i in range(producers):
            _, data = await clients[i % len(clients)].post("/v1/init-producer-id", b"{}")
            pids.append(json.loads(data)["producerId"])

        async def send(i: int, seq: int) -> None:
            body = produce_body(topic, 0, pids[i], 0, seq, batch_size, recs)
            status, data = await clients[i % len(clients)].post("/v1/produce", body)
            if status != 200 or json.loads(data)["results"][0]["errorCode"] != 0:
                raise RuntimeError(f"sidecar answered {status}: {data[:300]!r}")

        cpu0 = sc.cpu_seconds()
        run = await drive(producers, batch_size, seconds, rate, send)
        cpu = sc.cpu_seconds() - cpu0
    finally:
        for client in clients:
            await client.close()
    rss = sc.rss_mb()
    return _cell("sidecar", batch_size, producers, run, rate, rep, sidecar_cpu_s=cpu, rss_mb=rss)


def _one(
    args: argparse.Namespace, sc: Sidecars, target: str, size: int, prods: int, **pace: Any
) -> Cell:
    """One cell on a fresh topic."""
    topic = new_topic(args)
    if target == "direct":
        url = args.pulsar_service_url
        cell = direct_cell(
            url, full_topic(topic), size, prods, args.seconds, args.value_size, **pace
        )
    else:
        cell = sidecar_cell(sc, topic, size, prods, args.seconds, args.value_size, **pace)
    return asyncio.run(cell)


def run_matrix(args: argparse.Namespace, sc: Sidecars) -> list[Cell]:
    """Every (batch size, producers, repetition, target) cell, then the half-load pair:
    both paced at half the sidecar's best at 100-record batches and the most producers
    up to 8 (when the matrix has such a cell)."""
    cells: list[Cell] = []
    for size in args.batch_sizes:
        for prods in args.producers:
            for rep in range(1, args.reps + 1):
                for target in ("direct", "sidecar"):
                    what = f"{target} cell (batch {size}, {prods} producers, rep {rep})"
                    with step(what, sc):
                        cells.append(_one(args, sc, target, size, prods, rep=rep))
                    say(cells[-1].progress())
    prods = max((p for p in args.producers if p <= 8), default=0)
    half = Workload("produce", prods, 100)
    peak = next((r for r in summarize(cells, COMPARE) if r.workload == half), None)
    if peak is not None and peak.subject is not None:
        rate = peak.subject.records_per_s / 2
        for target in ("direct", "sidecar"):
            with step(f"the half-load run ({target})", sc):
                cells.append(_one(args, sc, target, 100, prods, rate=rate))
            say(cells[-1].progress())
    return cells


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench``: ``--sidecars`` processes for the run, stopped at the end."""
    with running_sidecars(args, args.sidecars) as sc:
        cells = run_matrix(args, sc)
    notes = []
    if args.sidecars > 1:
        notes.append(
            f"{args.sidecars} sidecar processes, producer i on process i % {args.sidecars}; "
            "cpu and rss are their sum"
        )
    setup = {"sidecars": args.sidecars, "seconds": args.seconds, "value_bytes": args.value_size}
    print(Results("produce", TITLE, COMPARE, cells, setup, broker, notes).write(out))
