"""``kop-dedup soak``: exactly-once copying through a seeded schedule of faults, judged.

The command's options; the run is :mod:`kop_dedup_tools.soak_run`, and what it does is
described there and in ``docs/operations/soak.md``. In-process use (the CI test)::

    from kop_dedup_tools.soak import SoakConfig, run_soak
    report = run_soak(SoakConfig(faults=5, records=2000), broker=local_pulsar)
    assert report.ok, report.text()
"""

from __future__ import annotations

import argparse
import functools
import logging
from pathlib import Path
from typing import Any

from kop_dedup_tools.launcher import LocalPulsar
from kop_dedup_tools.soak_check import CHECKS
from kop_dedup_tools.soak_faults import FAULT_KINDS
from kop_dedup_tools.soak_report import SoakReport
from kop_dedup_tools.soak_run import SoakConfig, run_soak

__all__ = ["SoakConfig", "SoakReport", "add_cli", "run_soak"]


# -- CLI ---------------------------------------------------------------------------------


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def _handler(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cfg = SoakConfig(
        seed=args.seed,
        faults=args.faults,
        kinds=args.kinds.split(",") if args.kinds else None,
        gap_s=_pair(args.gap),
        records=args.records,
        wave_records=args.wave_records,
        partitions=args.partitions,
        java_copiers=args.java_copiers,
        rdkafka_copiers=args.rdkafka_copiers,
        transaction_size=args.transaction_size,
        batch_records=args.batch_records,
        abort_rate=args.abort_rate,
        checks=args.checks.split(","),
        drain_s=args.drain,
        progress_s=args.progress_every,
        workdir=args.workdir,
        sidecar_settings=dict(s.split("=", 1) for s in args.sidecar_setting or []),
        keep_broker=args.keep_broker,
    )
    broker = None
    if args.broker_port is not None:
        broker = LocalPulsar(
            broker_port=args.broker_port, web_port=args.web_port, data_dir=args.data_dir
        )
        if not broker.is_ready():
            broker.start()
    report = run_soak(cfg, broker=broker, say=functools.partial(print, flush=True))
    print(report.text(), flush=True)
    path = Path(report.workdir) / "soak-report.json"
    report.write(path)
    if args.json is not None:
        report.write(args.json)
    print(f"report: {args.json or path}")
    return 0 if report.ok else 1


def add_cli(subparsers: Any) -> None:
    """Register ``kop-dedup soak``."""
    p = subparsers.add_parser(
        "soak",
        help="copy exactly once through a seeded schedule of faults, and judge the output",
        description="Start a Pulsar broker and two sidecars, seed an input topic, copy it "
        "with Kafka's TransactionalMessageCopier and a librdkafka copier (read_committed "
        "consumers in groups, transactions with sendOffsetsToTransaction) while a seeded "
        "schedule kills and pauses sidecars and the broker; then check the outputs: no "
        "record duplicated, lost, out of order or aborted, no read_committed end inside a "
        "transaction. Exit status 1 on any violation. See docs/operations/soak.md.",
    )
    add = p.add_argument
    add("--seed", type=int, default=None, help="the schedule's seed (default: random, printed)")
    add("--faults", type=int, default=10, help="faults to apply (default 10)")
    add(
        "--kinds",
        default=None,
        help=f"fault kinds, comma-separated (default all: {','.join(FAULT_KINDS)})",
    )
    add("--gap", default="3,8", help="seconds between faults, drawn in LOW,HIGH (default 3,8)")
    add("--records", type=int, default=4000, help="input records seeded first (default 4000)")
    add(
        "--wave-records",
        type=int,
        default=2000,
        help="input records added whenever the copiers near the end while faults remain",
    )
    add("--partitions", type=int, default=4, help="partitions of the input and outputs")
    add("--java-copiers", type=int, default=2, help="TransactionalMessageCopier processes")
    add("--rdkafka-copiers", type=int, default=2, help="librdkafka copier processes")
    add("--transaction-size", type=int, default=50, help="records per copier transaction")
    add("--batch-records", type=int, default=10, help="librdkafka copier batch.num.messages")
    add("--abort-rate", type=float, default=0.1, help="librdkafka copier aborts on purpose")
    add(
        "--checks",
        default=",".join(CHECKS),
        help=f"checks to run, comma-separated (default all: {','.join(CHECKS)})",
    )
    add(
        "--drain",
        type=float,
        default=300.0,
        help="seconds the copiers may take after the last fault",
    )
    add("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    add("--workdir", type=Path, default=None, help="logs and the report (default: a new temp dir)")
    add(
        "--sidecar-setting",
        action="append",
        metavar="NAME=VALUE",
        help="a sidecar setting (KOP_DEDUP_<NAME>), e.g. coordinator_adopt_interval_ms=500",
    )
    add("--broker-port", type=int, default=None, help="use the launcher's broker on this port")
    add("--web-port", type=int, default=8080, help="its web port (with --broker-port)")
    add("--data-dir", type=Path, default=None, help="its data dir (with --broker-port)")
    add("--keep-broker", action="store_true", help="leave the run's own broker and data")
    add("--json", type=Path, default=None, help="also write the report here")
    p.set_defaults(func=_handler)
