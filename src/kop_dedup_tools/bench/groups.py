"""``kop-dedup bench --groups``: consumer-group pulls through the sidecar against direct
Pulsar consumers on the same topic, in one run.

Per members count (``--members``, default 1 and 8) and repetition, a fresh topic of
:data:`PARTITIONS` partitions is filled with ``--prefill`` records straight through the
Pulsar client (batched), then read by both sides, one after the other (the order
alternates between repetitions):

- **sidecar**: a clustering group of N members, each looping ``pull`` (``maxRecords:
  --pull-records``) and ``commit``; checked: no offset skipped or repeated, and the
  committed offsets are what was pulled;
- **direct**: N Pulsar consumers on the partitions the group gave each member, each
  ``batch_receive`` followed by a cumulative acknowledgement.

Each side reads for ``--seconds`` or until it has read everything, whichever comes
first, and its rate is over that time (the direct consumers usually drain the prefill
well within the window). The table, the plot and the JSON's ``summary`` show the best
repetition by records/s of each side on its own; the JSON keeps every repetition.

Then **end-to-end latency at half load**: records produced through ``POST
/v1/produce`` (batches of :data:`E2E_BATCH` records over the partitions, paced at half
the best sidecar records/s of the most members) while that many members long-poll
(``waitMs`` 1000) and commit; a record's value starts with the time it was sent, its
latency is when the pull that carried it was answered minus that. The direct baseline
at the same rate: a Pulsar producer per partition (batches of the same size) to the
same assignment of consumers, each message timed when ``receive`` returns it.

Results: ``<out>/groups.json`` and ``<out>/groups.png``; the cells are
:mod:`kop_dedup_tools.bench.groups_cells`, the end-to-end run
:mod:`kop_dedup_tools.bench.groups_e2e`.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench.cells import Cell, Compare, summarize
from kop_dedup_tools.bench.groups_cells import (
    PARTITIONS,
    OffsetCheck,
    direct_cell,
    fill,
    pulsar_client,
    sidecar_run,
)
from kop_dedup_tools.bench.groups_e2e import E2E_BATCH, WAIT_MS, end_to_end
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.support import BenchError, say, start_sidecar, step, turns
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = ["COMPARE", "PARTITIONS", "OffsetCheck", "run", "run_groups"]

COMPARE = Compare("sidecar")
TITLE = "kop-dedup consumer groups (HTTP) vs direct Pulsar consumers, same broker, same run"


def run_groups(args: argparse.Namespace, sc: SidecarProcess) -> list[Cell]:
    """Every (members, repetition, target) cell, then the end-to-end pair at half load."""
    per_partition = max(1, args.prefill // PARTITIONS)
    cells: list[Cell] = []
    client = pulsar_client(args.pulsar_service_url)
    try:
        for members in args.members:
            for rep in range(1, args.reps + 1):
                topic = f"bench-groups-{uuid.uuid4().hex[:8]}"
                with step(f"filling {topic} ({members} members, rep {rep})", sc):
                    create_topic(args.pulsar_admin_url, topic, partitions=PARTITIONS)
                    t0 = time.monotonic()
                    fill(client, topic, per_partition, args.value_size)
                say(
                    f"bench: groups: {topic} filled with {per_partition * PARTITIONS:,} "
                    f"records in {time.monotonic() - t0:.1f}s"
                )
                assignment: list[list[int]] = [
                    [p for p in range(PARTITIONS) if p % members == i] for i in range(members)
                ]
                for target in turns(("sidecar", "direct"), rep):
                    with step(f"groups {target} cell ({members} members, rep {rep})", sc):
                        if target == "sidecar":
                            cell, given = sidecar_run(
                                sc,
                                topic,
                                members,
                                args.pull_records,
                                args.seconds,
                                per_partition,
                                rep,
                            )
                            assignment = [given[m] for m in sorted(given)]
                        else:
                            cell = direct_cell(
                                client,
                                topic,
                                assignment,
                                args.pull_records,
                                args.seconds,
                                per_partition,
                                rep,
                            )
                    cells.append(cell)
                    say(cell.progress())
        with step("the end-to-end run at half load", sc):
            cells += end_to_end(args, sc, client, summarize(cells, COMPARE))
    finally:
        client.close()
    return cells


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --groups``: one sidecar for the run, stopped at the end."""
    if not all(1 <= m <= PARTITIONS for m in args.members):
        raise BenchError(f"--members must be between 1 and {PARTITIONS} (the topic's partitions)")
    sc = start_sidecar(args)
    try:
        cells = run_groups(args, sc)
    finally:
        sc.stop()
    setup = {
        "partitions": PARTITIONS,
        "prefill": args.prefill,
        "seconds": args.seconds,
        "value_bytes": args.value_size,
        "e2e": {"produce_batch": E2E_BATCH, "wait_ms": WAIT_MS},
    }
    print(Results("groups", TITLE, COMPARE, cells, setup, broker).write(out))
