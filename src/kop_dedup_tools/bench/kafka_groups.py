"""``kop-dedup bench --kafka --groups``: Kafka consumer groups through the sidecar's
listener against direct Pulsar consumers, and the consume-transform-produce loop, in one
run; ``--against-kafka`` adds the same Kafka clients against a real Apache Kafka (one
KRaft node on free ports, started for the run and stopped after).

An input topic of :data:`~kop_dedup_tools.bench.groups_cells.PARTITIONS` partitions is
seeded once per Kafka bootstrap with ``--prefill`` records (100-record batches, an
idempotent confluent-kafka producer; the same number on each partition); every group of
the run is a fresh one reading it from the beginning. Then, each side ``--reps`` times
(the order alternating; the cells: :mod:`kop_dedup_tools.bench.kafka_groups_cells`):

- **consume**, per ``--members`` count (default 1 and 8): a group of that many
  confluent-kafka consumers (a thread each; ``consume(--pull-records)``, an
  asynchronous commit every 100 ms, a synchronous one at the end) reads the whole topic,
  timed from the moment the group is stable; *direct*, the ``--groups`` baseline on the
  listener's topic: a Pulsar consumer per member on the same number of partitions, batch
  receive and a cumulative acknowledgement
  (:func:`kop_dedup_tools.bench.groups_cells.direct_cell`). Target: the listener >= 0.5x
  direct.
- **ctp**, per ``--copiers`` count (default 1): copiers in a group, each a
  ``read_committed`` consumer and a transactional producer, one transaction of
  ``--ctp-records`` (default 100) records after another with
  ``send_offsets_to_transaction(..., consumer.consumer_group_metadata())``, for
  ``--seconds`` or until the input is copied; listener and real Kafka.

Results: ``<out>/kafka-groups.json`` and ``<out>/kafka-groups.png``; a consume row's
ratio is the listener over direct (the goal: :data:`COMPARE`), both rows' "vs kafka"
the listener over the real Kafka.

>>> kop-dedup bench --kafka --groups --against-kafka --members 1 8 --out bench-results
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench.cells import Cell, Compare
from kop_dedup_tools.bench.groups_cells import PARTITIONS, direct_cell, pulsar_client
from kop_dedup_tools.bench.kafka_clients import RECORDS_PER_BATCH, create, fill, real_kafka
from kop_dedup_tools.bench.kafka_groups_cells import (
    CONSUMER_CONFIG,
    DRAIN_S,
    consume_cell,
    ctp_cell,
)
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.support import BenchError, say, start_sidecar, step, turns
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["COMPARE", "run"]

COMPARE = Compare("listener", "direct", "kafka", goals={"consume": 0.5})
TITLE = (
    "Kafka consumer groups through the kop-dedup listener vs direct Pulsar consumers and a "
    "real Kafka"
)


def _seed(boots: dict[str, str], args: argparse.Namespace, per_partition: int) -> dict[str, str]:
    """An input topic per Kafka bootstrap (side -> bootstrap), filled; side -> topic."""
    topics = {}
    for side, bootstrap in boots.items():
        topic = f"bench-kgroups-{uuid.uuid4().hex[:8]}"
        records = per_partition * PARTITIONS
        with step(f"seeding {side}'s {topic} with {records:,} records"):
            create(bootstrap, topic, PARTITIONS)
            t0 = time.monotonic()
            fill(bootstrap, topic, PARTITIONS, records, args.value_size, RECORDS_PER_BATCH)
        say(f"bench: kafka groups: {side}'s {topic} seeded in {time.monotonic() - t0:.1f}s")
        topics[side] = topic
    return topics


def _cells(
    args: argparse.Namespace,
    sc: SidecarProcess,
    boots: dict[str, str],
    topics: dict[str, str],
    per_partition: int,
) -> Iterator[Cell]:
    """The consume cells (each members count, repetition and side), then the ctp ones."""
    client = pulsar_client(args.pulsar_service_url)
    try:
        for members in args.members:
            assignment = [
                [p for p in range(PARTITIONS) if p % members == i] for i in range(members)
            ]
            for rep in range(1, args.reps + 1):
                for side in turns(["direct", *boots], rep):
                    with step(f"kafka groups consume, {members} members, {side}, rep {rep}", sc):
                        if side == "direct":
                            yield direct_cell(
                                client,
                                topics["listener"],
                                assignment,
                                args.pull_records,
                                DRAIN_S,
                                per_partition,
                                rep,
                                kind="consume",
                            )
                        else:
                            yield consume_cell(
                                side,
                                boots[side],
                                topics[side],
                                members,
                                args.pull_records,
                                per_partition,
                                rep,
                                sc if side == "listener" else None,
                            )
    finally:
        client.close()
    for copiers in args.copiers:
        for rep in range(1, args.reps + 1):
            for side in turns(list(boots), rep):
                with step(f"kafka groups ctp, {copiers} copiers, {side}, rep {rep}", sc):
                    yield ctp_cell(
                        side,
                        boots[side],
                        topics[side],
                        copiers,
                        args.ctp_records,
                        args.seconds,
                        per_partition,
                        rep,
                        sc if side == "listener" else None,
                    )


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --kafka --groups [--against-kafka]``: one sidecar (and one
    Kafka) for the run, stopped at the end."""
    if not all(1 <= n <= PARTITIONS for n in [*args.members, *args.copiers]):
        raise BenchError(
            f"--members and --copiers must be between 1 and {PARTITIONS} (the partitions)"
        )
    per_partition = max(1, args.prefill // PARTITIONS)
    cells: list[Cell] = []
    with real_kafka(args, out) as kafka:
        sc = start_sidecar(args)
        try:
            boots = {"listener": sc.kafka_bootstrap}
            if kafka:
                boots["kafka"] = kafka["bootstrap"]
            topics = _seed(boots, args, per_partition)
            for cell in _cells(args, sc, boots, topics, per_partition):
                say(cell.progress())
                cells.append(cell)
        finally:
            sc.stop()
    setup = {
        "partitions": PARTITIONS,
        "records": per_partition * PARTITIONS,
        "value_bytes": args.value_size,
        "pull_records": args.pull_records,
        "ctp_records": args.ctp_records,
        "ctp_seconds": args.seconds,
        "consumer_config": CONSUMER_CONFIG,
        "kafka": kafka or None,
    }
    print(Results("kafka-groups", TITLE, COMPARE, cells, setup, broker).write(out))
