"""Fetch through the Kafka listener against a direct Pulsar reader of the same topic.

A measurement for the read side (``python -m kop_dedup_tools.bench_fetch``): a fresh
topic is filled through the listener by an idempotent confluent-kafka producer
(``--batch`` records of ``--size`` bytes per batch: one Pulsar entry each), then read
from the beginning to the end, ``--reps`` times, alternately by

- **direct**: a Pulsar reader (the Python client's blocking ``read_next``, one thread)
  on each partition topic in turn: what a Pulsar application pays;
- **kafka**: a confluent-kafka consumer that assigns every partition from the
  beginning and ``consume()``s until it has every record, through a ``kop-dedup
  serve`` process started here.

Each side's rate is records over the time from its start (reader or consumer created)
to its last record; the best repetition of each counts, and the ratio is kafka over
direct. CPU per record is sampled too: the reading process's (the direct reader, or the
consumer) and the sidecar's (on a busy machine wall-clock rates swing; CPU per record
says what each side costs).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = ["fill", "main", "measure", "read_direct", "read_kafka"]


def fill(bootstrap: str, topic: str, partitions: int, records: int, size: int, batch: int) -> None:
    from confluent_kafka import Producer  # noqa: PLC0415 - a measurement's own dependency

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 100,
            "batch.num.messages": batch,
            "batch.size": 10 << 20,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i).encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("the fill did not flush within 300 s")


def read_direct(service_url: str, ptopics: list[str], records: int) -> tuple[float, float]:
    import pulsar  # noqa: PLC0415 - a measurement's own dependency

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        started, cpu = time.monotonic(), time.process_time()
        got = 0
        for ptopic in ptopics:
            reader = client.create_reader(ptopic, pulsar.MessageId.earliest)
            while reader.has_message_available():
                msg = reader.read_next(10_000)
                msg.data()
                got += 1
            reader.close()
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    finally:
        client.close()
    if got != records:
        raise RuntimeError(f"direct: read {got} records, expected {records}")
    return elapsed, cpu


def read_kafka(bootstrap: str, topic: str, partitions: int, records: int) -> tuple[float, float]:
    from confluent_kafka import (  # noqa: PLC0415 - a measurement's own dependency
        OFFSET_BEGINNING,
        Consumer,
        TopicPartition,
    )

    started, cpu = time.monotonic(), time.process_time()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got = 0
        deadline = started + 600
        while got < records and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if msg.error() is None:
                    got += 1
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    finally:
        consumer.close()
    if got != records:
        raise RuntimeError(f"kafka: read {got} records, expected {records}")
    return elapsed, cpu


def measure(
    service_url: str,
    admin_url: str,
    *,
    records: int,
    partitions: int,
    size: int,
    batch: int,
    reps: int,
    log_dir: Path,
) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415
    from confluent_kafka.cimpl import NewTopic  # noqa: PLC0415

    from kop_dedup_tools.sidecar import SidecarProcess  # noqa: PLC0415

    with SidecarProcess(service_url, admin_url, log_dir=log_dir) as sidecar:  # started
        bootstrap = sidecar.kafka_bootstrap
        topic = f"bench-fetch-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
        filled = time.monotonic()
        fill(bootstrap, topic, partitions, records, size, batch)
        fill_s = time.monotonic() - filled
        ptopics = [f"persistent://public/kafka/{topic}-partition-{p}" for p in range(partitions)]
        runs: dict[str, list[dict[str, float]]] = {"direct": [], "kafka": []}
        for rep in range(reps):
            order = ("kafka", "direct") if rep % 2 else ("direct", "kafka")
            for side in order:
                sidecar_cpu = sidecar.cpu_seconds()
                seconds, client_cpu = (
                    read_direct(service_url, ptopics, records)
                    if side == "direct"
                    else read_kafka(bootstrap, topic, partitions, records)
                )
                sidecar_cpu = sidecar.cpu_seconds() - sidecar_cpu
                runs[side].append(
                    {
                        "seconds": round(seconds, 3),
                        "records_per_s": round(records / seconds),
                        "client_cpu_us_per_record": round(client_cpu / records * 1e6, 2),
                        "sidecar_cpu_us_per_record": round(sidecar_cpu / records * 1e6, 2),
                    }
                )
    best = {side: max(r["records_per_s"] for r in rs) for side, rs in runs.items()}
    return {
        "records": records,
        "partitions": partitions,
        "record_bytes": size,
        "batch_records": batch,
        "fill_seconds": round(fill_s, 1),
        "runs": runs,
        "best_records_per_s": best,
        "ratio": round(best["kafka"] / best["direct"], 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pulsar-url", default="pulsar://127.0.0.1:6650")
    parser.add_argument("--admin-url", default="http://127.0.0.1:8080")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
    result = measure(
        args.pulsar_url,
        args.admin_url,
        records=args.records,
        partitions=args.partitions,
        size=args.size,
        batch=args.batch,
        reps=args.reps,
        log_dir=log_dir,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
