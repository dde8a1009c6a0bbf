"""``kop-dedup bench``: the sidecar against a direct Pulsar producer, in one run.

**direct** publishes with the same producer configuration, names, sequence
ids and properties as the sidecar (it drives ``publisher.PulsarProducer``
itself); **sidecar** sends the same records through ``POST /v1/produce`` to a
``kop-dedup serve`` subprocess over keep-alive connections. Both keep up to 5
batches in flight per producer. Each cell (batch size x producers) runs for a
fixed time per mode; the table gives records/s, batches/s, p50/p99 batch
latency, the sidecar's CPU and RSS, and the sidecar/direct ratio. Results go
to ``<out>/bench.json`` and ``<out>/bench.png``.

``--memory`` measures the sidecar's RSS with 10,000 idle producer states and
its CPU cost per batch as producers grow from 1 to 64.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from kop_dedup.cli import add_pulsar_url_options
from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup_tools.measure import percentile
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = ["Cell", "add_cli", "render_table"]


@dataclass
class Cell:
    mode: str
    batch_size: int
    producers: int
    records: int
    batches: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_pct: float | None = None
    rss_mb: float | None = None
    rate_limited: float | None = None

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "records_per_s": round(self.records_per_s, 1),
            "batches_per_s": round(self.batches_per_s, 1),
        }


def render_table(cells: list[Cell]) -> str:
    """Side-by-side rows per (batch size, producers) with the sidecar/direct ratio."""
    by_key: dict[tuple[int, int], dict[str, Cell]] = {}
    for c in cells:
        if c.rate_limited is None:
            by_key.setdefault((c.batch_size, c.producers), {})[c.mode] = c
    head = (
        f"{'batch':>5} {'prod':>4} | {'direct rec/s':>12} {'p50':>6} {'p99':>6} | "
        f"{'sidecar rec/s':>13} {'batch/s':>8} {'p50':>6} {'p99':>6} {'cpu%':>5} "
        f"{'rss MB':>6} | {'ratio':>5}"
    )
    lines = [head, "-" * len(head)]
    for (size, prods), modes in sorted(by_key.items()):
        d, s = modes.get("direct"), modes.get("sidecar")
        ratio = s.records_per_s / d.records_per_s if d and s and d.records_per_s else 0.0
        lines.append(
            f"{size:>5} {prods:>4} | "
            + (
                f"{d.records_per_s:>12,.0f} {d.p50_ms:>6.1f} {d.p99_ms:>6.1f} | "
                if d
                else " " * 29 + "| "
            )
            + (
                f"{s.records_per_s:>13,.0f} {s.batches_per_s:>8,.0f} {s.p50_ms:>6.1f} "
                f"{s.p99_ms:>6.1f} {s.cpu_pct or 0:>5.0f} {s.rss_mb or 0:>6.0f} | "
                if s
                else " " * 51 + "| "
            )
            + f"{ratio:>5.2f}"
        )
    return "\n".join(lines)


def _values(n: int, size: int) -> list[bytes]:
    return [os.urandom(size // 2).hex().encode()[:size] for _ in range(n)]


@dataclass
class _Run:
    """What one closed-loop (or paced) run measured."""

    batches: int
    seconds: float
    latencies: list[float]


async def _drive(
    producers: int,
    batch_size: int,
    seconds: float,
    rate: float | None,
    send: Callable[[int, int], Awaitable[None]],
) -> _Run:
    """Each producer sends batches for ``seconds``, up to 5 in flight, in sequence order.

    ``send(producer index, base sequence)`` publishes one batch and returns when it is
    acknowledged (raising when it is not). With ``rate`` (records/s over all producers)
    batches are paced; otherwise each producer sends as fast as its window allows.
    """
    latencies: list[float] = []
    started = time.monotonic()
    stop = started + seconds

    async def run(i: int) -> None:
        seq = 0
        window = asyncio.Semaphore(5)
        tasks: list[asyncio.Task[None]] = []
        interval = producers * batch_size / rate if rate else 0.0
        next_at = time.monotonic()
        while time.monotonic() < stop:
            if interval:
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await window.acquire()

            async def one(base: int = seq) -> None:
                try:
                    t0 = time.monotonic()
                    await send(i, base)
                    latencies.append(time.monotonic() - t0)
                finally:
                    window.release()

            tasks.append(asyncio.create_task(one()))
            seq += batch_size
        await asyncio.gather(*tasks)

    await asyncio.gather(*(run(i) for i in range(producers)))
    return _Run(len(latencies), time.monotonic() - started, latencies)


def _cell(mode: str, batch_size: int, producers: int, run: _Run, **extra: Any) -> Cell:
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


# -- direct ------------------------------------------------------------------------


async def _direct_cell(
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
    records = tuple(KafkaRecord(key=None, value=v) for v in _values(batch_size, value_size))
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

        run = await _drive(producers, batch_size, seconds, rate, send)
        for p in prods:
            await p.close()
    finally:
        await pub.close()
    return _cell("direct", batch_size, producers, run, rate_limited=rate)


# -- sidecar -----------------------------------------------------------------------


class _KeepAlive:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams.

    httpx's async client managed about 80 requests/s at 40 concurrent
    requests on our 2-core machines (against a plain FastAPI app too), far
    below what uvicorn serves (about 3,000/s with this client): measuring the
    sidecar with it measured the client. One connection per in-flight
    request, reused.
    """

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        self._idle.append((reader, writer))
        return status, data

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()


async def _sidecar_cell(
    sc: SidecarProcess,
    topic: str,
    batch_size: int,
    producers: int,
    seconds: float,
    value_size: int,
    rate: float | None = None,
) -> Cell:
    values = [base64.b64encode(v).decode() for v in _values(batch_size, value_size)]
    recs = ",".join(f'{{"value":"{v}"}}' for v in values)
    client = _KeepAlive(sc.url)
    try:
        pids = []
        for _ in range(producers):
            _, data = await client.post("/v1/init-producer-id", b"{}")
            pids.append(json.loads(data)["producerId"])

        async def send(i: int, seq: int) -> None:
            body = (
                f'{{"batches":[{{"topic":"{topic}","partition":0,"producerId":{pids[i]},'
                f'"producerEpoch":0,"baseSequence":{seq % SEQ_MODULUS},'
                f'"lastSequence":{(seq + batch_size - 1) % SEQ_MODULUS},"records":[{recs}]}}]}}'
            ).encode()
            status, data = await client.post("/v1/produce", body)
            if status != 200 or json.loads(data)["results"][0]["errorCode"] != 0:
                raise RuntimeError(f"sidecar answered {status}: {data[:300]!r}")

        cpu0 = sc.cpu_seconds()
        run = await _drive(producers, batch_size, seconds, rate, send)
        cpu = sc.cpu_seconds() - cpu0
    finally:
        client.close()
    return _cell(
        "sidecar",
        batch_size,
        producers,
        run,
        cpu_pct=100 * cpu / run.seconds,
        rss_mb=sc.rss_mb(),
        rate_limited=rate,
    )


def _sidecar(args: argparse.Namespace, **settings: Any) -> SidecarProcess:
    """A sidecar subprocess logging into the --out dir, at the default log level (what a
    deployment pays)."""
    return SidecarProcess(
        args.pulsar_service_url,
        args.pulsar_admin_url,
        log_dir=Path(args.out),
        log_level="INFO",
        **settings,
    ).start()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_matrix(args: argparse.Namespace) -> dict[str, Any]:
    sc = _sidecar(args)
    cells: list[Cell] = []
    try:
        for size in args.batch_sizes:
            for prods in args.producers:
                for rep in range(args.reps):
                    for mode in ("direct", "sidecar"):
                        topic = f"bench-{uuid.uuid4().hex[:8]}"
                        create_topic(args.pulsar_admin_url, topic)
                        if mode == "direct":
                            full = f"persistent://public/kafka/{topic}"
                            cell = asyncio.run(
                                _direct_cell(
                                    args.pulsar_service_url,
                                    full,
                                    size,
                                    prods,
                                    args.seconds,
                                    args.value_size,
                                )
                            )
                        else:
                            cell = asyncio.run(
                                _sidecar_cell(sc, topic, size, prods, args.seconds, args.value_size)
                            )
                        cells.append(cell)
                        _say(
                            f"bench: batch {size:>4} producers {prods:>2} rep {rep} {mode:>7}: "
                            f"{cell.records_per_s:>9,.0f} rec/s p99 {cell.p99_ms:6.1f} ms"
                        )
        half = _half_load(args, sc, cells)
    finally:
        sc.stop()
    return {"cells": [c.to_dict() for c in cells], "half_load": half}


def _best(cells: list[Cell], mode: str, size: int, prods: int) -> Cell | None:
    matching = [
        c
        for c in cells
        if (c.mode, c.batch_size, c.producers) == (mode, size, prods) and c.rate_limited is None
    ]
    return max(matching, key=lambda c: c.records_per_s, default=None)


def _half_load(args: argparse.Namespace, sc: SidecarProcess, cells: list[Cell]) -> dict[str, Any]:
    size, prods = 100, max((p for p in args.producers if p <= 8), default=None)
    peak = None if prods is None else _best(cells, "sidecar", size, prods)
    if prods is None or peak is None:  # no 100-record cell with at most 8 producers
        return {}
    rate = peak.records_per_s / 2
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic)
    d = asyncio.run(
        _direct_cell(
            args.pulsar_service_url,
            f"persistent://public/kafka/{topic}",
            size,
            prods,
            args.seconds,
            args.value_size,
            rate=rate,
        )
    )
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic)
    s = asyncio.run(_sidecar_cell(sc, topic, size, prods, args.seconds, args.value_size, rate=rate))
    _say(
        f"bench: half load {rate:,.0f} rec/s: direct p99 {d.p99_ms:.2f} ms, "
        f"sidecar p99 {s.p99_ms:.2f} ms"
    )
    return {
        "rate": rate,
        "batch_size": size,
        "producers": prods,
        "direct": d.to_dict(),
        "sidecar": s.to_dict(),
        "added_p99_ms": s.p99_ms - d.p99_ms,
        "added_p50_ms": s.p50_ms - d.p50_ms,
    }


def run_memory(args: argparse.Namespace) -> dict[str, Any]:
    """RSS with 10,000 idle producer states; CPU per batch from 1 to 64 producers."""
    sc = _sidecar(args, producer_idle_seconds=5, max_open_producers=20_000)
    try:
        rss0 = sc.rss_mb()
        topics = [f"mem-{uuid.uuid4().hex[:8]}" for _ in range(10)]
        for t in topics:
            create_topic(args.pulsar_admin_url, t)

        async def states(n: int) -> None:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=sc.url, limits=limits, timeout=120) as c:
                sem = asyncio.Semaphore(64)
                base = int(uuid.uuid4().int % 10**12)

                async def one(i: int) -> None:
                    async with sem:
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
                        r = await c.post("/v1/produce", json=body)
                        assert r.json()["results"][0]["errorCode"] == 0, r.text

                await asyncio.gather(*(one(i) for i in range(n)))

        started = time.monotonic()
        asyncio.run(states(args.idle_states))
        created_s = time.monotonic() - started
        rss_busy = sc.rss_mb()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if httpx.get(f"{sc.url}/v1/stats", timeout=10).json()["openProducers"] == 0:
                break
            time.sleep(1)
        time.sleep(2)
        rss_idle = sc.rss_mb()
        _say(
            f"bench: {args.idle_states} producer states: RSS {rss0:.0f} MB at start, "
            f"{rss_busy:.0f} MB with producers open, {rss_idle:.0f} MB idle"
        )
        per_batch = []
        for prods in (1, 8, 64):
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            create_topic(args.pulsar_admin_url, topic)
            cpu0 = sc.cpu_seconds()
            cell = asyncio.run(_sidecar_cell(sc, topic, 100, prods, args.seconds, args.value_size))
            cpu = sc.cpu_seconds() - cpu0
            per_batch.append(
                {
                    "producers": prods,
                    "batches": cell.batches,
                    "cpu_ms_per_batch": round(1000 * cpu / max(cell.batches, 1), 3),
                    "records_per_s": round(cell.records_per_s, 1),
                }
            )
            _say(f"bench: {prods:>2} producers: {per_batch[-1]['cpu_ms_per_batch']} ms CPU/batch")
    finally:
        sc.stop()
    return {
        "idle_states": args.idle_states,
        "rss_start_mb": rss0,
        "rss_open_mb": rss_busy,
        "rss_idle_mb": rss_idle,
        "states_created_s": created_s,
        "idle_state_bytes": (rss_idle - rss0) * 2**20 / args.idle_states,
        "cost_per_batch": per_batch,
    }


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend; a clear error when it is missing."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - only the plot needs it

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the benchmark's plot needs matplotlib: pip install 'kop-dedup[bench]' "
            "(or pip install matplotlib)"
        ) from exc
    return plt


def plot(results: dict[str, Any], path: Path) -> None:
    plt = _pyplot()

    cells = [
        Cell(**{k: v for k, v in c.items() if k not in ("records_per_s", "batches_per_s")})
        for c in results["cells"]
    ]
    prods = sorted({c.producers for c in cells})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in prods:
        for mode, style in (("direct", "--"), ("sidecar", "-")):
            pts = sorted({c.batch_size for c in cells})
            best = [_best(cells, mode, s, p) for s in pts]
            xs = [s for s, b in zip(pts, best, strict=True) if b]
            axes[0].plot(
                xs,
                [b.records_per_s for b in best if b],
                style,
                marker="o",
                label=f"{mode}, {p} producers",
            )
            axes[1].plot(
                xs, [b.p99_ms for b in best if b], style, marker="o", label=f"{mode}, {p} producers"
            )
    for ax, title in ((axes[0], "records/s"), (axes[1], "p99 batch latency (ms)")):
        ax.set_xscale("log")
        ax.set_xlabel("records per batch")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("kop-dedup sidecar vs direct Pulsar producer (same broker, same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _handler(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": sys.platform,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.memory:
        memory = {"machine": machine, "memory": run_memory(args)}
        (out / "memory.json").write_text(json.dumps(memory, indent=2))
        print(json.dumps(memory["memory"], indent=2))
        return 0
    results: dict[str, Any] = {"machine": machine, **run_matrix(args)}
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "bench.png")
    cells = [
        Cell(**{k: v for k, v in c.items() if k not in ("records_per_s", "batches_per_s")})
        for c in results["cells"]
    ]
    print(render_table(cells))
    half = results.get("half_load") or {}
    if half:
        print(
            f"\nat half of the sidecar's peak ({half['rate']:,.0f} rec/s, batch "
            f"{half['batch_size']}, {half['producers']} producers): added p99 "
            f"{half['added_p99_ms']:.2f} ms, added p50 {half['added_p50_ms']:.2f} ms"
        )
    print(f"\nwrote {out / 'bench.json'} and {out / 'bench.png'}")
    return 0


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="benchmark the sidecar against a direct producer")
    add_pulsar_url_options(p)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--producers", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--seconds", type=float, default=4.0, help="per cell and mode")
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="batch 100, producers 1 and 8, one rep")
    p.add_argument("--memory", action="store_true", help="idle-state memory and cost per batch")
    p.add_argument("--idle-states", type=int, default=10_000)
    p.add_argument("--out", default="bench-results")

    def handler(args: argparse.Namespace) -> int:
        if args.quick:
            args.batch_sizes, args.producers, args.reps = [100], [1, 8], 1
        return _handler(args)

    p.set_defaults(func=handler)
