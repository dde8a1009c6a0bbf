"""``kop-dedup edges``: look for the next edge with a seeded schedule of transactions of
every size, partitions added, topics deleted and nodes paused, checked after every step
(:mod:`.edges_plan`, :mod:`.edges_model`, :mod:`.edges_run`; docs/operations/soak.md).

In-process use (the CI test) is :func:`kop_dedup_tools.edges_run.run_edges`.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from pathlib import Path
from typing import Any

from kop_dedup_tools.edges_plan import Profile
from kop_dedup_tools.launcher import LocalPulsar

__all__ = ["add_cli"]


def _handler(args: argparse.Namespace) -> int:
    # confluent-kafka (the soak extra) is imported only when the command runs
    from kop_dedup_tools.edges_run import EdgesConfig, EdgesReport, run_edges  # noqa: PLC0415

    seed = args.seed if args.seed is not None else random.randrange(1 << 31)  # noqa: S311
    profile = Profile(
        nodes=args.nodes,
        max_txn_bytes=int(args.max_txn_mib * 2**20),
        pause_seconds=args.pause_seconds,
    )
    cfg = EdgesConfig(
        seed=seed,
        steps=args.steps,
        profile=profile,
        workdir=args.workdir,
        sidecar_settings=dict(s.split("=", 1) for s in args.sidecar_setting or []),
    )
    broker = None
    service, admin = args.pulsar_service_url, args.pulsar_admin_url
    if service is None or admin is None:
        broker = LocalPulsar.throwaway(Path(args.workdir or ".") / "edges-pulsar-logs")
        broker.start()
        service, admin = broker.service_url, broker.admin_url
    try:
        runs: list[EdgesReport] = []
        for i in range(args.runs):
            run_cfg = dataclasses.replace(cfg, seed=seed + i)
            report = run_edges(run_cfg, service, admin, say=lambda s: print(s, flush=True))
            print(report.text(), flush=True)
            runs.append(report)
            if not report.ok:
                break
    finally:
        if broker is not None:
            broker.wipe(timeout=30)
    return 0 if all(r.ok for r in runs) else 1


def add_cli(subparsers: Any) -> None:
    """Register ``kop-dedup edges``."""
    p = subparsers.add_parser(
        "edges",
        help="look for the next edge: a seeded schedule of transactions, partitions "
        "added, topics deleted and nodes paused, checked after every step",
        description="Start sidecars (and a local Pulsar broker unless --pulsar-service-url "
        "and --pulsar-admin-url are given) and run a seeded schedule through them with "
        "real Kafka clients (confluent-kafka): transactions from one record to "
        "--max-txn-mib, aborted ones, idempotent records, CreatePartitions, topics deleted "
        "and created again, nodes stopped with SIGSTOP past the broker's keep-alive. After "
        "every step a read_committed reader checks that nothing committed is lost or read "
        "twice, nothing aborted is read, and that it reaches the end within its bound. A "
        "failure prints the seed and the schedule to replay. Needs the soak extra "
        "(confluent-kafka). See docs/operations/soak.md.",
    )
    add = p.add_argument
    add("--seed", type=int, default=None, help="the schedule's seed (default: random, printed)")
    add("--steps", type=int, default=40, help="steps per run (default 40)")
    add("--runs", type=int, default=1, help="runs, seeds seed, seed+1, ... (default 1)")
    add("--nodes", type=int, default=2, help="sidecars (default 2; pauses need 2 or more)")
    add("--max-txn-mib", type=float, default=64.0, help="largest transaction (default 64 MiB)")
    add("--pause-seconds", type=float, default=12.0, help="how long a node is stopped")
    add("--workdir", type=Path, default=None, help="where the sidecars' logs go")
    add("--pulsar-service-url", default=None, help="an existing broker (default: start one)")
    add("--pulsar-admin-url", default=None, help="its admin URL")
    add(
        "--sidecar-setting",
        action="append",
        metavar="NAME=VALUE",
        help="a setting for every sidecar (repeatable), e.g. reorder_window_ms=1500",
    )
    p.set_defaults(func=_handler)
