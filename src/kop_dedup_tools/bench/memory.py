"""``kop-dedup bench --memory``: the sidecar's RSS with ``--idle-states`` (10,000) idle
producer states, and its CPU cost per batch as producers grow from 1 to 64.

One sidecar runs with ``producer_idle_seconds=5`` and room for the states; each producer
id stores one batch (64 at a time), the sidecar closes the idle producers, and RSS is
read at the start, with the producers open and once they are closed: the
``idle-states`` cell. Then 100-record batches through the sidecar
(:func:`~kop_dedup_tools.bench.produce.sidecar_cell`) with 1, 8 and 64 producers give
the CPU per record and per batch. Results: ``<out>/memory.json`` and ``memory.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from kop_dedup import errors
from kop_dedup_tools.bench.cells import Cell, Compare, Workload, extras
from kop_dedup_tools.bench.produce import sidecar_cell
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.support import Sidecars, new_topic, say, start_sidecar, step
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["COMPARE", "run", "run_memory"]

COMPARE = Compare("sidecar", None)
TITLE = "kop-dedup sidecar: idle producer states' memory, CPU per batch by producers"
_AT_ONCE = 64


async def idle_states(url: str, topics: list[str], n: int) -> None:
    """``n`` producer ids each store one batch, 64 at a time."""
    limits = httpx.Limits(max_connections=_AT_ONCE)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as c:
        sem = asyncio.Semaphore(_AT_ONCE)
        base = int(uuid.uuid4().int % 10**12)

        async def one(i: int) -> None:
            body = {
                "batches": [
                    {
                        "topic": topics[i % len(topics)],
                        "partition": 0,
                        "producerId": base + i,
                        "producerEpoch": 0,
                        "baseSequence": 0,
                        "lastSequence": 0,
                        "records": [{"value": "eA=="}],
                    }
                ]
            }
            retried = False
            async with sem:
                try:
                    r = await c.post("/v1/produce", json=body)
                except httpx.TransportError:
                    # a kept-alive connection the sidecar closed as it was reused (seen
                    # on a loaded machine): the same batch again is safe, 46 if stored
                    retried = True
                    r = await c.post("/v1/produce", json=body)
            try:
                code = r.json()["results"][0]["errorCode"]
            except (ValueError, KeyError, IndexError, TypeError):
                code = None
            if code != 0 and not (retried and code == errors.DuplicateSequenceNumber.errno):
                raise RuntimeError(
                    f"producer {base + i}'s batch was answered HTTP {r.status_code}: {r.text[:300]}"
                )

        await asyncio.gather(*(one(i) for i in range(n)))


def wait_idle(url: str, timeout: float = 120.0) -> None:
    """Poll /v1/stats until the sidecar has closed every idle producer."""
    deadline = time.monotonic() + timeout
    open_now = None
    while time.monotonic() < deadline:
        open_now = httpx.get(f"{url}/v1/stats", timeout=10).json()["openProducers"]
        if open_now == 0:
            return
        time.sleep(1)
    raise TimeoutError(f"{open_now} producers still open after {timeout:.0f}s")


def run_memory(args: argparse.Namespace, sc: SidecarProcess) -> list[Cell]:
    """The idle-states cell, then a cost-per-batch cell per producer count. ``sc`` runs
    with ``producer_idle_seconds=5`` and room for the states."""
    rss0 = sc.rss_mb()
    with step(f"creating {args.idle_states} producer states", sc):
        topics = [new_topic(args) for _ in range(10)]
        started, cpu0 = time.monotonic(), sc.cpu_seconds()
        asyncio.run(idle_states(sc.url, topics, args.idle_states))
        created_s, cpu = time.monotonic() - started, sc.cpu_seconds() - cpu0
    rss_busy = sc.rss_mb()
    with step("waiting for the idle producers to close", sc):
        wait_idle(sc.url)
    time.sleep(2)  # let the allocator settle before reading RSS (no state to poll)
    rss_idle = sc.rss_mb()
    say(
        f"bench: {args.idle_states} producer states: RSS {rss0:.0f} MB at start, "
        f"{rss_busy:.0f} MB with producers open, {rss_idle:.0f} MB idle"
    )
    cells = [
        Cell(
            Workload("idle-states", _AT_ONCE, 1),
            "sidecar",
            1,
            args.idle_states,
            created_s,
            sidecar_cpu_s=cpu,
            rss_mb=rss_idle,
            extra=extras(
                rss_start_mb=rss0,
                rss_open_mb=rss_busy,
                idle_state_bytes=(rss_idle - rss0) * 2**20 / args.idle_states,
            ),
        )
    ]
    for prods in (1, 8, 64):
        with step(f"the cost-per-batch cell with {prods} producers", sc):
            cpu0 = sc.cpu_seconds()
            cell = asyncio.run(
                sidecar_cell(
                    Sidecars([sc]), new_topic(args), 100, prods, args.seconds, args.value_size
                )
            )
            cpu = sc.cpu_seconds() - cpu0  # with the producers' set-up, as it always was
        per_batch = round(1000 * cpu / max(cell.extra["batches"], 1), 3)
        cells.append(replace(cell, extra={**cell.extra, "cpu_ms_per_batch": per_batch}))
        say(cells[-1].progress())
    return cells


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --memory``: one sidecar for the run, stopped at the end."""
    sc = start_sidecar(
        args, producer_idle_seconds=5, max_open_producers=max(20_000, 2 * args.idle_states)
    )
    try:
        cells = run_memory(args, sc)
    finally:
        sc.stop()
    setup = {"idle_states": args.idle_states, "seconds": args.seconds}
    print(Results("memory", TITLE, COMPARE, cells, setup, broker).write(out))
