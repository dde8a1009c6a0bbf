"""``kop-dedup bench --wide-produce``: many idempotent producers over many partitions
(default 20 librdkafka producers over 512 partitions, 10,240 producer names) through the
sidecar's Kafka listener, beside as many direct Pulsar producers on the same kind of
topic (``--against-kafka``: and a real Kafka broker), in one run.

Each side first opens every producer name (the Kafka producers: one warm-up record to
every partition each; the direct producers open every partition's producer when
created; timed as ``open_s``), then writes ``--wide-records`` records of
``--value-size`` bytes spread evenly over producers and partitions (record ``j``:
producer ``j % producers``, partition ``(j // producers) % partitions``), from one
thread, and waits for every acknowledgement; a cell is timed from the first record to
the last acknowledgement, on a fresh topic.

- *listener* (and *kafka*): confluent-kafka producers, idempotence on, ``acks=all``,
  ``linger.ms=20``, ``batch.num.messages=100`` (:data:`WIDE_CONFIG`).
- *direct*: pulsar-client producers on the partitioned topic, round-robin routing,
  batches of at most 100 messages, ``send_async``.

The listener's cell also reports the sidecar's RSS before the first name opens and its
peak (sampled every 0.2 s, over the opening and the cell), and the most Pulsar producers
it held at once (``peakHeldProducers`` of /v1/stats, never above
``KOP_DEDUP_MAX_OPEN_PRODUCERS``; ``--max-open-producers`` sets it for the run).
Results: ``<out>/wide-produce.json`` and ``wide-produce.png``.

>>> kop-dedup bench --wide-produce --against-kafka --wide-records 100000
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Self

import httpx

from kop_dedup_tools.bench.cells import Cell, Compare, Workload, extras
from kop_dedup_tools.bench.kafka_clients import Deliveries, create, real_kafka
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.support import (
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

__all__ = ["KIND", "WIDE_CONFIG", "add_cli", "direct_cell", "kafka_cell", "run"]

KIND = "produce-wide"
WIDE_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "batch.num.messages": 100,
    "queue.buffering.max.messages": 1_000_000,
}
"""What every Kafka producer of the cell is given besides its bootstrap."""
COMPARE = Compare("listener", "direct", "kafka", goals={KIND: 0.8})
TITLE = "Idempotent produce over many partitions: the kop-dedup listener vs direct Pulsar"
_FLUSH_S = 300.0


class _Rss:
    """The sidecar's RSS (MiB) at start and its peak, sampled every 0.2 s."""

    def __init__(self, sidecar: SidecarProcess | None) -> None:
        self.sidecar = sidecar
        self.start = self.peak = sidecar.rss_mb() if sidecar else 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while self.sidecar is not None and not self._done.wait(0.2):
            self.peak = max(self.peak, self.sidecar.rss_mb())

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(2)
        if self.sidecar is not None:
            self.peak = max(self.peak, self.sidecar.rss_mb())


def _spread(records: int, producers: int, partitions: int) -> list[list[int]]:
    """The partition of each record, per producer, in the order produced."""
    out: list[list[int]] = [[] for _ in range(producers)]
    for j in range(records):
        out[j % producers].append((j // producers) % partitions)
    return out


def kafka_cell(
    side: str, bootstrap: str, args: argparse.Namespace, rep: int, sc: SidecarProcess | None
) -> Cell:
    """Idempotent confluent-kafka producers over a fresh topic of many partitions."""
    from confluent_kafka import Producer  # noqa: PLC0415 - the bench's own dependency

    producers, partitions = args.wide_producers, args.wide_partitions
    topic = f"bench-wide-{uuid.uuid4().hex[:8]}"
    create(bootstrap, topic, partitions)
    value = random_values(1, args.value_size)[0]
    reports = Deliveries()
    clients = [
        Producer({"bootstrap.servers": bootstrap, **WIDE_CONFIG, "on_delivery": reports})
        for _ in range(producers)
    ]
    plan = _spread(args.wide_records, producers, partitions)
    with _Rss(sc) as rss:  # from before the first name opens
        warm = time.monotonic()  # every name opened once, as the direct side's at creation
        _flush(side, clients, [list(range(partitions))] * producers, topic, b"w", _FLUSH_S)
        opened_s = time.monotonic() - warm
        reports.count, reports.latencies = 0, []
        cpu0, sc0, started = time.process_time(), cpu_seconds(sc), time.monotonic()
        _flush(side, clients, plan, topic, value, _FLUSH_S)
        elapsed = time.monotonic() - started
        sc_cpu = cpu_seconds(sc) - sc0 if sc else None
    if reports.failure is not None:
        raise RuntimeError(f"{side}: a delivery failed: {reports.failure}")
    held = None
    if sc is not None:
        held = httpx.get(f"{sc.url}/v1/stats", timeout=10).json().get("peakHeldProducers")
    return _cell(
        side,
        args,
        rep,
        reports.count,
        elapsed,
        reports.latencies,
        sc_cpu,
        rss if sc else None,
        client_cpu_us_per_record=_per_record(time.process_time() - cpu0, reports.count),
        open_s=round(opened_s, 1),
        peak_held_producers=held,
    )


def _flush(
    side: str,
    clients: list[Any],
    plan: list[list[int]] | list[tuple[int]],
    topic: str,
    value: bytes,
    timeout: float,
) -> None:
    """Each client's records into the partitions ``plan`` gives it, the clients taking
    turns a record at a time, then every acknowledgement (``timeout`` s at most)."""
    for i in range(max(map(len, plan))):
        for p, mine in zip(clients, plan, strict=True):
            if i < len(mine):
                _produce(p, topic, value, mine[i])
    for p in clients:
        if p.flush(timeout):
            raise RuntimeError(f"{side}: records not delivered within {timeout:.0f} s")


def _produce(producer: Any, topic: str, value: bytes, partition: int) -> None:
    while True:
        try:
            producer.produce(topic, value, partition=partition)
        except BufferError:
            producer.poll(0.001)
        else:
            return


def direct_cell(args: argparse.Namespace, rep: int) -> Cell:
    """As many pulsar-client producers on a fresh partitioned topic, round robin,
    batches of at most 100 messages."""
    import pulsar  # noqa: PLC0415 - a measurement's own dependency

    producers, partitions = args.wide_producers, args.wide_partitions
    topic = full_topic(new_topic(args, partitions, stem="bench-wide"))
    value = random_values(1, args.value_size)[0]
    client = pulsar.Client(
        args.pulsar_service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )
    lock = threading.Lock()
    acked, failures, latencies = [0], [], []
    everything = threading.Event()
    try:
        warm = time.monotonic()  # every partition's producer opens at creation
        clients = [
            client.create_producer(
                topic,
                message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                batching_enabled=True,
                batching_max_messages=100,
                batching_max_publish_delay_ms=20,
                max_pending_messages=0,
                block_if_queue_full=True,
                send_timeout_millis=int(_FLUSH_S * 1000),
            )
            for _ in range(producers)
        ]
        opened_s = time.monotonic() - warm
        total = args.wide_records

        def done(res: Any, _msg_id: Any, sent: float) -> None:
            with lock:
                if res != pulsar.Result.Ok:
                    failures.append(res)
                acked[0] += 1
                if acked[0] % 100 == 0:
                    latencies.append(time.monotonic() - sent)
                if acked[0] == total:
                    everything.set()

        cpu0, started = time.process_time(), time.monotonic()
        for j in range(total):
            now = time.monotonic()
            clients[j % producers].send_async(value, lambda r, m, t=now: done(r, m, t))
        if not everything.wait(_FLUSH_S):
            raise RuntimeError(f"direct: {acked[0]} of {total} acknowledged in {_FLUSH_S:.0f} s")
        elapsed = time.monotonic() - started
        cpu = time.process_time() - cpu0
        for p in clients:
            p.close()
    finally:
        client.close()
    if failures:
        raise RuntimeError(f"direct: {len(failures)} sends failed, the first {failures[0]}")
    return _cell(
        "direct",
        args,
        rep,
        total,
        elapsed,
        latencies,
        None,
        None,
        client_cpu_us_per_record=_per_record(cpu, total),
        open_s=round(opened_s, 1),
    )


def _per_record(cpu: float, records: int) -> float | None:
    return round(cpu / records * 1e6, 2) if records else None


def _cell(
    side: str,
    args: argparse.Namespace,
    rep: int,
    records: int,
    seconds: float,
    latencies: list[float],
    sidecar_cpu: float | None,
    rss: _Rss | None,
    **figures: Any,
) -> Cell:
    return Cell(
        Workload(KIND, args.wide_producers, args.wide_partitions),
        side,
        rep,
        records,
        seconds,
        percentile_ms(latencies, 50) if latencies else None,
        percentile_ms(latencies, 99) if latencies else None,
        sidecar_cpu,
        None if rss is None else round(rss.peak, 1),
        extra=extras(rss_start_mb=None if rss is None else round(rss.start, 1), **figures),
    )


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """One sidecar (and one Kafka with ``--against-kafka``) for the run."""
    cells: list[Cell] = []
    bound = args.max_open_producers
    with real_kafka(args, out) as kafka:
        sc = start_sidecar(args, **({"max_open_producers": bound} if bound else {}))
        boots = {"listener": sc.kafka_bootstrap}
        if kafka:
            boots["kafka"] = kafka["bootstrap"]
        try:
            for rep in range(1, args.reps + 1):
                for side in turns(["direct", *boots], rep):
                    what = f"wide produce, {args.wide_producers} producers x "
                    with step(f"{what}{args.wide_partitions} partitions, {side}, rep {rep}", sc):
                        if side == "direct":
                            cell = direct_cell(args, rep)
                        else:
                            listener = sc if side == "listener" else None
                            cell = kafka_cell(side, boots[side], args, rep, listener)
                    say(cell.progress() + _memory(cell))
                    cells.append(cell)
        finally:
            sc.stop()
    setup = {
        "records": args.wide_records,
        "producers": args.wide_producers,
        "partitions": args.wide_partitions,
        "value_bytes": args.value_size,
        "max_open_producers": bound,
        "producer_config": WIDE_CONFIG,
        "kafka": kafka or None,
    }
    print(Results("wide-produce", TITLE, COMPARE, cells, setup, broker).write(out))


def _memory(cell: Cell) -> str:
    if cell.rss_mb is None:
        return ""
    start, held = cell.extra.get("rss_start_mb"), cell.extra.get("peak_held_producers")
    return f", sidecar rss {start} -> {cell.rss_mb} MiB, peak producers held {held}"


def add_cli(p: argparse.ArgumentParser) -> None:
    """``--wide-produce`` and its options."""
    p.add_argument(
        "--wide-produce",
        action="store_true",
        help="idempotent Kafka producers over many partitions through the listener against "
        "direct Pulsar producers (with --against-kafka: and a real Kafka), the sidecar's "
        "RSS at start and peak (wide-produce.json)",
    )
    p.add_argument("--wide-producers", type=int, default=20, help="with --wide-produce")
    p.add_argument("--wide-partitions", type=int, default=512, help="with --wide-produce")
    p.add_argument("--wide-records", type=int, default=200_000, help="with --wide-produce")
    p.add_argument(
        "--max-open-producers",
        type=int,
        default=None,
        help="with --wide-produce: the sidecar's KOP_DEDUP_MAX_OPEN_PRODUCERS (default: "
        "the setting's default)",
    )
