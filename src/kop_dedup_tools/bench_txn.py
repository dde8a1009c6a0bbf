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
twice: to the journal, then copied): :mod:`kop_dedup_tools.bench_txn_results`.
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
from kop_dedup_tools.bench_support import BenchMode, say, start_sidecar, step
from kop_dedup_tools.bench_txn_results import (
    BATCHES_PER_ROUND,
    PARTITIONS,
    RECORDS_PER_BATCH,
    TxnCell,
    plot_txn,
    render_txn_table,
    summarize_txn,
    write_txn_results,
)
from kop_dedup_tools.measure import percentile_ms
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = [
    "BATCHES_PER_ROUND",
    "MODE",
    "PARTITIONS",
    "RECORDS_PER_BATCH",
    "TxnCell",
    "Visibility",
    "plot_txn",
    "render_txn_table",
    "round_values",
    "run_transactions",
    "summarize_txn",
]

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
        percentile_ms(samples.produce, 50),
        percentile_ms(samples.produce, 99),
        percentile_ms(visible, 50),
        percentile_ms(visible, 99),
        end_p50_ms=percentile_ms(samples.end, 50) if samples.end else None,
        end_p99_ms=percentile_ms(samples.end, 99) if samples.end else None,
        applied_p50_ms=percentile_ms(applied, 50) if applied else None,
        applied_p99_ms=percentile_ms(applied, 99) if applied else None,
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


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --transactions``: one sidecar for the run, stopped at the end."""
    sc = start_sidecar(args)
    try:
        with step("the transactions run", sc):
            cells, rows = run_transactions(args, sc, say)
    finally:
        sc.stop()
    print(write_txn_results(out, cells, rows, broker))


def add_options(p: argparse.ArgumentParser) -> None:
    """``--transactions`` (with bench's --producers, --reps, --seconds, --value-size)."""
    p.add_argument(
        "--transactions",
        action="store_true",
        help="transactions of 10 batches x 100 records over 2 partitions against the same "
        "records produced idempotently, per --producers count (transactions.json)",
    )


MODE = BenchMode(("transactions",), add_options, run)
