"""``kop-dedup load``: play retrying idempotent Kafka producers against the sidecar.

The driver (:mod:`kop_dedup_tools.load_driver`) plays producers that retry every batch
with the same producer id, epoch and sequences until a definite answer, the way a Kafka
client with ``enable.idempotence`` does; :mod:`kop_dedup_tools.load_verify` reads the
topics back and counts what was lost, duplicated, out of order or corrupted;
:mod:`kop_dedup_tools.load_background` runs a load in a thread for the fault tests. This
module is the command, and the names callers import:

In-process use (tests, notebooks)::

    report = asyncio.run(run_load(LoadConfig(urls=("http://127.0.0.1:8090",), topics=("t",))))
    print(verify("pulsar://127.0.0.1:6650", ["t"], report).to_dict())

    with BackgroundLoad(config) as load:       # in a thread with its own loop
        load.wait_for(lambda r: r.answered >= 20, timeout=60)
        ...                                    # inject a fault
        load.stop()                            # no new batches; in-flight ones finish
    report = load.report
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from kop_dedup.cli import add_pulsar_url_options
from kop_dedup_tools.load_background import BackgroundLoad
from kop_dedup_tools.load_driver import run_load
from kop_dedup_tools.load_types import RETRIABLE_CODES, LoadConfig, LoadError, LoadReport, Slot
from kop_dedup_tools.load_verify import VerifyReport, verify
from kop_dedup_tools.topics import create_topic

__all__ = [
    "RETRIABLE_CODES",
    "BackgroundLoad",
    "LoadConfig",
    "LoadError",
    "LoadReport",
    "Slot",
    "VerifyReport",
    "add_cli",
    "run_load",
    "verify",
]


def _handler(args: argparse.Namespace) -> int:
    topics = tuple(args.topic)
    if args.pulsar_admin_url:
        for topic in topics:
            create_topic(
                args.pulsar_admin_url, topic, partitions=args.partitions, namespace=args.namespace
            )
    cfg = LoadConfig(
        urls=tuple(args.url or ["http://127.0.0.1:8090"]),
        topics=topics,
        partitions=args.partitions,
        producers=args.producers,
        producer_ids=tuple(args.producer_id or ()),
        epoch=args.epoch,
        first_sequence=args.first_sequence,
        batches=args.batches,
        records=args.records,
        in_flight=args.in_flight,
        value_size=args.value_size,
        request_timeout_ms=args.request_timeout_ms,
        delivery_timeout_s=args.delivery_timeout,
        duration_s=args.duration,
        connections=args.connections,
        token=os.environ.get("KOP_DEDUP_TOKEN"),
        progress_every_s=args.progress_every,
    )
    report = asyncio.run(run_load(cfg))
    out: dict[str, Any] = {"load": report.to_dict()}
    ok = report.ok
    if args.verify:
        tenant, namespace = args.namespace.split("/", 1)
        v = verify(args.pulsar_service_url, topics, report, tenant=tenant, namespace=namespace)
        out["verify"] = v.to_dict()
        ok = ok and v.ok
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for section, values in out.items():
            print(f"{section}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    return 0 if ok else 1


def add_cli(subparsers: Any) -> None:
    """Register ``kop-dedup load``."""
    p = subparsers.add_parser(
        "load",
        help="play retrying idempotent Kafka producers against the sidecar",
        description="Play idempotent Kafka producers that retry every batch with the same "
        "producer id, epoch and sequences until a definite answer (up to --in-flight "
        "batches per partition, failing over between --url's), then optionally read the "
        "topics back (--verify). Exit status 1 when a batch failed or verification did.",
    )
    add = p.add_argument
    add("--url", action="append", help="sidecar URL; repeat for fail-over (default :8090)")
    add("--topic", action="append", required=True, help="Kafka topic; repeat for several")
    add("--partitions", type=int, default=1, help="partitions written per topic")
    add("--producers", type=int, default=4, help="producer ids to ask for")
    add("--producer-id", type=int, action="append", help="use this producer id (repeat)")
    add("--epoch", type=int, default=0)
    add("--first-sequence", type=int, default=0, help="sequence of each partition's first record")
    add("--batches", type=int, default=50, help="per producer and partition")
    add("--records", type=int, default=10, help="per batch")
    add("--in-flight", type=int, default=5, help="batches in flight per producer and partition")
    add("--value-size", type=int, default=32, help="bytes per record value")
    add("--request-timeout-ms", type=int, default=10_000, help="timeoutMs of each request")
    add("--delivery-timeout", type=float, default=120.0, help="seconds per batch, then fatal")
    add("--duration", type=float, default=None, help="start no batch after N seconds")
    add("--connections", type=int, default=64, help="HTTP connections (keep-alive)")
    add("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    add("--verify", action="store_true", help="read the topics back and compare")
    add_pulsar_url_options(
        p,
        optional_admin=True,
        service_help="Pulsar service URL for --verify",
        admin_help="create the topics with --partitions first through this admin URL (else "
        "the sidecar auto-creates them with its default partition count)",
    )
    add("--namespace", default="public/kafka", help="tenant/namespace of the topics")
    add("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_handler)
