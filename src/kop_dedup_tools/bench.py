"""``kop-dedup bench``: the sidecar against a direct Pulsar producer, in one run.

**direct** publishes with the same producer configuration, names, sequence
ids and properties as the sidecar (it drives ``publisher.PulsarProducer``
itself); **sidecar** sends the same records through ``POST /v1/produce`` to a
``kop-dedup serve`` subprocess over keep-alive connections. Both keep up to 5
batches in flight per producer. Each cell (batch size x producers) runs for a
fixed time per mode, ``--reps`` times; the table, the plot and the JSON's
``summary`` all show the best repetition by records/s of each mode
(:mod:`kop_dedup_tools.bench_results`), and the JSON keeps every repetition.
Results go to ``<out>/bench.json`` and ``<out>/bench.png``.

The broker: the one at ``--service-url``/``--admin-url``; when none answers there
and both are on loopback, a local standalone broker (the launcher's
:class:`~kop_dedup_tools.launcher.LocalPulsar`) on free ports for this run, stopped
and wiped at the end. Logs stay in ``<out>``: the sidecar's ``sidecar-<port>.log``
and a started broker's ``pulsar-logs/``. Every failure says what failed (step,
exception type and message) with the sidecar's log tail.

``--memory`` measures the sidecar's RSS with 10,000 idle producer states and
its CPU cost per batch as producers grow from 1 to 64 (:mod:`kop_dedup_tools.bench_memory`).
``--transactions`` compares transactions with the same records produced idempotently
(:mod:`kop_dedup_tools.bench_txn`); ``--groups`` compares consumer-group pulls with
direct Pulsar consumers (:mod:`kop_dedup_tools.bench_groups`); ``--kafka`` compares Kafka
clients through the sidecar's Kafka listener with direct Pulsar clients, and
``--against-kafka`` with a real Apache Kafka too (:mod:`kop_dedup_tools.bench_kafka`);
``--kafka --groups`` compares groups of Kafka consumers through the listener with direct
Pulsar consumers and runs the consume-transform-produce loop
(:mod:`kop_dedup_tools.bench_kafka_groups`).

This module is the command: its options, the mode the options choose, the broker of the
run, and the default mode's (the matrix's: :mod:`kop_dedup_tools.bench_matrix`) results.
What the modes share: :mod:`kop_dedup_tools.bench_support` (failures, sidecars,
progress, :class:`~kop_dedup_tools.bench_support.BenchMode`),
:mod:`kop_dedup_tools.bench_produce` (producing for a timed window, direct and through
the sidecar), :mod:`kop_dedup_tools.bench_http` (the HTTP client) and
:mod:`kop_dedup_tools.bench_report` (aggregation, rows, plot, results file).

A new mode: a module with its cells and run and a
:class:`~kop_dedup_tools.bench_support.BenchMode` (the flags that choose it, its
options, its run); registered by adding it to :data:`_MODES` and its options to
:func:`add_cli`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kop_dedup.cli import add_pulsar_url_options
from kop_dedup_tools import (
    bench_groups,
    bench_kafka,
    bench_kafka_groups,
    bench_memory,
    bench_txn,
)
from kop_dedup_tools.bench_http import KeepAlive
from kop_dedup_tools.bench_matrix import run_matrix
from kop_dedup_tools.bench_memory import run_memory
from kop_dedup_tools.bench_produce import drive
from kop_dedup_tools.bench_report import AGGREGATION, write_json
from kop_dedup_tools.bench_results import Cell, plot, render_table, summarize, summary_json
from kop_dedup_tools.bench_support import (
    BenchError,
    BenchMode,
    Sidecars,
    describe_failure,
    running_sidecars,
    say,
    step,
)
from kop_dedup_tools.launcher import LocalPulsar, broker_ready

__all__ = [
    "BenchError",
    "KeepAlive",
    "Sidecars",
    "add_cli",
    "describe_failure",
    "may_start_broker",
    "run_matrix",
    "run_memory",
    "write_results",
]

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

# the names these helpers had when they were defined here
_drive = drive
_step = step


# -- the broker --------------------------------------------------------------------


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


# -- the matrix (the default mode) -------------------------------------------------


def write_results(
    out: Path,
    cells: list[Cell],
    half: dict[str, Any],
    broker: dict[str, Any],
    *,
    sidecars: int = 1,
) -> str:
    """bench.json and bench.png from one aggregation of ``cells``; the report to print."""
    rows = summarize(cells)
    write_json(
        out / "bench.json",
        broker,
        sidecars=sidecars,
        aggregation=AGGREGATION,
        summary=summary_json(rows),
        cells=[c.to_dict() for c in cells],
        half_load=half,
    )
    plot(rows, out / "bench.png")
    report = [render_table(rows)]
    if sidecars > 1:
        report.append(
            f"{sidecars} sidecar processes, producer i on process i % {sidecars}; "
            "cpu% and rss MB are their sum"
        )
    if half:
        report.append(
            f"\nat half of the sidecar's peak ({half['rate']:,.0f} rec/s, batch "
            f"{half['batch_size']}, {half['producers']} producers): added p99 "
            f"{half['added_p99_ms']:.2f} ms, added p50 {half['added_p50_ms']:.2f} ms"
        )
    report.append(f"\nwrote {out / 'bench.json'} and {out / 'bench.png'}")
    return "\n".join(report)


def _matrix(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    with running_sidecars(args) as sc:
        cells, half = run_matrix(args, sc)
    print(write_results(out, cells, half, broker, sidecars=args.sidecars))


# -- the command -------------------------------------------------------------------

_MODES: tuple[BenchMode, ...] = (
    bench_kafka_groups.MODE,
    bench_kafka_groups.MODE_AGAINST_KAFKA,
    bench_groups.MODE,
    bench_memory.MODE,
    bench_txn.MODE,
    bench_kafka.MODE,
    bench_kafka.MODE_AGAINST_KAFKA,
)
"""The modes besides the matrix, the first chosen running when several are asked for
(so a mode chosen by more flags, ``--kafka --groups``, goes before one chosen by fewer)."""


def _handler(args: argparse.Namespace) -> int:
    if args.quick:
        args.batch_sizes, args.producers, args.reps = [100], [1, 8], 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = next((mode.run for mode in _MODES if mode.chosen(args)), _matrix)
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
    # each mode's options, in the order the help has always listed them
    bench_memory.MODE.add_options(p)  # --memory
    bench_txn.MODE.add_options(p)  # --transactions
    p.add_argument("--idle-states", type=int, default=10_000)  # --memory's
    p.add_argument("--out", default="bench-results", help="results and logs (kept)")
    bench_groups.MODE.add_options(p)  # --groups, --members, --pull-records, --prefill
    bench_kafka.MODE.add_options(p)  # --kafka, --against-kafka and theirs
    bench_kafka_groups.MODE.add_options(p)  # --kafka --groups: --copiers, --ctp-records
    p.set_defaults(func=_handler)
