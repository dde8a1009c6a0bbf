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
counted to its round (:class:`Visibility`). A cell's latency is a produce request's;
the end-txn, applied and visible latencies are its own figures. The ratio is
transactions over idempotent records/s (the issue's target: at least 0.5, since the
data is written twice: to the journal, then copied). Results:
``<out>/transactions.json`` and ``transactions.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench.cells import Cell, Compare, Workload, extras
from kop_dedup_tools.bench.keepalive import KeepAlive, produce_body, records_json
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.support import say, start_sidecar, step
from kop_dedup_tools.measure import percentile_ms
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = [
    "BATCHES_PER_ROUND",
    "PARTITIONS",
    "RECORDS_PER_BATCH",
    "Visibility",
    "round_of",
    "round_values",
    "run",
    "run_transactions",
]

# a round: 10 batches of 100 records over the 2 partitions of a fresh topic
BATCHES_PER_ROUND = 10
RECORDS_PER_BATCH = 100
PARTITIONS = 2
ROUND = BATCHES_PER_ROUND * RECORDS_PER_BATCH
COMPARE = Compare("transactions", "idempotent")
TITLE = (
    f"kop-dedup transactions of {BATCHES_PER_ROUND} batches x {RECORDS_PER_BATCH} records over "
    f"{PARTITIONS} partitions vs the same rounds produced idempotently"
)
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
        values = round_values(self.index, round_no, ROUND, value_size)
        tid = self.tid if self.transactional else ""
        bodies = []
        for b in range(BATCHES_PER_ROUND):
            partition = b % PARTITIONS
            records = records_json(values[b * RECORDS_PER_BATCH : (b + 1) * RECORDS_PER_BATCH])
            base = self.next_seq[partition]
            self.next_seq[partition] += RECORDS_PER_BATCH
            pid, epoch = self.pid, self.epoch
            bodies.append(
                produce_body(
                    self.topic, partition, pid, epoch, base, RECORDS_PER_BATCH, records, tid
                )
            )
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
    sc: SidecarProcess, args: argparse.Namespace, mode: str, producers: int, rep: int
) -> Cell:
    topic = f"bench-txn-{uuid.uuid4().hex[:8]}"
    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
    seen = Visibility(ROUND)
    samples = _Samples()
    client = KeepAlive(sc.url)
    try:
        with _readers(args.pulsar_service_url, topic, seen):
            cpu0, started = sc.cpu_seconds(), time.monotonic()
            clients = [
                _Client(client, i, topic, mode == "transactions", samples, seen)
                for i in range(producers)
            ]
            stop_at = started + args.seconds
            await asyncio.gather(*(c.run(stop_at, args.value_size) for c in clients))
            elapsed = time.monotonic() - started
            cpu = sc.cpu_seconds() - cpu0
            grace = time.monotonic() + 10
            while seen.incomplete() and time.monotonic() < grace:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the readers are threads: nothing to await
    finally:
        await client.close()
    visible, end, applied = seen.latencies(), samples.end, samples.applied
    return Cell(
        Workload("rounds", producers, ROUND),
        mode,
        rep,
        samples.rounds * ROUND,
        elapsed,
        percentile_ms(samples.produce, 50),
        percentile_ms(samples.produce, 99),
        sidecar_cpu_s=cpu,
        extra=extras(
            rounds=samples.rounds,
            rounds_per_s=round(samples.rounds / elapsed, 2) if elapsed else None,
            visible_p50_ms=percentile_ms(visible, 50),
            visible_p99_ms=percentile_ms(visible, 99),
            end_p50_ms=percentile_ms(end, 50) if end else None,
            end_p99_ms=percentile_ms(end, 99) if end else None,
            applied_p50_ms=percentile_ms(applied, 50) if applied else None,
            applied_p99_ms=percentile_ms(applied, 99) if applied else None,
            unread_rounds=seen.incomplete(),
        ),
    )


def run_transactions(args: argparse.Namespace, sc: SidecarProcess) -> list[Cell]:
    """Every (producers, repetition, mode) cell, idempotent then transactions."""
    cells = []
    for producers in args.producers:
        for rep in range(1, args.reps + 1):
            for mode in ("idempotent", "transactions"):
                cells.append(asyncio.run(_cell(sc, args, mode, producers, rep)))
                say(cells[-1].progress())
    return cells


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --transactions``: one sidecar for the run, stopped at the end."""
    sc = start_sidecar(args)
    try:
        with step("the transactions run", sc):
            cells = run_transactions(args, sc)
    finally:
        sc.stop()
    setup = {
        "round": {
            "batches": BATCHES_PER_ROUND,
            "records_per_batch": RECORDS_PER_BATCH,
            "partitions": PARTITIONS,
        },
        "seconds": args.seconds,
        "value_bytes": args.value_size,
    }
    print(Results("transactions", TITLE, COMPARE, cells, setup, broker).write(out))
