"""Producing for a timed window, as the benchmark measures it: the driver (each producer
up to 5 batches in flight, in sequence order, at full speed or paced) and the two
producers the matrix compares: **direct**, the sidecar's own Pulsar producer code
(``Publisher``) with the same names, sequence ids and properties, and **sidecar**,
``POST /v1/produce`` over keep-alive connections.

>>> cell = asyncio.run(direct_cell(service_url, full_topic(topic), 100, 8, 4.0, 100))
>>> cell = asyncio.run(sidecar_cell(sidecars, topic, 100, 8, 4.0, 100, rate=5_000.0))

Another producer compared with the direct one (a Kafka client, say) is a ``send(producer
index, base sequence)`` coroutine handed to :func:`drive`, its result made a cell by
:func:`timed_cell`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup_tools.bench_http import KeepAlive
from kop_dedup_tools.bench_results import Cell
from kop_dedup_tools.bench_support import Sidecars
from kop_dedup_tools.measure import percentile

__all__ = ["Run", "direct_cell", "drive", "random_values", "sidecar_cell", "timed_cell"]


def random_values(n: int, size: int) -> list[bytes]:
    return [os.urandom(size // 2).hex().encode()[:size] for _ in range(n)]


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
) -> Run:
    """Each producer sends batches for ``seconds``, up to 5 in flight, in sequence order.

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
        window = asyncio.Semaphore(5)
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


def timed_cell(mode: str, batch_size: int, producers: int, run: Run, **extra: Any) -> Cell:
    return Cell(
        mode,
        batch_size,
        producers,
        run.batches * batch_size,
        run.batches,
        run.seconds,
        percentile(run.latencies, 50) * 1000,
        percentile(run.latencies, 99) * 1000,
        **extra,
    )


async def direct_cell(
    service_url: str,
    topic: str,
    batch_size: int,
    producers: int,
    seconds: float,
    value_size: int,
    rate: float | None = None,
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

        run = await drive(producers, batch_size, seconds, rate, send)
        for p in prods:
            await p.close()
    finally:
        await pub.close()
    return timed_cell("direct", batch_size, producers, run, rate_limited=rate)


async def sidecar_cell(
    sc: Sidecars,
    topic: str,
    batch_size: int,
    producers: int,
    seconds: float,
    value_size: int,
    rate: float | None = None,
) -> Cell:
    values = [base64.b64encode(v).decode() for v in random_values(batch_size, value_size)]
    recs = ",".join(f'{{"value":"{v}"}}' for v in values)
    clients = [KeepAlive(sc.url_for(i)) for i in range(min(producers, len(sc)))]
    try:
        pids = []
        for i in range(producers):
            _, data = await clients[i % len(clients)].post("/v1/init-producer-id", b"{}")
            pids.append(json.loads(data)["producerId"])

        async def send(i: int, seq: int) -> None:
            body = (
                f'{{"batches":[{{"topic":"{topic}","partition":0,"producerId":{pids[i]},'
                f'"producerEpoch":0,"baseSequence":{seq % SEQ_MODULUS},'
                f'"lastSequence":{(seq + batch_size - 1) % SEQ_MODULUS},"records":[{recs}]}}]}}'
            ).encode()
            status, data = await clients[i % len(clients)].post("/v1/produce", body)
            if status != 200 or json.loads(data)["results"][0]["errorCode"] != 0:
                raise RuntimeError(f"sidecar answered {status}: {data[:300]!r}")

        cpu0 = sc.cpu_seconds()
        run = await drive(producers, batch_size, seconds, rate, send)
        cpu = sc.cpu_seconds() - cpu0
    finally:
        for client in clients:
            await client.close()
    return timed_cell(
        "sidecar",
        batch_size,
        producers,
        run,
        cpu_pct=100 * cpu / run.seconds,
        rss_mb=sc.rss_mb(),
        rate_limited=rate,
    )
