"""``kop-dedup bench --transactions``: transactions against the same records produced
idempotently, in one run, through one sidecar.

Each of ``--producers`` clients runs rounds back to back for ``--seconds``: a round is
10 batches of 100 records over the 2 partitions of a fresh topic (5 batches per
partition, each batch its own request, all 10 in flight at once, as a Kafka producer
pipelines them).

- **transactions**: every round is one transaction (a transactional id per client):
  the 10 batches with ``transactionalId``, then ``POST /v1/end-txn`` with
  ``commit: true``, then ``GET /v1/transactions/{id}`` (every 2 ms) until
  CompleteCommit, as a Kafka client's next transaction waits for the previous one to
  complete. Measured: commits/s, records/s, end-txn latency (answered once the decision
  is durable), *applied* (end-txn answered to CompleteCommit seen) and *visible*
  (end-txn answered to the transaction's last record read from the data topic).
- **idempotent**: the same rounds of the same records without a transaction (a
  producer id per client, from ``init-producer-id``); *visible* is the round's last
  answer to its last record read.

A reader per data partition runs in both modes (so both pay for it) and reads every
record; a record's value starts with ``<client>:<round>:``, which is how a read is
counted to its round (:class:`Visibility`). The JSON keeps every repetition; the table
shows the best repetition by records/s of each mode, and the ratio of transactions to
idempotent records/s (the issue's target: at least 0.5, since the data is written
twice: to the journal, then copied).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup_tools.bench_http import KeepAlive
from kop_dedup_tools.bench_report import (
    AGGREGATION,
    Timed,
    best_of,
    machine,
    pyplot,
    save_figure,
)
from kop_dedup_tools.bench_support import BenchMode, say, start_sidecar, step
from kop_dedup_tools.measure import percentile
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = [
    "BATCHES_PER_ROUND",
    "MODE",
    "PARTITIONS",
    "RECORDS_PER_BATCH",
    "TxnCell",
    "Visibility",
    "render_txn_table",
    "round_values",
    "run_transactions",
    "summarize_txn",
]

BATCHES_PER_ROUND = 10
RECORDS_PER_BATCH = 100
PARTITIONS = 2
MODES = ("idempotent", "transactions")
_STATE_POLL_S = 0.002
_READ_WAIT_MS = 200


def round_values(client: int, round_no: int, count: int, size: int) -> list[bytes]:
    """``count`` record values of ``size`` bytes (at least the prefix) that name their
    client and round: ``b"3:17:000..."``."""
    prefix = f"{client}:{round_no}:"
    return [(prefix + format(i, "0>6")).ljust(size, "x").encode() for i in range(count)]


def round_of(value: bytes) -> tuple[int, int] | None:
    """(client, round) of a value made by :func:`round_values`; None for any other."""
    parts = value.split(b":", 2)
    if len(parts) < 3:
        return None
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return None


class Visibility:
    """When each round's records were all read, against when the round ended.

    ``read(key, at)`` is called (from reader threads) for every record read,
    ``ended(key, at)`` once the round's end was answered (end-txn, or the last produce
    answer); :meth:`latencies` gives read-complete minus ended for every round both
    complete (0 when the records were read before the end was answered).
    """

    def __init__(self, records_per_round: int) -> None:
        self.records_per_round = records_per_round
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, int], int] = {}
        self._complete: dict[tuple[int, int], float] = {}
        self._ended: dict[tuple[int, int], float] = {}

    def read(self, key: tuple[int, int], at: float) -> None:
        with self._lock:
            n = self._counts.get(key, 0) + 1
            self._counts[key] = n
            if n == self.records_per_round:
                self._complete[key] = at

    def ended(self, key: tuple[int, int], at: float) -> None:
        with self._lock:
            self._ended[key] = at

    def latencies(self) -> list[float]:
        """Seconds from each round's end to its last record read (rounds complete only)."""
        with self._lock:
            return [
                max(self._complete[k] - at, 0.0)
                for k, at in self._ended.items()
                if k in self._complete
            ]

    def incomplete(self) -> int:
        """Rounds ended whose records were not all read (yet)."""
        with self._lock:
            return sum(1 for k in self._ended if k not in self._complete)


@dataclass(frozen=True, slots=True)
class TxnCell(Timed):
    """One timed run of one mode with ``producers`` clients."""

    mode: str
    producers: int
    rounds: int
    records: int
    seconds: float
    produce_p50_ms: float
    produce_p99_ms: float
    visible_p50_ms: float
    visible_p99_ms: float
    end_p50_ms: float | None = None
    end_p99_ms: float | None = None
    applied_p50_ms: float | None = None
    applied_p99_ms: float | None = None
    cpu_pct: float | None = None
    unread_rounds: int = 0
    """Rounds whose records were not all read within the reader's grace period."""

    @property
    def rounds_per_s(self) -> float:
        return self.rounds / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**Timed.to_dict(self), "rounds_per_s": round(self.rounds_per_s, 2)}


def summarize_txn(cells: list[TxnCell]) -> list[dict[str, Any]]:
    """Per producer count: each mode's best repetition by records/s (the rule of every
    benchmark mode, :func:`~kop_dedup_tools.bench_report.best_of`), and the ratio of
    transactions to idempotent records/s."""
    rows = []
    for (producers,), _reps, best in best_of(cells, lambda c: (c.producers,)):
        idem, txn = best.get("idempotent"), best.get("transactions")
        ratio = (
            txn.records_per_s / idem.records_per_s
            if idem is not None and txn is not None and idem.records_per_s
            else None
        )
        rows.append(
            {
                "producers": producers,
                "idempotent": idem.to_dict() if idem else None,
                "transactions": txn.to_dict() if txn else None,
                "ratio": None if ratio is None else round(ratio, 2),
            }
        )
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def render_txn_table(rows: list[dict[str, Any]]) -> str:
    """The transactions table (best repetition by records/s of each mode)."""
    head = (
        f"transactions of {BATCHES_PER_ROUND} batches x {RECORDS_PER_BATCH} records over "
        f"{PARTITIONS} partitions, against the same rounds produced idempotently; best "
        "repetition by records/s; latencies in ms\n"
        "prod | idem rec/s    p99 visible p99 | txn rec/s commits/s end-txn p50    p99 "
        "applied p50    p99 visible p50    p99 | ratio"
    )
    lines = [head, "-" * len(head.splitlines()[-1])]
    for r in rows:
        i, t = r["idempotent"] or {}, r["transactions"] or {}
        lines.append(
            f"{r['producers']:>4} | {i.get('records_per_s', 0):>10,.0f} "
            f"{_ms(i.get('produce_p99_ms')):>6} {_ms(i.get('visible_p99_ms')):>11} | "
            f"{t.get('records_per_s', 0):>9,.0f} {t.get('rounds_per_s', 0):>9.1f} "
            f"{_ms(t.get('end_p50_ms')):>11} {_ms(t.get('end_p99_ms')):>6} "
            f"{_ms(t.get('applied_p50_ms')):>11} {_ms(t.get('applied_p99_ms')):>6} "
            f"{_ms(t.get('visible_p50_ms')):>11} {_ms(t.get('visible_p99_ms')):>6} | "
            f"{'-' if r['ratio'] is None else format(r['ratio'], '.2f'):>5}"
        )
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------


@dataclass
class _Samples:
    produce: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    applied: list[float] = field(default_factory=list)
    rounds: int = 0


@contextlib.contextmanager
def _readers(service_url: str, topic: str, seen: Visibility) -> Iterator[None]:
    """A reader per data partition, from now on, counting every record to its round."""
    import pulsar  # noqa: PLC0415 - the service's dependency; only the run needs it

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    stop = threading.Event()
    threads = []
    try:
        for p in range(PARTITIONS):
            reader = client.create_reader(
                f"persistent://public/kafka/{topic}-partition-{p}", pulsar.MessageId.latest
            )

            def read(reader: Any = reader) -> None:
                while not stop.is_set():
                    try:
                        msg = reader.read_next(_READ_WAIT_MS)
                    except pulsar.Timeout:
                        continue
                    except Exception:  # the client is closing
                        return
                    key = round_of(msg.data())
                    if key is not None:
                        seen.read(key, time.monotonic())

            thread = threading.Thread(target=read, name=f"bench-reader-{p}", daemon=True)
            thread.start()
            threads.append(thread)
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        client.close()


def _batch_json(topic: str, partition: int, pid: int, epoch: int, base: int, records: str) -> str:
    last = (base + RECORDS_PER_BATCH - 1) % SEQ_MODULUS
    return (
        f'{{"topic":"{topic}","partition":{partition},"producerId":{pid},'
        f'"producerEpoch":{epoch},"baseSequence":{base % SEQ_MODULUS},'
        f'"lastSequence":{last},"records":[{records}]}}'
    )


async def _call(client: Any, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """A JSON call that must answer 200 (and errorCode 0 where there is one)."""
    payload = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    status, data = await client.request(method, path, payload if method == "POST" else b"")
    answer: dict[str, Any] = json.loads(data) if data else {}
    if status != 200 or answer.get("errorCode", 0) != 0:
        raise RuntimeError(f"{method} {path} answered {status}: {data[:300]!r}")
    return answer


@dataclass
class _Client:
    """One client of the run: a producer id (and a transactional id in transactions)."""

    http: Any
    index: int
    topic: str
    transactional: bool
    samples: _Samples
    seen: Visibility
    tid: str = ""
    pid: int = -1
    epoch: int = -1
    next_seq: list[int] = field(default_factory=lambda: [0] * PARTITIONS)

    async def start(self) -> None:
        self.tid = f"bench-{uuid.uuid4().hex[:12]}-{self.index}"
        body = {"transactionalId": self.tid} if self.transactional else {}
        answer = await _call(self.http, "POST", "/v1/init-producer-id", body)
        self.pid, self.epoch = answer["producerId"], answer["producerEpoch"]

    def requests(self, round_no: int, value_size: int) -> list[bytes]:
        """The round's 10 produce bodies, a batch each, sequences continuing."""
        values = round_values(
            self.index, round_no, BATCHES_PER_ROUND * RECORDS_PER_BATCH, value_size
        )
        encoded = [base64.b64encode(v).decode() for v in values]
        txn_field = f'"transactionalId":"{self.tid}",' if self.transactional else ""
        bodies = []
        for b in range(BATCHES_PER_ROUND):
            partition = b % PARTITIONS
            chunk = encoded[b * RECORDS_PER_BATCH : (b + 1) * RECORDS_PER_BATCH]
            records = ",".join(f'{{"value":"{v}"}}' for v in chunk)
            base = self.next_seq[partition]
            self.next_seq[partition] += RECORDS_PER_BATCH
            batch = _batch_json(self.topic, partition, self.pid, self.epoch, base, records)
            bodies.append(f'{{{txn_field}"batches":[{batch}]}}'.encode())
        return bodies

    async def produce(self, body: bytes) -> None:
        t0 = time.monotonic()
        answer = await _call(self.http, "POST", "/v1/produce", body)
        if answer["results"][0]["errorCode"] != 0:
            raise RuntimeError(f"produce answered {answer['results'][0]}")
        self.samples.produce.append(time.monotonic() - t0)

    async def commit(self, key: tuple[int, int]) -> None:
        """end-txn (commit), then wait for CompleteCommit."""
        t0 = time.monotonic()
        end = {"transactionalId": self.tid, "producerId": self.pid, "producerEpoch": self.epoch}
        await _call(self.http, "POST", "/v1/end-txn", {**end, "commit": True})
        ended = time.monotonic()
        self.samples.end.append(ended - t0)
        self.seen.ended(key, ended)
        path = f"/v1/transactions/{self.tid}"
        # the sidecar's state, over HTTP: polling is what a client can do
        while (await _call(self.http, "GET", path))["state"] != "CompleteCommit":  # noqa: ASYNC110
            await asyncio.sleep(_STATE_POLL_S)
        self.samples.applied.append(time.monotonic() - ended)

    async def run(self, stop_at: float, value_size: int) -> None:
        """Rounds until ``stop_at`` (a round in progress is finished)."""
        await self.start()
        round_no = 0
        while time.monotonic() < stop_at:
            await asyncio.gather(*(self.produce(r) for r in self.requests(round_no, value_size)))
            key = (self.index, round_no)
            if self.transactional:
                await self.commit(key)
            else:
                self.seen.ended(key, time.monotonic())
            self.samples.rounds += 1
            round_no += 1


def _p(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000, 2)


async def _cell(
    sc: SidecarProcess,
    admin_url: str,
    service_url: str,
    mode: str,
    producers: int,
    seconds: float,
    value_size: int,
) -> TxnCell:
    topic = f"bench-txn-{uuid.uuid4().hex[:8]}"
    create_topic(admin_url, topic, partitions=PARTITIONS)
    seen = Visibility(BATCHES_PER_ROUND * RECORDS_PER_BATCH)
    samples = _Samples()
    client = KeepAlive(sc.url)
    try:
        with _readers(service_url, topic, seen):
            cpu0, started = sc.cpu_seconds(), time.monotonic()
            clients = [
                _Client(client, i, topic, mode == "transactions", samples, seen)
                for i in range(producers)
            ]
            await asyncio.gather(*(c.run(started + seconds, value_size) for c in clients))
            elapsed = time.monotonic() - started
            cpu = sc.cpu_seconds() - cpu0
            grace = time.monotonic() + 10
            while seen.incomplete() and time.monotonic() < grace:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the readers are threads: nothing to await
    finally:
        await client.close()
    visible = seen.latencies()
    applied = samples.applied
    return TxnCell(
        mode,
        producers,
        samples.rounds,
        samples.rounds * BATCHES_PER_ROUND * RECORDS_PER_BATCH,
        elapsed,
        _p(samples.produce, 50),
        _p(samples.produce, 99),
        _p(visible, 50),
        _p(visible, 99),
        end_p50_ms=_p(samples.end, 50) if samples.end else None,
        end_p99_ms=_p(samples.end, 99) if samples.end else None,
        applied_p50_ms=_p(applied, 50) if applied else None,
        applied_p99_ms=_p(applied, 99) if applied else None,
        cpu_pct=round(100 * cpu / elapsed, 1) if elapsed else None,
        unread_rounds=seen.incomplete(),
    )


def run_transactions(
    args: argparse.Namespace, sc: SidecarProcess, say: Any
) -> tuple[list[TxnCell], list[dict[str, Any]]]:
    """Every (producers, repetition, mode) cell, the modes alternating; the summary."""
    cells = []
    for producers in args.producers:
        for rep in range(args.reps):
            for mode in MODES:
                cell = asyncio.run(
                    _cell(
                        sc,
                        args.pulsar_admin_url,
                        args.pulsar_service_url,
                        mode,
                        producers,
                        args.seconds,
                        args.value_size,
                    )
                )
                cells.append(cell)
                extra = (
                    f", {cell.rounds_per_s:.1f} commits/s, end-txn p99 {cell.end_p99_ms} ms, "
                    f"visible p99 {cell.visible_p99_ms} ms"
                    if mode == "transactions"
                    else ""
                )
                say(
                    f"bench: transactions {producers:>2} producers rep {rep + 1} {mode:>12}: "
                    f"{cell.records_per_s:>9,.0f} rec/s{extra}"
                )
    return cells, summarize_txn(cells)


def write_txn_results(
    out: Path, cells: list[TxnCell], rows: list[dict[str, Any]], context: dict[str, Any]
) -> str:
    """transactions.json (every repetition and the summary); the table to print."""
    (out / "transactions.json").write_text(
        json.dumps(
            {
                **context,
                "round": {
                    "batches": BATCHES_PER_ROUND,
                    "records_per_batch": RECORDS_PER_BATCH,
                    "partitions": PARTITIONS,
                },
                "aggregation": AGGREGATION,
                "summary": rows,
                "cells": [c.to_dict() for c in cells],
            },
            indent=2,
        )
    )
    plot_txn(rows, out / "transactions.png")
    return (
        f"{render_txn_table(rows)}\n\nwrote {out / 'transactions.json'} and "
        f"{out / 'transactions.png'}"
    )


def plot_txn(rows: list[dict[str, Any]], path: Path) -> None:
    """Records/s of both modes per producer count (the ratio on top), and the commit's
    latencies: end-txn answered, applied (CompleteCommit) and visible, p50 and p99."""
    plt = pyplot()
    fig, (rate, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = list(range(len(rows)))
    for offset, mode in ((-0.2, "idempotent"), (0.2, "transactions")):
        rate.bar(
            [x + offset for x in xs],
            [(r[mode] or {}).get("records_per_s", 0) for r in rows],
            width=0.4,
            label=mode,
        )
    for x, r in zip(xs, rows, strict=True):
        if r["ratio"] is not None:
            rate.annotate(f"{r['ratio']:.2f}x", (x + 0.2, 0), ha="center", va="bottom")
    rate.set_xticks(xs, [f"{r['producers']} producers" for r in rows])
    rate.set_title("records/s (ratio: transactions / idempotent)")
    rate.legend(fontsize=8)
    rate.grid(alpha=0.3, axis="y")
    names = [("end-txn", "end"), ("applied", "applied"), ("visible", "visible")]
    width = 0.8 / len(rows) if rows else 0.8
    for i, r in enumerate(rows):
        txn = r["transactions"] or {}
        for j, q in enumerate(("p50", "p99")):
            lat.bar(
                [k + (i - (len(rows) - 1) / 2) * width + (j - 0.5) * width / 2 for k in range(3)],
                [txn.get(f"{key}_{q}_ms") or 0 for _, key in names],
                width=width / 2,
                label=f"{r['producers']} producers {q}",
            )
    lat.set_xticks(range(3), [label for label, _ in names])
    lat.set_yscale("log")
    lat.set_title("after end-txn is sent: answered, applied, visible (ms)")
    lat.legend(fontsize=8)
    lat.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"kop-dedup transactions of {BATCHES_PER_ROUND} batches x {RECORDS_PER_BATCH} "
        f"records over {PARTITIONS} partitions vs the same records produced idempotently "
        "(best repetition by records/s)",
        fontsize=9,
    )
    save_figure(plt, fig, path)


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --transactions``: one sidecar for the run, stopped at the end."""
    sc = start_sidecar(args)
    try:
        with step("the transactions run", sc):
            cells, rows = run_transactions(args, sc, say)
    finally:
        sc.stop()
    print(write_txn_results(out, cells, rows, {"machine": machine(), "broker": broker}))


def add_options(p: argparse.ArgumentParser) -> None:
    """``--transactions`` (with bench's --producers, --reps, --seconds, --value-size)."""
    p.add_argument(
        "--transactions",
        action="store_true",
        help="transactions of 10 batches x 100 records over 2 partitions against the same "
        "records produced idempotently, per --producers count (transactions.json)",
    )


MODE = BenchMode(("transactions",), add_options, run)
