"""The ``kop-dedup bench`` command: its options, the mode they choose, the broker of the
run, and ``--render`` (a results file's table and plot again, from the file alone).

The broker: the one at ``--service-url``/``--admin-url``; when none answers there and
both are on loopback, a local standalone broker (the launcher's
:class:`~kop_dedup_tools.launcher.LocalPulsar`) on free ports for this run, stopped and
wiped at the end. Logs stay in ``--out``: the sidecar's ``sidecar-<port>.log`` and a
started broker's ``pulsar-logs/``. Every failure says what failed (step, exception type
and message) with the sidecar's log tail.

A new mode: a module with a ``run(args, out, broker)`` that measures
:class:`~kop_dedup_tools.bench.cells.Cell` s and writes them as
:class:`~kop_dedup_tools.bench.results.Results`; its flag and options in
:func:`add_cli`, its choice in :func:`chosen`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kop_dedup.cli import add_pulsar_url_options
from kop_dedup_tools.bench.groups import run as run_groups
from kop_dedup_tools.bench.kafka import MEASURES
from kop_dedup_tools.bench.kafka import run as run_kafka
from kop_dedup_tools.bench.kafka_groups import run as run_kafka_groups
from kop_dedup_tools.bench.memory import run as run_memory
from kop_dedup_tools.bench.plot import plot
from kop_dedup_tools.bench.produce import run as run_produce
from kop_dedup_tools.bench.results import Results
from kop_dedup_tools.bench.streams_restart import add_cli as add_streams_restart_cli
from kop_dedup_tools.bench.streams_restart import run as run_streams_restart
from kop_dedup_tools.bench.support import BenchError, say
from kop_dedup_tools.bench.table import render
from kop_dedup_tools.bench.txn import run as run_txn
from kop_dedup_tools.bench.wide import add_cli as add_wide_cli
from kop_dedup_tools.bench.wide import run as run_wide
from kop_dedup_tools.launcher import LocalPulsar, broker_ready

__all__ = ["add_cli", "chosen", "may_start_broker"]

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

Run = Callable[[argparse.Namespace, Path, dict[str, Any]], None]


def may_start_broker(args: argparse.Namespace) -> bool:
    """Start a local broker when none answers? Only when allowed and both URLs point at
    this machine (a remote broker that does not answer is the user's to fix)."""
    hosts = {urlsplit(args.pulsar_service_url).hostname, urlsplit(args.pulsar_admin_url).hostname}
    return not args.no_start_broker and hosts <= _LOOPBACK


@contextlib.contextmanager
def _broker(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    """The broker for this run: the one that answers at the URLs, or a local one started
    (and stopped, its data wiped, its log kept under ``out``) for the run."""
    admin = args.pulsar_admin_url
    if broker_ready(admin):
        yield {"service_url": args.pulsar_service_url, "admin_url": admin, "started": False}
        return
    if not may_start_broker(args):
        raise BenchError(
            f"no Pulsar broker answers at {admin}. Start one with `kop-dedup pulsar start` "
            "(a local standalone broker with deduplication on) and pass its URLs with "
            "--service-url/--admin-url (or KOP_DEDUP_PULSAR_SERVICE_URL/"
            "KOP_DEDUP_PULSAR_ADMIN_URL). Without --no-start-broker, kop-dedup bench "
            "starts a local broker itself when both URLs are on loopback."
        )
    local = LocalPulsar.throwaway(out.resolve() / "pulsar-logs", prefix="kop-dedup-bench-")
    say(
        f"bench: no Pulsar broker answers at {admin}; starting a local one for this run "
        f"({local.service_url}, admin {local.admin_url}, log {local.log_file})"
    )
    try:
        seconds = local.start()  # a BrokerError names the log (kept) and shows its tail
        say(f"bench: local broker ready in {seconds:.0f}s")
        args.pulsar_service_url, args.pulsar_admin_url = local.service_url, local.admin_url
        yield {"service_url": local.service_url, "admin_url": local.admin_url, "started": True}
    finally:
        local.wipe()


def chosen(args: argparse.Namespace) -> Run:
    """The mode the flags choose (``--streams-restart`` first, then ``--wide-produce``;
    ``--against-kafka`` implies ``--kafka``; ``--groups`` with either is the Kafka groups
    mode)."""
    with_kafka = args.kafka or args.against_kafka
    if args.streams_restart:
        return run_streams_restart
    if args.wide_produce:
        return run_wide
    if args.groups:
        return run_kafka_groups if with_kafka else run_groups
    if args.memory:
        return run_memory
    if args.transactions:
        return run_txn
    return run_kafka if with_kafka else run_produce


def _render(path: Path) -> None:
    """``--render``: the table of a results file, its plot written again beside it."""
    results = Results.load(path)
    png = path.with_suffix(".png")
    plot(results.title, results.rows(), png)
    print(f"{render(results.title, results.rows(), results.notes)}\n\nwrote {png}")


def _handler(args: argparse.Namespace) -> int:
    if args.render is not None:
        _render(Path(args.render))
        return 0
    if args.quick:
        args.batch_sizes, args.producers, args.reps = [100], [1, 8], 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = chosen(args)
    with _broker(args, out) as broker:
        run(args, out, broker)
    return 0


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark the sidecar against a direct producer (starts a broker if needed)",
        description="Benchmark the sidecar (a kop-dedup serve subprocess) against a direct "
        "Pulsar producer on the same broker in one run. The table, plot and JSON summary "
        "show the best repetition by records/s of each mode; the JSON keeps every one. "
        "Needs a Pulsar broker at --service-url/--admin-url: when none answers there and "
        "both are on loopback, it starts a local standalone broker on free ports for the "
        "run (the `kop-dedup pulsar` launcher; Apache Pulsar from the Maven cache) and "
        "stops it at the end (--no-start-broker: fail instead). Logs (sidecar, started "
        "broker) stay in --out.",
    )
    add_pulsar_url_options(p)
    p.add_argument(
        "--no-start-broker",
        action="store_true",
        help="fail at once when no broker answers instead of starting a local one",
    )
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--producers", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--reps", type=int, default=2, help="repetitions per cell and mode")
    p.add_argument("--seconds", type=float, default=4.0, help="per cell and mode")
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="batch 100, producers 1 and 8, one rep")
    p.add_argument(
        "--sidecars",
        type=int,
        default=1,
        help="sidecar processes (each its own port; producer i uses process i %% N, so "
        "every producer id has one owner); CPU and RSS columns are their sum",
    )
    p.add_argument("--memory", action="store_true", help="idle-state memory and cost per batch")
    p.add_argument(
        "--transactions",
        action="store_true",
        help="transactions of 10 batches x 100 records over 2 partitions against the same "
        "records produced idempotently, per --producers count (transactions.json)",
    )
    p.add_argument("--idle-states", type=int, default=10_000)  # --memory's
    p.add_argument("--out", default="bench-results", help="results and logs (kept)")
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
        "--fetch-partitions",
        type=int,
        nargs="+",
        default=[1],
        help="--kafka's fetch: partitions of the topic read (e.g. 1 512), a cell per count",
    )
    p.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=[1],
        help="--kafka: with more than one size (e.g. 1 2), produce and transactions also "
        "through a cluster of each size on this host, one partition per node (what a "
        "second node adds)",
    )
    p.add_argument(
        "--kafka-measures",
        nargs="+",
        choices=MEASURES,
        default=list(MEASURES),
        help="--kafka's measures to run (default all)",
    )
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
    p.add_argument(
        "--render",
        metavar="JSON",
        help="print the table of a results file (<out>/<mode>.json) and write its plot again "
        "beside it; nothing is measured",
    )
    add_wide_cli(p)
    add_streams_restart_cli(p)
    p.set_defaults(func=_handler)
