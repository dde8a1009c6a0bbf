"""``kop-dedup bench --kafka``: unmodified Kafka clients through the sidecar's Kafka
listener against direct Pulsar clients, in one run; ``--against-kafka`` adds the same
Kafka clients against a real Apache Kafka broker (one KRaft node on free ports, started
for the run and stopped after), so a user sees what they trade.

Three measures, each side of each ``--reps`` times (the sides alternate; the table, the
plot and the JSON's ``summary`` show each side's best repetition by records/s, the JSON
keeps every one). The ratio is the listener over its baseline: the direct side for
produce and fetch; for txn the idempotent produce listener row of as many producers
(transactions through the listener against idempotence through the listener), against
the issue's goals (:data:`COMPARE`); "vs kafka" is the listener over the real Kafka.

- **produce**, per ``--kafka-producers`` count (default 1 and 8), for ``--seconds``:
  *direct*, the sidecar's own Pulsar producer code (``Publisher``: same names, sequence
  ids and properties, 5 batches of 100 records in flight per producer,
  :func:`~kop_dedup_tools.bench.produce.direct_cell`); *listener* (and *kafka*),
  confluent-kafka producers with ``acks=all``, idempotence, ``batch.num.messages=100``
  and a ``linger.ms`` long enough that every batch is full
  (:data:`~kop_dedup_tools.bench.kafka_clients.PRODUCER_CONFIG`), each fed 100 records
  at a time round robin from one thread, 5 requests in flight. A fresh one-partition
  topic per cell; a cell counts the records delivered from its start to its last
  delivery report (the queue drained after ``--seconds``).
- **fetch**, per ``--fetch-partitions`` count (default 1): a topic of that many
  partitions holding ``--fetch-records`` records (100-record batches at most, filled
  through the listener; the real Kafka's by the same producer) read from the beginning
  to the end by a Pulsar reader (*direct*; more than one partition: one Pulsar consumer
  of them all) and by a confluent-kafka read_committed consumer that assigns every
  partition (no group) through the listener (*listener*, *kafka*); each cell also says
  when its first record came (``first_record_ms``)
  (:mod:`kop_dedup_tools.bench.kafka_clients`).
- **txn**, per producer count and ``--txn-records`` size: a confluent-kafka
  transactional producer per thread, begin, the records, commit, again, for
  ``--seconds``; compared with the idempotent produce row of the same count.

Results: ``<out>/kafka.json`` and ``kafka.png``.

>>> kop-dedup bench --kafka --against-kafka --reps 2 --out bench-results
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from kop_dedup_tools.bench.cells import Cell, Compare, Workload, extras
from kop_dedup_tools.bench.kafka_clients import (
    PRODUCER_CONFIG,
    RECORDS_PER_BATCH,
    Deliveries,
    consume_direct,
    create,
    fill,
    kafka_producer,
    produce_all,
    read_direct,
    read_kafka,
    real_kafka,
    warm,
)
from kop_dedup_tools.bench.produce import direct_cell
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.support import (
    Sidecars,
    cpu_seconds,
    full_topic,
    new_topic,
    random_values,
    say,
    start_sidecar,
    step,
    turns,
)
from kop_dedup_tools.measure import percentile_ms
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["COMPARE", "MEASURES", "fetch_cells", "produce_cell", "run", "txn_cell"]

MEASURES = ("produce", "fetch", "txn")
COMPARE = Compare(
    "listener",
    "direct",
    "kafka",
    baseline_of={"txn": ("produce", "listener")},
    goals={"produce": 0.8, "fetch": 0.8, "fetch-parts": 0.8, "txn": 0.5},
)
TITLE = "Kafka clients through the kop-dedup listener vs direct Pulsar clients and a real Kafka"
_FLUSH_S = 120.0


def _ms(samples: list[float], q: float) -> float | None:
    return percentile_ms(samples, q) if samples else None


def _cell(
    kind: str,
    side: str,
    clients: int,
    size: int,
    rep: int,
    records: int,
    seconds: float,
    latencies: list[float],
    client_cpu: float,
    sidecar_cpu: float | None,
) -> Cell:
    """A cell of the Kafka clients (or the direct reader): the measuring process's CPU
    per record is its own figure."""
    return Cell(
        Workload(kind, clients, size),
        side,
        rep,
        records,
        seconds,
        _ms(latencies, 50),
        _ms(latencies, 99),
        sidecar_cpu,
        extra=extras(
            client_cpu_us_per_record=round(client_cpu / records * 1e6, 2) if records else None
        ),
    )


def produce_cell(
    side: str,
    bootstrap: str,
    producers: int,
    seconds: float,
    value_size: int,
    rep: int,
    sidecar: SidecarProcess | None = None,
    partitions: int = 1,
) -> Cell:
    """Idempotent Kafka producers on a fresh topic for ``seconds``, producer ``i`` on
    partition ``i % partitions``."""
    topic = f"bench-kafka-{uuid.uuid4().hex[:8]}"
    create(bootstrap, topic, partitions)
    value = random_values(1, value_size)[0]
    reports = Deliveries()
    clients = [kafka_producer(bootstrap, on_delivery=reports) for _ in range(producers)]
    warm(clients, topic, partitions)
    reports.count, reports.latencies = 0, []
    cpu0, sc0, started = time.process_time(), cpu_seconds(sidecar), time.monotonic()
    stop = started + seconds
    while time.monotonic() < stop and reports.failure is None:
        for i, p in enumerate(clients):
            produce_all(p, topic, value, RECORDS_PER_BATCH, i % partitions)
    for p in clients:
        if p.flush(_FLUSH_S):
            raise RuntimeError(f"{side}: records not delivered within {_FLUSH_S:.0f} s")
    elapsed = time.monotonic() - started
    if reports.failure is not None:
        raise RuntimeError(f"{side}: a delivery failed: {reports.failure}")
    return _cell(
        "produce",
        side,
        producers,
        RECORDS_PER_BATCH,
        rep,
        reports.count,
        elapsed,
        reports.latencies,
        time.process_time() - cpu0,
        cpu_seconds(sidecar) - sc0 if sidecar else None,
    )


def direct_produce_cell(args: argparse.Namespace, producers: int, rep: int) -> Cell:
    """The sidecar's own Pulsar producer code, straight to the broker, 5 batches in
    flight per producer; then (its own figures) 1 in flight, as many as an idempotent
    librdkafka producer keeps per partition with batches of 5 records or more (it counts
    *messages* in flight against its limit of 5 requests: rdkafka_broker.c
    ``RD_KAFKA_IDEMP_MAX_INFLIGHT - inflight``), so the Kafka side's ceiling shows."""
    topic = full_topic(new_topic(args))
    url, size = args.pulsar_service_url, RECORDS_PER_BATCH
    cpu0 = time.process_time()
    cell = asyncio.run(
        direct_cell(url, topic, size, producers, args.seconds, args.value_size, rep=rep)
    )
    cpu = time.process_time() - cpu0
    per_record = round(cpu / cell.records * 1e6, 2) if cell.records else None
    one = asyncio.run(
        direct_cell(
            url,
            full_topic(new_topic(args)),
            size,
            producers,
            args.seconds / 2,
            args.value_size,
            rep=rep,
            in_flight=1,
        )
    )
    return replace(
        cell,
        extra=extras(
            client_cpu_us_per_record=per_record,
            one_in_flight_rec_s=round(one.records_per_s),
            one_in_flight_p50_ms=None if one.p50_ms is None else round(one.p50_ms, 2),
        ),
    )


def txn_cell(
    side: str,
    bootstrap: str,
    producers: int,
    txn_records: int,
    seconds: float,
    value_size: int,
    rep: int,
    sidecar: SidecarProcess | None = None,
    partitions: int = 1,
) -> Cell:
    """A transactional producer per thread (producer ``i`` on partition ``i %
    partitions``), one transaction of ``txn_records`` after another, for ``seconds``; the
    records of committed transactions count."""
    topic = f"bench-ktxn-{uuid.uuid4().hex[:8]}"
    create(bootstrap, topic, partitions)
    value = random_values(1, value_size)[0]
    clients = []
    for i in range(producers):
        p = kafka_producer(bootstrap, **{"transactional.id": f"{topic}-{i}"})
        p.init_transactions(60)
        clients.append(p)
    lock = threading.Lock()
    latencies: list[float] = []
    committed = [0]
    failures: list[BaseException] = []
    gate = threading.Barrier(producers + 1)
    stop = [0.0]

    def work(p: Any, partition: int) -> None:
        gate.wait()
        try:
            while time.monotonic() < stop[0] and not failures:
                t0 = time.monotonic()
                p.begin_transaction()
                produce_all(p, topic, value, txn_records, partition)
                p.commit_transaction(60)
                with lock:
                    latencies.append(time.monotonic() - t0)
                    committed[0] += txn_records
        except Exception as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=work, args=(p, i % partitions), daemon=True)
        for i, p in enumerate(clients)
    ]
    for t in threads:
        t.start()
    cpu0, sc0, started = time.process_time(), cpu_seconds(sidecar), time.monotonic()
    stop[0] = started + seconds
    gate.wait()
    for t in threads:
        t.join(timeout=seconds + _FLUSH_S)
    elapsed = time.monotonic() - started
    if failures:
        raise RuntimeError(f"{side}: a transaction failed: {failures[0]}") from failures[0]
    return _cell(
        "txn",
        side,
        producers,
        txn_records,
        rep,
        committed[0],
        elapsed,
        latencies,
        time.process_time() - cpu0,
        cpu_seconds(sidecar) - sc0 if sidecar else None,
    )


def fetch_cells(
    sides: dict[str, str], args: argparse.Namespace, sidecar: SidecarProcess | None
) -> Iterator[Cell]:
    """Per ``--fetch-partitions`` count: fill a topic of that many partitions per Kafka
    bootstrap (``sides``: side -> bootstrap; record ``i`` on partition ``i % n``), then
    read each from the beginning to the end, ``--reps`` times per side, the order
    alternating; ``direct`` reads the listener's topic with a Pulsar reader (one
    partition) or one Pulsar consumer of all its partitions. One partition is the
    ``fetch`` workload, more the ``fetch-parts`` one (its size: the partitions)."""
    records = args.fetch_records
    for partitions in args.fetch_partitions:
        topics = {}
        for side, bootstrap in sides.items():
            topic = f"bench-kfetch-{uuid.uuid4().hex[:8]}"
            create(bootstrap, topic, partitions)
            t0 = time.monotonic()
            fill(bootstrap, topic, partitions, records, args.value_size, RECORDS_PER_BATCH)
            say(
                f"bench: kafka: {side}'s {topic} ({partitions} partitions) filled with "
                f"{records:,} records in {time.monotonic() - t0:.1f}s"
            )
            topics[side] = topic
        order = ["direct", *sides] if "listener" in sides else list(sides)
        kind, size = "fetch-parts", partitions
        if partitions == 1:
            kind, size = "fetch", RECORDS_PER_BATCH
        for rep in range(1, args.reps + 1):
            for side in turns(order, rep):
                sc0 = cpu_seconds(sidecar)
                if side == "direct" and partitions == 1:
                    ptopic = f"{full_topic(topics['listener'])}-partition-0"
                    read = read_direct(args.pulsar_service_url, [ptopic], records)
                elif side == "direct":
                    read = consume_direct(
                        args.pulsar_service_url, full_topic(topics["listener"]), records
                    )
                else:
                    read = read_kafka(sides[side], topics[side], partitions, records)
                sc_cpu = cpu_seconds(sidecar) - sc0 if side == "listener" else None
                cell = _cell(kind, side, 1, size, rep, records, read.seconds, [], read.cpu, sc_cpu)
                first_ms = None if read.first_s is None else round(read.first_s * 1000, 1)
                yield replace(cell, extra={**cell.extra, **extras(first_record_ms=first_ms)})


def _listener(side: str, sc: SidecarProcess) -> SidecarProcess | None:
    return sc if side == "listener" else None


def _produce_cells(
    args: argparse.Namespace, sc: SidecarProcess, boots: dict[str, str]
) -> Iterator[Cell]:
    secs, size = args.seconds, args.value_size
    for producers in args.kafka_producers:
        for rep in range(1, args.reps + 1):
            for side in turns(["direct", *boots], rep):
                with step(f"kafka produce, {producers} producers, {side}, rep {rep}", sc):
                    if side == "direct":
                        yield direct_produce_cell(args, producers, rep)
                    else:
                        b, listener = boots[side], _listener(side, sc)
                        yield produce_cell(side, b, producers, secs, size, rep, listener)


def _txn_cells(
    args: argparse.Namespace, sc: SidecarProcess, boots: dict[str, str]
) -> Iterator[Cell]:
    secs, size = args.seconds, args.value_size
    for producers in args.kafka_producers:
        for n in args.txn_records:
            for rep in range(1, args.reps + 1):
                for side in turns(list(boots), rep):
                    b, listener = boots[side], _listener(side, sc)
                    with step(f"kafka txn of {n}, {producers} producers, {side}", sc):
                        yield txn_cell(side, b, producers, n, secs, size, rep, listener)


def _cells(args: argparse.Namespace, sc: SidecarProcess, kafka: dict[str, Any]) -> Iterator[Cell]:
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


def _members(sc: SidecarProcess, count: int, timeout_s: float = 60.0) -> None:
    """Wait until ``sc`` lists ``count`` nodes in its cluster."""
    deadline = time.monotonic() + timeout_s
    while len(httpx.get(f"{sc.url}/v1/cluster", timeout=10).json()["nodes"]) != count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster did not list {count} nodes within {timeout_s:.0f} s")
        time.sleep(0.2)


def _node_cells(args: argparse.Namespace) -> Iterator[Cell]:
    """``--nodes``: produce and transactions through a cluster of each size asked for, on
    this host: sidecar processes of a system namespace of their own (so the cluster is
    them alone), each producer on its own partition of a topic of ``max(--nodes)``
    partitions, so a second node leads half of them and coordinates half of the
    transactional ids. Clients bootstrap to the first node."""
    partitions, secs, size = max(args.nodes), args.seconds, args.value_size
    system = f"kop-dedup-bench-nodes-{uuid.uuid4().hex[:8]}"
    nodes: list[SidecarProcess] = []
    try:
        for n in sorted(set(args.nodes)):
            nodes.extend(
                start_sidecar(args, system_namespace=system) for _ in range(n - len(nodes))
            )
            _members(nodes[0], n)
            side, boot = f"{n} node{'s' if n > 1 else ''}", nodes[0].kafka_bootstrap
            for producers in args.kafka_producers:
                for rep in range(1, args.reps + 1):
                    with step(
                        f"kafka produce, {producers} producers, {side}, rep {rep}", Sidecars(nodes)
                    ):
                        yield produce_cell(side, boot, producers, secs, size, rep, None, partitions)
            for producers in args.kafka_producers if "txn" in args.kafka_measures else []:
                for records in args.txn_records:
                    for rep in range(1, args.reps + 1):
                        with step(
                            f"kafka txn of {records}, {producers} producers, {side}",
                            Sidecars(nodes),
                        ):
                            yield txn_cell(
                                side, boot, producers, records, secs, size, rep, None, partitions
                            )
    finally:
        for sc in nodes:
            sc.stop()


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --kafka [--against-kafka] [--nodes 1 2]``: one sidecar (and one
    Kafka) for the run, more nodes for ``--nodes``, stopped at the end."""
    cells: list[Cell] = []
    with real_kafka(args, out) as kafka:
        sc = start_sidecar(args)
        try:
            for cell in _cells(args, sc, kafka):
                say(cell.progress())
                cells.append(cell)
            for cell in _node_cells(args) if len(set(args.nodes)) > 1 else []:
                say(cell.progress())
                cells.append(cell)
        finally:
            sc.stop()
    setup = {
        "records_per_batch": RECORDS_PER_BATCH,
        "value_bytes": args.value_size,
        "seconds": args.seconds,
        "fetch_records": args.fetch_records,
        "fetch_partitions": args.fetch_partitions,
        "measures": args.kafka_measures,
        "nodes": sorted(set(args.nodes)),
        "producer_config": PRODUCER_CONFIG,
        "kafka": kafka or None,
    }
    print(Results("kafka", TITLE, COMPARE, cells, setup, broker).write(out))
