"""``kop-dedup bench --kafka``: unmodified Kafka clients through the sidecar's Kafka
listener against direct Pulsar clients, in one run; ``--against-kafka`` adds the same
Kafka clients against a real Apache Kafka broker (one KRaft node on free ports, started
for the run and stopped after), so a user sees what they trade.

Three measures, each side of each ``--reps`` times (the sides alternate; the table, the
plot and the JSON's ``summary`` show each side's best repetition by records/s, the JSON
keeps every one: :mod:`kop_dedup_tools.bench_kafka_results`):

- **produce**, per ``--kafka-producers`` count (default 1 and 8), for ``--seconds``:
  *direct*, the sidecar's own Pulsar producer code (``Publisher``: same names, sequence
  ids and properties, 5 batches of 100 records in flight per producer,
  :func:`~kop_dedup_tools.bench_produce.direct_cell`); *listener* (and *kafka*),
  confluent-kafka producers with ``acks=all``, idempotence, ``batch.num.messages=100``
  and a ``linger.ms`` long enough that every batch is full (:data:`PRODUCER_CONFIG`),
  each fed 100 records at a time round robin from one thread, 5 requests in flight. A
  fresh one-partition topic per cell; a cell counts the records delivered from its start
  to its last delivery report (the queue drained after ``--seconds``).
- **fetch**: a topic of ``--fetch-records`` records (100-record batches, filled through
  the listener; the real Kafka's by the same producer) read from the beginning to the
  end by a Pulsar reader (*direct*) and by a confluent-kafka consumer that assigns the
  partition (no group) through the listener (*listener*, *kafka*)
  (:mod:`kop_dedup_tools.bench_fetch`).
- **txn**, per producer count and ``--txn-records`` size: a confluent-kafka
  transactional producer per thread, begin, the records, commit, again, for
  ``--seconds``; compared with the idempotent produce row of the same count.

>>> kop-dedup bench --kafka --against-kafka --reps 2 --out bench-results
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_fetch import fill, read_direct, read_kafka
from kop_dedup_tools.bench_kafka_results import (
    MEASURES,
    KafkaCell,
    summarize_kafka,
    write_kafka_results,
)
from kop_dedup_tools.bench_produce import direct_cell, random_values
from kop_dedup_tools.bench_support import (
    BenchMode,
    full_topic,
    new_topic,
    say,
    start_sidecar,
    step,
)
from kop_dedup_tools.measure import percentile
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = [
    "MODE",
    "MODE_AGAINST_KAFKA",
    "PRODUCER_CONFIG",
    "RECORDS_PER_BATCH",
    "add_options",
    "create",
    "fetch_cells",
    "produce_cell",
    "real_kafka",
    "run",
    "txn_cell",
]

RECORDS_PER_BATCH = 100
PRODUCER_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "batch.num.messages": RECORDS_PER_BATCH,
    "batch.size": 1 << 20,  # never the limit: 100 records of 100 bytes are ~10 kB
    "linger.ms": 20,  # a batch waits for its 100th record, which comes within microseconds
    "queue.buffering.max.messages": 10 * RECORDS_PER_BATCH,  # 5 in flight, 5 waiting
}
"""What every Kafka producer of the run is given besides its bootstrap (and its
transactional id)."""

_FLUSH_S = 120.0


def _producer(bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Producer  # noqa: PLC0415 - the bench's own dependency

    return Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG, **extra})


def _produce_all(producer: Any, topic: str, value: bytes, n: int) -> None:
    """``n`` records into partition 0, waiting (serving callbacks) while the queue is full."""
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.001)
    producer.poll(0)


def _warm(producers: list[Any], topic: str) -> None:
    """Connect, learn the metadata and the producer ids before the clock starts."""
    for p in producers:
        p.produce(topic, b"warm-up", partition=0)
    for p in producers:
        if p.flush(60):
            raise RuntimeError(f"a warm-up record to {topic} was not delivered within 60 s")


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """A topic of ``partitions`` partitions through a Kafka AdminClient (the listener's or
    the real Kafka's)."""
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415
    from confluent_kafka.cimpl import NewTopic  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


class _Deliveries:
    """Delivery reports: how many came, a latency per batch (every 100th record's), the
    first failure."""

    def __init__(self) -> None:
        self.count = 0
        self.latencies: list[float] = []
        self.failure: Any = None

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failure = self.failure or err
            return
        if self.count % RECORDS_PER_BATCH == 0:
            self.latencies.append(msg.latency() or 0.0)
        self.count += 1


def produce_cell(
    side: str,
    bootstrap: str,
    producers: int,
    seconds: float,
    value_size: int,
    sidecar: SidecarProcess | None = None,
) -> KafkaCell:
    """Idempotent Kafka producers on a fresh one-partition topic for ``seconds``."""
    topic = f"bench-kafka-{uuid.uuid4().hex[:8]}"
    create(bootstrap, topic)
    value = random_values(1, value_size)[0]
    reports = _Deliveries()
    clients = [_producer(bootstrap, on_delivery=reports) for _ in range(producers)]
    _warm(clients, topic)
    reports.count, reports.latencies = 0, []
    cpu0, sc0, started = time.process_time(), _cpu(sidecar), time.monotonic()
    stop = started + seconds
    while time.monotonic() < stop and reports.failure is None:
        for p in clients:
            _produce_all(p, topic, value, RECORDS_PER_BATCH)
    for p in clients:
        if p.flush(_FLUSH_S):
            raise RuntimeError(f"{side}: records not delivered within {_FLUSH_S:.0f} s")
    elapsed = time.monotonic() - started
    if reports.failure is not None:
        raise RuntimeError(f"{side}: a delivery failed: {reports.failure}")
    return KafkaCell(
        side,
        "produce",
        producers,
        reports.count,
        elapsed,
        _ms(reports.latencies, 50),
        _ms(reports.latencies, 99),
        sidecar_cpu_pct=_pct(_cpu(sidecar) - sc0, elapsed) if sidecar else None,
        client_cpu_pct=_pct(time.process_time() - cpu0, elapsed),
    )


def direct_produce_cell(
    args: argparse.Namespace, producers: int, seconds: float, value_size: int
) -> KafkaCell:
    """The sidecar's own Pulsar producer code, straight to the broker."""
    topic = new_topic(args)
    cpu0 = time.process_time()
    cell = asyncio.run(
        direct_cell(
            args.pulsar_service_url,
            full_topic(topic),
            RECORDS_PER_BATCH,
            producers,
            seconds,
            value_size,
        )
    )
    return KafkaCell(
        "direct",
        "produce",
        producers,
        cell.records,
        cell.seconds,
        cell.p50_ms,
        cell.p99_ms,
        client_cpu_pct=_pct(time.process_time() - cpu0, cell.seconds),
    )


def txn_cell(
    side: str,
    bootstrap: str,
    producers: int,
    txn_records: int,
    seconds: float,
    value_size: int,
    sidecar: SidecarProcess | None = None,
) -> KafkaCell:
    """A transactional producer per thread, one transaction of ``txn_records`` after
    another, for ``seconds``; the records of committed transactions count."""
    topic = f"bench-ktxn-{uuid.uuid4().hex[:8]}"
    create(bootstrap, topic)
    value = random_values(1, value_size)[0]
    clients = []
    for i in range(producers):
        p = _producer(bootstrap, **{"transactional.id": f"{topic}-{i}"})
        p.init_transactions(60)
        clients.append(p)
    lock = threading.Lock()
    latencies: list[float] = []
    committed = [0]
    failures: list[BaseException] = []
    gate = threading.Barrier(producers + 1)
    stop = [0.0]

    def work(p: Any) -> None:
        gate.wait()
        try:
            while time.monotonic() < stop[0] and not failures:
                t0 = time.monotonic()
                p.begin_transaction()
                _produce_all(p, topic, value, txn_records)
                p.commit_transaction(60)
                with lock:
                    latencies.append(time.monotonic() - t0)
                    committed[0] += txn_records
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in clients]
    for t in threads:
        t.start()
    cpu0, sc0, started = time.process_time(), _cpu(sidecar), time.monotonic()
    stop[0] = started + seconds
    gate.wait()
    for t in threads:
        t.join(timeout=seconds + _FLUSH_S)
    elapsed = time.monotonic() - started
    if failures:
        raise RuntimeError(f"{side}: a transaction failed: {failures[0]}") from failures[0]
    return KafkaCell(
        side,
        "txn",
        producers,
        committed[0],
        elapsed,
        _ms(latencies, 50),
        _ms(latencies, 99),
        txn_records=txn_records,
        sidecar_cpu_pct=_pct(_cpu(sidecar) - sc0, elapsed) if sidecar else None,
        client_cpu_pct=_pct(time.process_time() - cpu0, elapsed),
    )


def fetch_cells(
    sides: dict[str, str],
    args: argparse.Namespace,
    sidecar: SidecarProcess | None,
) -> Iterator[KafkaCell]:
    """Fill a topic per Kafka bootstrap (``sides``: side -> bootstrap), then read each
    from the beginning to the end, ``--reps`` times per side, the order alternating;
    ``direct`` reads the listener's topic with a Pulsar reader."""
    records = args.fetch_records
    topics = {}
    for side, bootstrap in sides.items():
        topic = f"bench-kfetch-{uuid.uuid4().hex[:8]}"
        create(bootstrap, topic)
        t0 = time.monotonic()
        fill(bootstrap, topic, 1, records, args.value_size, RECORDS_PER_BATCH)
        say(
            f"bench: kafka: {side}'s {topic} filled with {records:,} records in "
            f"{time.monotonic() - t0:.1f}s"
        )
        topics[side] = topic
    order = ["direct", *sides] if "listener" in sides else list(sides)
    for rep in range(args.reps):
        for side in order if rep % 2 == 0 else order[::-1]:
            sc0 = _cpu(sidecar)
            if side == "direct":
                ptopic = f"{full_topic(topics['listener'])}-partition-0"
                seconds, cpu = read_direct(args.pulsar_service_url, [ptopic], records)
            else:
                seconds, cpu = read_kafka(sides[side], topics[side], 1, records)
            sc_cpu = _cpu(sidecar) - sc0
            yield KafkaCell(
                side,
                "fetch",
                1,
                records,
                seconds,
                sidecar_cpu_pct=_pct(sc_cpu, seconds) if side == "listener" else None,
                client_cpu_pct=_pct(cpu, seconds),
            )


# -- the run ---------------------------------------------------------------------------


def _cpu(sidecar: SidecarProcess | None) -> float:
    return sidecar.cpu_seconds() if sidecar is not None else 0.0


def _pct(cpu: float, seconds: float) -> float:
    return round(100 * cpu / seconds, 1) if seconds else 0.0


def _ms(samples: list[float], q: float) -> float | None:
    return round(percentile(samples, q) * 1000, 2) if samples else None


@contextlib.contextmanager
def real_kafka(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    """A throwaway Apache Kafka (one KRaft node, free ports) for the run, stopped and
    wiped after (its log kept in ``out``); nothing without ``--against-kafka``."""
    if not args.against_kafka:
        yield {}
        return
    from kop_dedup_tools import kafka_jars  # noqa: PLC0415
    from kop_dedup_tools.kafka_broker import LocalKafka  # noqa: PLC0415

    broker = LocalKafka.throwaway(out.resolve() / "kafka-logs")
    say(
        f"bench: starting Apache Kafka {kafka_jars.KAFKA_VERSION} for the run "
        f"({broker.bootstrap}, log {broker.log_file})"
    )
    try:
        with step(f"starting Apache Kafka (log {broker.log_file})"):
            seconds = broker.start()
        say(f"bench: Kafka ready in {seconds:.0f}s")
        yield {
            "bootstrap": broker.bootstrap,
            "version": kafka_jars.KAFKA_VERSION,
            "heap": broker.heap,
            "log": str(broker.log_file),
        }
    finally:
        broker.wipe()


def _report(cell: KafkaCell) -> None:
    size = f" of {cell.txn_records}" if cell.measure == "txn" else ""
    extra = f", sidecar cpu {cell.sidecar_cpu_pct:.0f}%" if cell.sidecar_cpu_pct else ""
    say(
        f"bench: kafka {cell.measure}{size} {cell.producers:>2} "
        f"{'consumer' if cell.measure == 'fetch' else 'producers'} {cell.mode:>8}: "
        f"{cell.records_per_s:>9,.0f} rec/s{extra}"
    )


def _produce_cells(
    args: argparse.Namespace, sc: SidecarProcess, boots: dict[str, str]
) -> Iterator[KafkaCell]:
    secs, size = args.seconds, args.value_size
    for producers in args.kafka_producers:
        for rep in range(args.reps):
            sides = ["direct", *boots]
            for side in sides if rep % 2 == 0 else sides[::-1]:
                with step(f"kafka produce, {producers} producers, {side}, rep {rep + 1}", sc):
                    if side == "direct":
                        yield direct_produce_cell(args, producers, secs, size)
                    else:
                        listener = sc if side == "listener" else None
                        yield produce_cell(side, boots[side], producers, secs, size, listener)


def _txn_cells(
    args: argparse.Namespace, sc: SidecarProcess, boots: dict[str, str]
) -> Iterator[KafkaCell]:
    for producers in args.kafka_producers:
        for n in args.txn_records:
            for rep in range(args.reps):
                pairs = list(boots.items())
                for side, b in pairs if rep % 2 == 0 else pairs[::-1]:
                    listener = sc if side == "listener" else None
                    with step(f"kafka txn of {n}, {producers} producers, {side}", sc):
                        yield txn_cell(
                            side, b, producers, n, args.seconds, args.value_size, listener
                        )


def _cells(
    args: argparse.Namespace, sc: SidecarProcess, kafka: dict[str, Any]
) -> Iterator[KafkaCell]:
    """Every cell of the measures asked for, in the order produce, fetch, txn."""
    boots = {"listener": sc.kafka_bootstrap}
    if kafka:
        boots["kafka"] = kafka["bootstrap"]
    if "produce" in args.kafka_measures:
        yield from _produce_cells(args, sc, boots)
    if "fetch" in args.kafka_measures:
        with step("kafka fetch", sc):
            yield from fetch_cells(boots, args, sc)
    if "txn" in args.kafka_measures:
        yield from _txn_cells(args, sc, boots)


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --kafka [--against-kafka]``: one sidecar (and one Kafka) for the
    run, stopped at the end."""
    cells: list[KafkaCell] = []
    with real_kafka(args, out) as kafka:
        sc = start_sidecar(args)
        try:
            for cell in _cells(args, sc, kafka):
                _report(cell)
                cells.append(cell)
        finally:
            sc.stop()
    setup = {
        "records_per_batch": RECORDS_PER_BATCH,
        "value_bytes": args.value_size,
        "seconds": args.seconds,
        "fetch_records": args.fetch_records,
        "measures": args.kafka_measures,
        "producer_config": PRODUCER_CONFIG,
        "kafka": kafka or None,
    }
    print(write_kafka_results(out, cells, summarize_kafka(cells), broker, setup))


def add_options(p: argparse.ArgumentParser) -> None:
    """``--kafka``, ``--against-kafka`` and their options (with bench's --reps,
    --seconds, --value-size)."""
    p.add_argument(
        "--kafka",
        action="store_true",
        help="Kafka clients (confluent-kafka) through the sidecar's Kafka listener against "
        "direct Pulsar clients: idempotent produce, fetch, transactions (kafka.json)",
    )
    p.add_argument(
        "--against-kafka",
        action="store_true",
        help="also run the same Kafka clients against a real Apache Kafka broker (one "
        "KRaft node on free ports, started for the run and stopped after); implies --kafka",
    )
    p.add_argument(
        "--kafka-producers", type=int, nargs="+", default=[1, 8], help="--kafka's producers"
    )
    p.add_argument(
        "--txn-records",
        type=int,
        nargs="+",
        default=[100, 1000],
        help="--kafka's records per transaction",
    )
    p.add_argument("--fetch-records", type=int, default=100_000, help="--kafka's records to fetch")
    p.add_argument(
        "--kafka-measures",
        nargs="+",
        choices=MEASURES,
        default=list(MEASURES),
        help="--kafka's measures to run (default all)",
    )


MODE = BenchMode(("kafka",), add_options, run)


def _options_come_with_kafka(_parser: argparse.ArgumentParser) -> None:
    """``--against-kafka`` is added with ``--kafka``'s options (:func:`add_options`)."""


MODE_AGAINST_KAFKA = BenchMode(("against_kafka",), _options_come_with_kafka, run)
"""``--against-kafka`` alone chooses the same run (its options come with :data:`MODE`)."""
