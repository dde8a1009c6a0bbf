"""``kop-dedup bench``: the sidecar against a direct Pulsar producer, in one run.

**direct** publishes with the same producer configuration, names, sequence
ids and properties as the sidecar (it drives ``publisher.PulsarProducer``
itself); **sidecar** sends the same records through ``POST /v1/produce`` to a
``kop-dedup serve`` subprocess over keep-alive connections. Both keep up to 5
batches in flight per producer. Each cell (batch size x producers) runs for a
fixed time per mode, ``--reps`` times; the table, the plot and the JSON's
``summary`` all show the best repetition by records/s of each mode
(:mod:`kop_dedup_tools.bench_results`), and the JSON keeps every repetition.
Results go to ``<out>/bench.json`` and ``<out>/bench.png``.

The broker: the one at ``--service-url``/``--admin-url``; when none answers there
and both are on loopback, a local standalone broker (the launcher's
:class:`~kop_dedup_tools.launcher.LocalPulsar`) on free ports for this run, stopped
and wiped at the end. Logs stay in ``<out>``: the sidecar's ``sidecar-<port>.log``
and a started broker's ``pulsar-logs/``. Every failure says what failed (step,
exception type and message) with the sidecar's log tail.

``--memory`` measures the sidecar's RSS with 10,000 idle producer states and
its CPU cost per batch as producers grow from 1 to 64. ``--transactions`` compares
transactions with the same records produced idempotently
(:mod:`kop_dedup_tools.bench_txn`); ``--groups`` compares consumer-group pulls with
direct Pulsar consumers (:mod:`kop_dedup_tools.bench_groups`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from kop_dedup import errors
from kop_dedup.cli import add_pulsar_url_options
from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup_tools.bench_results import (
    AGGREGATION,
    Cell,
    Row,
    plot,
    render_table,
    summarize,
    summary_json,
)
from kop_dedup_tools.launcher import LocalPulsar, broker_ready
from kop_dedup_tools.measure import percentile
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = [
    "BenchError",
    "KeepAlive",
    "Sidecars",
    "add_cli",
    "describe_failure",
    "may_start_broker",
    "run_matrix",
    "run_memory",
    "write_results",
]

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class BenchError(RuntimeError):
    """A benchmark step failed; the message names the step, the exception's type and
    message, and (when a sidecar ran) where its log is, with the log's tail."""


class Sidecars:
    """The sidecar processes of a run (``--sidecars N``): producer ``i`` talks to
    process ``i % N``, so each producer id is served by exactly one process (the broker
    refuses a second holder of a producer name). CPU and RSS are summed."""

    def __init__(self, procs: Sequence[SidecarProcess]) -> None:
        self.procs = list(procs)

    def url_for(self, producer: int) -> str:
        return self.procs[producer % len(self.procs)].url

    def cpu_seconds(self) -> float:
        return sum(sc.cpu_seconds() for sc in self.procs)

    def rss_mb(self) -> float:
        return sum(sc.rss_mb() for sc in self.procs)

    def __len__(self) -> int:
        return len(self.procs)


def describe_failure(
    what: str, exc: BaseException, sc: SidecarProcess | Sidecars | None = None
) -> str:
    """``<what> failed: <Type>: <message>`` and each sidecar's state and log tail. An
    exception without a message (httpx's timeouts, a bare ``TimeoutError``) still
    names its type."""
    lines = [f"{what} failed: {type(exc).__name__}: {str(exc).strip() or '(no message)'}"]
    if exc.__cause__ is not None:
        cause = exc.__cause__
        lines.append(f"caused by {type(cause).__name__}: {str(cause).strip() or '(no message)'}")
    for one in sc.procs if isinstance(sc, Sidecars) else [] if sc is None else [sc]:
        lines.extend(_sidecar_state(one))
    return "\n".join(lines)


def _sidecar_state(sc: SidecarProcess) -> list[str]:
    lines = []
    if True:
        proc = sc.proc
        state = (
            "never started"
            if proc is None
            else "running"
            if proc.poll() is None
            else f"exited with {proc.returncode}"
        )
        lines.append(f"sidecar {sc.url} {state}; log {sc.log_path}, last lines:")
        lines.append(sc.log_tail(20))
    return lines


@contextlib.contextmanager
def _step(what: str, sc: SidecarProcess | Sidecars | None = None) -> Iterator[None]:
    """Turn any failure inside into a :class:`BenchError` that says what failed."""
    try:
        yield
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(describe_failure(what, exc, sc)) from exc


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


class KeepAlive:
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
        self._all: list[asyncio.StreamWriter] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self.request("GET", path, b"")

    async def request(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self._all.append(writer)
        writer.write(
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError(f"the sidecar closed the connection before answering {path}")
        status = int(status_line.split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        self._idle.append((reader, writer))
        return status, data

    async def close(self) -> None:
        """Close every connection, idle or not (a failed run leaves some in use)."""
        for writer in self._all:
            writer.close()
        for writer in self._all:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._all.clear()
        self._idle.clear()


async def _sidecar_cell(
    sc: Sidecars,
    topic: str,
    batch_size: int,
    producers: int,
    seconds: float,
    value_size: int,
    rate: float | None = None,
) -> Cell:
    values = [base64.b64encode(v).decode() for v in _values(batch_size, value_size)]
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
        run = await _drive(producers, batch_size, seconds, rate, send)
        cpu = sc.cpu_seconds() - cpu0
    finally:
        for client in clients:
            await client.close()
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
    """A sidecar subprocess logging into the --out dir (kept), at the default log level
    (what a deployment pays)."""
    sc = SidecarProcess(
        args.pulsar_service_url,
        args.pulsar_admin_url,
        log_dir=Path(args.out),
        log_level="INFO",
        **settings,
    )
    with _step("starting the sidecar"):
        sc.start()
    _say(f"bench: sidecar at {sc.url}, log {sc.log_path}")
    return sc


@contextlib.contextmanager
def _sidecars(args: argparse.Namespace) -> Iterator[Sidecars]:
    """``--sidecars`` processes for the run, each stopped at the end."""
    started: list[SidecarProcess] = []
    try:
        started.extend(_sidecar(args) for _ in range(args.sidecars))  # kept as each starts
        yield Sidecars(started)
    finally:
        for sc in started:
            sc.stop()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _topic(args: argparse.Namespace) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic)
    return topic


def _full(topic: str) -> str:
    return f"persistent://public/kafka/{topic}"


def run_matrix(args: argparse.Namespace, sc: Sidecars) -> tuple[list[Cell], dict[str, Any]]:
    """Every (batch size, producers, repetition, mode) cell, then the half-load run."""
    cells: list[Cell] = []
    for size in args.batch_sizes:
        for prods in args.producers:
            for rep in range(args.reps):
                for mode in ("direct", "sidecar"):
                    what = f"{mode} cell (batch {size}, {prods} producers, rep {rep + 1})"
                    with _step(what, sc):
                        topic = _topic(args)
                        if mode == "direct":
                            cell = asyncio.run(
                                _direct_cell(
                                    args.pulsar_service_url,
                                    _full(topic),
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
                        f"bench: batch {size:>4} producers {prods:>2} rep {rep + 1} {mode:>7}: "
                        f"{cell.records_per_s:>9,.0f} rec/s p99 {cell.p99_ms:6.1f} ms"
                    )
    with _step("the half-load run", sc):
        half = _half_load(args, sc, summarize(cells))
    return cells, half


def _half_load(args: argparse.Namespace, sc: Sidecars, rows: list[Row]) -> dict[str, Any]:
    """Both modes paced at half the sidecar's peak (as the table shows it) at 100-record
    batches and the most producers up to 8: the latency the sidecar adds below its limit."""
    size, prods = 100, max((p for p in args.producers if p <= 8), default=None)
    row = next((r for r in rows if (r.batch_size, r.producers) == (size, prods)), None)
    if row is None or row.sidecar is None:  # no 100-record cell with at most 8 producers
        return {}
    rate = row.sidecar.records_per_s / 2
    d = asyncio.run(
        _direct_cell(
            args.pulsar_service_url,
            _full(_topic(args)),
            size,
            row.producers,
            args.seconds,
            args.value_size,
            rate=rate,
        )
    )
    s = asyncio.run(
        _sidecar_cell(sc, _topic(args), size, row.producers, args.seconds, args.value_size, rate)
    )
    _say(
        f"bench: half load {rate:,.0f} rec/s: direct p99 {d.p99_ms:.2f} ms, "
        f"sidecar p99 {s.p99_ms:.2f} ms"
    )
    return {
        "rate": rate,
        "batch_size": size,
        "producers": row.producers,
        "direct": d.to_dict(),
        "sidecar": s.to_dict(),
        "added_p99_ms": s.p99_ms - d.p99_ms,
        "added_p50_ms": s.p50_ms - d.p50_ms,
    }


async def _idle_states(url: str, topics: list[str], n: int) -> None:
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


def _wait_idle(url: str, timeout: float = 120.0) -> None:
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
    with _step(f"creating {args.idle_states} producer states", sc):
        topics = [_topic(args) for _ in range(10)]
        started = time.monotonic()
        asyncio.run(_idle_states(sc.url, topics, args.idle_states))
        created_s = time.monotonic() - started
    rss_busy = sc.rss_mb()
    with _step("waiting for the idle producers to close", sc):
        _wait_idle(sc.url)
    time.sleep(2)  # let the allocator settle before reading RSS (no state to poll)
    rss_idle = sc.rss_mb()
    _say(
        f"bench: {args.idle_states} producer states: RSS {rss0:.0f} MB at start, "
        f"{rss_busy:.0f} MB with producers open, {rss_idle:.0f} MB idle"
    )
    per_batch = []
    for prods in (1, 8, 64):
        with _step(f"the cost-per-batch cell with {prods} producers", sc):
            cpu0 = sc.cpu_seconds()
            cell = asyncio.run(
                _sidecar_cell(
                    Sidecars([sc]), _topic(args), 100, prods, args.seconds, args.value_size
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
        _say(f"bench: {prods:>2} producers: {per_batch[-1]['cpu_ms_per_batch']} ms CPU/batch")
    return {
        "idle_states": args.idle_states,
        "rss_start_mb": rss0,
        "rss_open_mb": rss_busy,
        "rss_idle_mb": rss_idle,
        "states_created_s": created_s,
        "idle_state_bytes": (rss_idle - rss0) * 2**20 / args.idle_states,
        "cost_per_batch": per_batch,
    }


# -- the broker --------------------------------------------------------------------


def may_start_broker(args: argparse.Namespace) -> bool:
    """Start a local broker when none answers? Only when allowed and both URLs point at
    this machine (a remote broker that does not answer is the user's to fix)."""
    hosts = {urlsplit(args.pulsar_service_url).hostname, urlsplit(args.pulsar_admin_url).hostname}
    return not args.no_start_broker and hosts <= _LOOPBACK


@contextlib.contextmanager
def _broker(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    """The broker for this run: the one that answers at the URLs, or a local one started
    (and stopped, its data wiped, its log kept under ``out``) for the run."""
    admin = args.pulsar_admin_url
    if broker_ready(admin):
        yield {"service_url": args.pulsar_service_url, "admin_url": admin, "started": False}
        return
    if not may_start_broker(args):
        raise BenchError(
            f"no Pulsar broker answers at {admin}. Start one with `kop-dedup pulsar start` "
            "(a local standalone broker with deduplication on) and pass its URLs with "
            "--service-url/--admin-url (or KOP_DEDUP_PULSAR_SERVICE_URL/"
            "KOP_DEDUP_PULSAR_ADMIN_URL). Without --no-start-broker, kop-dedup bench "
            "starts a local broker itself when both URLs are on loopback."
        )
    local = LocalPulsar.throwaway(out.resolve() / "pulsar-logs", prefix="kop-dedup-bench-")
    _say(
        f"bench: no Pulsar broker answers at {admin}; starting a local one for this run "
        f"({local.service_url}, admin {local.admin_url}, log {local.log_file})"
    )
    try:
        seconds = local.start()  # a BrokerError names the log (kept) and shows its tail
        _say(f"bench: local broker ready in {seconds:.0f}s")
        args.pulsar_service_url, args.pulsar_admin_url = local.service_url, local.admin_url
        yield {"service_url": local.service_url, "admin_url": local.admin_url, "started": True}
    finally:
        local.wipe()


# -- the command -------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": sys.platform,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def write_results(
    out: Path,
    cells: list[Cell],
    half: dict[str, Any],
    broker: dict[str, Any],
    *,
    sidecars: int = 1,
) -> str:
    """bench.json and bench.png from one aggregation of ``cells``; the report to print."""
    rows = summarize(cells)
    results = {
        "machine": _machine(),
        "broker": broker,
        "sidecars": sidecars,
        "aggregation": AGGREGATION,
        "summary": summary_json(rows),
        "cells": [c.to_dict() for c in cells],
        "half_load": half,
    }
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    plot(rows, out / "bench.png")
    report = [render_table(rows)]
    if sidecars > 1:
        report.append(
            f"{sidecars} sidecar processes, producer i on process i % {sidecars}; "
            "cpu% and rss MB are their sum"
        )
    if half:
        report.append(
            f"\nat half of the sidecar's peak ({half['rate']:,.0f} rec/s, batch "
            f"{half['batch_size']}, {half['producers']} producers): added p99 "
            f"{half['added_p99_ms']:.2f} ms, added p50 {half['added_p50_ms']:.2f} ms"
        )
    report.append(f"\nwrote {out / 'bench.json'} and {out / 'bench.png'}")
    return "\n".join(report)


def _matrix(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    with _sidecars(args) as sc:
        cells, half = run_matrix(args, sc)
    print(write_results(out, cells, half, broker, sidecars=args.sidecars))


def _memory(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    sc = _sidecar(
        args, producer_idle_seconds=5, max_open_producers=max(20_000, 2 * args.idle_states)
    )
    try:
        memory = run_memory(args, sc)
    finally:
        sc.stop()
    (out / "memory.json").write_text(
        json.dumps({"machine": _machine(), "broker": broker, "memory": memory}, indent=2)
    )
    print(json.dumps(memory, indent=2))


def _transactions(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    from kop_dedup_tools.bench_txn import run_transactions, write_txn_results  # noqa: PLC0415

    sc = _sidecar(args)
    try:
        with _step("the transactions run", sc):
            cells, rows = run_transactions(args, sc, _say)
    finally:
        sc.stop()
    print(write_txn_results(out, cells, rows, {"machine": _machine(), "broker": broker}))


def _groups(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    from kop_dedup_tools.bench_groups import run  # noqa: PLC0415 - it imports this module

    run(args, out, broker)


def _handler(args: argparse.Namespace) -> int:
    if args.quick:
        args.batch_sizes, args.producers, args.reps = [100], [1, 8], 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = (
        _groups
        if args.groups
        else _memory
        if args.memory
        else _transactions
        if args.transactions
        else _matrix
    )
    with _broker(args, out) as broker:
        run(args, out, broker)
    return 0


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark the sidecar against a direct producer (starts a broker if needed)",
        description="Benchmark the sidecar (a kop-dedup serve subprocess) against a direct "
        "Pulsar producer on the same broker in one run. The table, plot and JSON summary "
        "show the best repetition by records/s of each mode; the JSON keeps every one. "
        "Needs a Pulsar broker at --service-url/--admin-url: when none answers there and "
        "both are on loopback, it starts a local standalone broker on free ports for the "
        "run (the `kop-dedup pulsar` launcher; Apache Pulsar from the Maven cache) and "
        "stops it at the end (--no-start-broker: fail instead). Logs (sidecar, started "
        "broker) stay in --out.",
    )
    add_pulsar_url_options(p)
    p.add_argument(
        "--no-start-broker",
        action="store_true",
        help="fail at once when no broker answers instead of starting a local one",
    )
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--producers", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--reps", type=int, default=2, help="repetitions per cell and mode")
    p.add_argument("--seconds", type=float, default=4.0, help="per cell and mode")
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="batch 100, producers 1 and 8, one rep")
    p.add_argument(
        "--sidecars",
        type=int,
        default=1,
        help="sidecar processes (each its own port; producer i uses process i %% N, so "
        "every producer id has one owner); CPU and RSS columns are their sum",
    )
    p.add_argument("--memory", action="store_true", help="idle-state memory and cost per batch")
    p.add_argument(
        "--transactions",
        action="store_true",
        help="transactions of 10 batches x 100 records over 2 partitions against the same "
        "records produced idempotently, per --producers count (transactions.json)",
    )
    p.add_argument("--idle-states", type=int, default=10_000)
    p.add_argument("--out", default="bench-results", help="results and logs (kept)")
    from kop_dedup_tools.bench_groups import add_options  # noqa: PLC0415 - imports this module

    add_options(p)  # --groups, --members, --pull-records, --prefill
    p.set_defaults(func=_handler)
