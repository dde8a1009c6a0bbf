"""``kop-dedup bench --kafka --groups``: Kafka consumer groups through the sidecar's
listener against direct Pulsar consumers, and the consume-transform-produce loop, in one
run; ``--against-kafka`` adds the same Kafka clients against a real Apache Kafka (one
KRaft node on free ports, started for the run and stopped after).

An input topic of :data:`~kop_dedup_tools.bench_groups_cells.PARTITIONS` partitions is
seeded once per Kafka bootstrap with ``--prefill`` records (100-record batches, an
idempotent confluent-kafka producer; the same number on each partition); every group of
the run is a fresh one reading it from the beginning. Then, each side ``--reps`` times
(the order alternating; the cells: :mod:`kop_dedup_tools.bench_kafka_groups_cells`):

- **consume**, per ``--members`` count (default 1 and 8): a group of that many
  confluent-kafka consumers (a thread each; ``consume(--pull-records)``, an
  asynchronous commit every 100 ms, a synchronous one at the end) reads the whole topic,
  timed from the moment the group is stable; *direct*, the ``--groups`` baseline on the
  listener's topic: a Pulsar consumer per member on the same number of partitions, batch
  receive and a cumulative acknowledgement
  (:func:`kop_dedup_tools.bench_groups_cells.direct_cell`). Target: the listener >= 0.5x
  direct.
- **ctp**, per ``--copiers`` count (default 1): copiers in a group, each a
  ``read_committed`` consumer and a transactional producer, one transaction of
  ``--ctp-records`` (default 100) records after another with
  ``send_offsets_to_transaction(..., consumer.consumer_group_metadata())``, for
  ``--seconds`` or until the input is copied; listener and real Kafka.

Results: ``<out>/kafka-groups.json`` and ``<out>/kafka-groups.png``
(:mod:`kop_dedup_tools.bench_kafka_groups_results`).

>>> kop-dedup bench --kafka --groups --against-kafka --members 1 8 --out bench-results
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_fetch import fill
from kop_dedup_tools.bench_groups_cells import PARTITIONS, direct_cell, pulsar_client
from kop_dedup_tools.bench_groups_results import GroupCell
from kop_dedup_tools.bench_kafka import RECORDS_PER_BATCH, create, real_kafka
from kop_dedup_tools.bench_kafka_groups_cells import (
    CONSUMER_CONFIG,
    DRAIN_S,
    consume_cell,
    ctp_cell,
)
from kop_dedup_tools.bench_kafka_groups_results import (
    CtpCell,
    KafkaGroupCell,
    write_kafka_group_results,
)
from kop_dedup_tools.bench_support import BenchError, BenchMode, say, start_sidecar, step
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["MODE", "MODE_AGAINST_KAFKA", "add_options", "run"]


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


def _consume_cells(
    args: argparse.Namespace,
    sc: SidecarProcess,
    boots: dict[str, str],
    topics: dict[str, str],
    per_partition: int,
) -> Iterator[GroupCell]:
    client = pulsar_client(args.pulsar_service_url)
    try:
        sides = ["direct", *boots]
        for members in args.members:
            assignment = [
                [p for p in range(PARTITIONS) if p % members == i] for i in range(members)
            ]
            for rep in range(1, args.reps + 1):
                for side in sides if rep % 2 else sides[::-1]:
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
                            )
                        else:
                            listener = sc if side == "listener" else None
                            yield consume_cell(
                                side,
                                boots[side],
                                topics[side],
                                members,
                                args.pull_records,
                                per_partition,
                                rep,
                                listener,
                            )
    finally:
        client.close()


def _ctp_cells(
    args: argparse.Namespace,
    sc: SidecarProcess,
    boots: dict[str, str],
    topics: dict[str, str],
    per_partition: int,
) -> Iterator[CtpCell]:
    sides = list(boots)
    for copiers in args.copiers:
        for rep in range(1, args.reps + 1):
            for side in sides if rep % 2 else sides[::-1]:
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


def _say_consume(cell: GroupCell) -> None:
    extra = ""
    if isinstance(cell, KafkaGroupCell):
        extra = (
            f", join {cell.join_s:.1f}s, commit p99 {cell.commit_p99_ms:.1f} ms, gaps "
            f"{cell.gaps}, committed to the end: {cell.committed_ok}"
        )
        if cell.cpu_pct is not None:
            extra += f", sidecar cpu {cell.cpu_pct:.0f}%"
    say(
        f"bench: kafka groups consume {cell.members:>2} members rep {cell.rep} "
        f"{cell.mode:>8}: {cell.records_per_s:>9,.0f} rec/s over {cell.seconds:.2f}s"
        f"{'' if cell.drained else ' (NOT drained)'}{extra}"
    )


def _say_ctp(cell: CtpCell) -> None:
    cpu = f", sidecar cpu {cell.sidecar_cpu_pct:.0f}%" if cell.sidecar_cpu_pct else ""
    say(
        f"bench: kafka groups ctp {cell.copiers:>2} copiers rep {cell.rep} {cell.mode:>8}: "
        f"{cell.records_per_s:>9,.0f} rec/s, {cell.transactions} transactions, p99 "
        f"{cell.p99_ms:.0f} ms, offsets committed as copied: {cell.committed_ok}{cpu}"
    )


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --kafka --groups [--against-kafka]``: one sidecar (and one
    Kafka) for the run, stopped at the end."""
    if not all(1 <= n <= PARTITIONS for n in [*args.members, *args.copiers]):
        raise BenchError(
            f"--members and --copiers must be between 1 and {PARTITIONS} (the partitions)"
        )
    per_partition = max(1, args.prefill // PARTITIONS)
    consume: list[GroupCell] = []
    ctp: list[CtpCell] = []
    with real_kafka(args, out) as kafka:
        sc = start_sidecar(args)
        try:
            boots = {"listener": sc.kafka_bootstrap}
            if kafka:
                boots["kafka"] = kafka["bootstrap"]
            topics = _seed(boots, args, per_partition)
            for cell in _consume_cells(args, sc, boots, topics, per_partition):
                _say_consume(cell)
                consume.append(cell)
            for ctp_cell_ in _ctp_cells(args, sc, boots, topics, per_partition):
                _say_ctp(ctp_cell_)
                ctp.append(ctp_cell_)
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
    print(write_kafka_group_results(out, consume, ctp, broker, setup))


def add_options(p: argparse.ArgumentParser) -> None:
    """The options only ``--kafka --groups`` has (it shares --members, --pull-records,
    --prefill, --reps, --seconds, --value-size and --against-kafka)."""
    p.add_argument(
        "--copiers",
        type=int,
        nargs="+",
        default=[1],
        help="with --kafka --groups: consume-transform-produce copiers",
    )
    p.add_argument(
        "--ctp-records",
        type=int,
        default=100,
        help="with --kafka --groups: records per consume-transform-produce transaction",
    )


MODE = BenchMode(("kafka", "groups"), add_options, run)


def _options_come_with_mode(_parser: argparse.ArgumentParser) -> None:
    """``--against-kafka --groups``: the options come with :data:`MODE`."""


MODE_AGAINST_KAFKA = BenchMode(("against_kafka", "groups"), _options_come_with_mode, run)
"""``--against-kafka --groups`` chooses the same run (``--against-kafka`` implies
``--kafka``)."""
