"""``kop-dedup bench --groups``: consumer-group pulls through the sidecar against direct
Pulsar consumers on the same topic, in one run.

Per members count (``--members``, default 1 and 8) and repetition, a fresh topic of
:data:`PARTITIONS` partitions is filled with ``--prefill`` records straight through the
Pulsar client (batched), then read by both sides, one after the other (the order
alternates between repetitions; the cells: :mod:`kop_dedup_tools.bench_groups_cells`):

- **sidecar**: a clustering group of N members, each looping ``pull`` (``maxRecords:
  --pull-records``) and ``commit``; checked: no offset skipped or repeated, and the
  committed offsets are what was pulled;
- **direct**: N Pulsar consumers on the partitions the group gave each member, each
  ``batch_receive`` followed by a cumulative acknowledgement.

Each side reads for ``--seconds`` or until it has read everything, whichever comes
first, and its rate is over that time (the direct consumers usually drain the prefill
well within the window). The table, the plot and the JSON's ``summary`` show the best
repetition by records/s of each side on its own (:func:`summarize_groups`, the rule of
:mod:`kop_dedup_tools.bench_report`); the JSON keeps every repetition.

Then **end-to-end latency at half load**: records produced through ``POST
/v1/produce`` (batches of :data:`E2E_BATCH` records over the partitions, paced at half
the best sidecar records/s of the most members) while that many members long-poll
(``waitMs`` 1000) and commit; a record's value starts with the time it was sent, its
latency is when the pull that carried it was answered minus that. The direct baseline
at the same rate: a Pulsar producer per partition (batches of the same size) to the
same assignment of consumers, each message timed when ``receive`` returns it.

Results: ``<out>/groups.json`` and ``<out>/groups.png``
(:mod:`kop_dedup_tools.bench_groups_results`); the end-to-end run is
:mod:`kop_dedup_tools.bench_groups_e2e`.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench_groups_cells import (
    PARTITIONS,
    OffsetCheck,
    direct_cell,
    fill,
    pulsar_client,
    sidecar_run,
)
from kop_dedup_tools.bench_groups_e2e import end_to_end
from kop_dedup_tools.bench_groups_results import GroupCell, summarize_groups, write_group_results
from kop_dedup_tools.bench_support import BenchError, BenchMode, say, start_sidecar, step
from kop_dedup_tools.sidecar import SidecarProcess
from kop_dedup_tools.topics import create_topic

__all__ = ["MODE", "PARTITIONS", "OffsetCheck", "add_options", "run", "run_groups"]


def run_groups(
    args: argparse.Namespace, sc: SidecarProcess
) -> tuple[list[GroupCell], dict[str, Any]]:
    """Every (members, repetition, side) cell, then the end-to-end run at half load."""
    per_partition = max(1, args.prefill // PARTITIONS)
    cells: list[GroupCell] = []
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
                order = ("sidecar", "direct") if rep % 2 else ("direct", "sidecar")
                assignment: list[list[int]] = [
                    [p for p in range(PARTITIONS) if p % members == i] for i in range(members)
                ]
                for mode in order:
                    what = f"groups {mode} cell ({members} members, rep {rep})"
                    with step(what, sc):
                        if mode == "sidecar":
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
                    say(_progress(cell))
        with step("the end-to-end run at half load", sc):
            e2e = end_to_end(args, sc, client, summarize_groups(cells))
    finally:
        client.close()
    return cells, e2e


def _progress(cell: GroupCell) -> str:
    extra = (
        f", commit p99 {cell.commit_p99_ms:.1f} ms, cpu {cell.cpu_pct:.0f}%, "
        f"gaps {cell.gaps}, committed as pulled: {cell.committed_ok}"
        if cell.mode == "sidecar"
        else ""
    )
    return (
        f"bench: groups {cell.members:>2} members rep {cell.rep} {cell.mode:>7}: "
        f"{cell.records_per_s:>9,.0f} rec/s over {cell.seconds:.2f}s"
        f"{' (drained)' if cell.drained else ''}, cycle p99 {cell.cycle_p99_ms:.1f} ms{extra}"
    )


# -- results and the command --------------------------------------------------------------


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """``kop-dedup bench --groups``: one sidecar for the run, stopped at the end."""
    if not all(1 <= m <= PARTITIONS for m in args.members):
        raise BenchError(f"--members must be between 1 and {PARTITIONS} (the topic's partitions)")
    sc = start_sidecar(args)
    try:
        cells, e2e = run_groups(args, sc)
    finally:
        sc.stop()
    print(write_group_results(out, cells, e2e, broker, partitions=PARTITIONS))


def add_options(p: argparse.ArgumentParser) -> None:
    """The ``--groups`` options of ``kop-dedup bench``."""
    p.add_argument(
        "--groups",
        action="store_true",
        help="consumer-group pulls (a commit after each) against direct Pulsar consumers, "
        "and produce -> pull latency at half load (groups.json, groups.png)",
    )
    p.add_argument("--members", type=int, nargs="+", default=[1, 8], help="with --groups")
    p.add_argument("--pull-records", type=int, default=100, help="with --groups: maxRecords")
    p.add_argument(
        "--prefill",
        type=int,
        default=200_000,
        help="with --groups: records written per members count and repetition (with "
        "--kafka --groups: once per broker)",
    )


MODE = BenchMode(("groups",), add_options, run)
