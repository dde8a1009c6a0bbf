"""``kop-dedup bench --memory``: the sidecar's RSS with ``--idle-states`` (10,000) idle
producer states, and its CPU cost per batch as producers grow from 1 to 64.

One sidecar runs with ``producer_idle_seconds=5`` and room for the states; each producer
id stores one batch, the sidecar closes the idle producers, and RSS is read at the
start, with the producers open and once they are closed. Then 100-record batches
through the sidecar (:func:`~kop_dedup_tools.bench_produce.sidecar_cell`) with 1, 8 and
64 producers give the CPU milliseconds per batch. Results: ``<out>/memory.json``, also
printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from kop_dedup import errors
from kop_dedup_tools.bench_produce import sidecar_cell
from kop_dedup_tools.bench_report import write_json
from kop_dedup_tools.bench_support import BenchMode, Sidecars, new_topic, say, start_sidecar, step
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["MODE", "add_options", "run", "run_memory"]


async def idle_states(url: str, topics: list[str], n: int) -> None:
    """``n`` producer ids each store one batch, 64 at a time."""
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as c:
        sem = asyncio.Semaphore(64)
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


def run_memory(args: argparse.Namespace, sc: SidecarProcess) -> dict[str, Any]:
    """RSS with 10,000 idle producer states; CPU per batch from 1 to 64 producers. ``sc``
    runs with ``producer_idle_seconds=5`` and room for the states."""
    rss0 = sc.rss_mb()
    with step(f"creating {args.idle_states} producer states", sc):
        topics = [new_topic(args) for _ in range(10)]
        started = time.monotonic()
        asyncio.run(idle_states(sc.url, topics, args.idle_states))
        created_s = time.monotonic() - started
    rss_busy = sc.rss_mb()
    with step("waiting for the idle producers to close", sc):
        wait_idle(sc.url)
    time.sleep(2)  # let the allocator settle before reading RSS (no state to poll)
    rss_idle = sc.rss_mb()
    say(
        f"bench: {args.idle_states} producer states: RSS {rss0:.0f} MB at start, "
        f"{rss_busy:.0f} MB with producers open, {rss_idle:.0f} MB idle"
    )
    per_batch = []
    for prods in (1, 8, 64):
        with step(f"the cost-per-batch cell with {prods} producers", sc):
            cpu0 = sc.cpu_seconds()
            cell = asyncio.run(
                sidecar_cell(
                    Sidecars([sc]), new_topic(args), 100, prods, args.seconds, args.value_size
                )
            )
            cpu = sc.cpu_seconds() - cpu0
        per_batch.append(
            {
                "producers": prods,
                "batches": cell.batches,
                "cpu_ms_per_batch": round(1000 * cpu / max(cell.batches, 1), 3),
                "records_per_s": round(cell.records_per_s, 1),
            }
        )
        say(f"bench: {prods:>2} producers: {per_batch[-1]['cpu_ms_per_batch']} ms CPU/batch")
    return {
        "idle_states": args.idle_states,
        "rss_start_mb": rss0,
        "rss_open_mb": rss_busy,
        "rss_idle_mb": rss_idle,
        "states_created_s": created_s,
        "idle_state_bytes": (rss_idle - rss0) * 2**20 / args.idle_states,
        "cost_per_batch": per_batch,
    }


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --memory``: one sidecar for the run, stopped at the end."""
    sc = start_sidecar(
        args, producer_idle_seconds=5, max_open_producers=max(20_000, 2 * args.idle_states)
    )
    try:
        memory = run_memory(args, sc)
    finally:
        sc.stop()
    write_json(out / "memory.json", broker, memory=memory)
    print(json.dumps(memory, indent=2))


def add_options(p: argparse.ArgumentParser) -> None:
    """``--memory`` (its ``--idle-states`` is added where the help has always shown it)."""
    p.add_argument("--memory", action="store_true", help="idle-state memory and cost per batch")


MODE = BenchMode(("memory",), add_options, run)
