"""``kop-dedup audit`` and ``kop-dedup spark-jars``; pyspark is imported only when they run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kop_dedup.cli import add_pulsar_url_options

__all__ = ["add_cli"]


def _audit(args: argparse.Namespace) -> int:
    from kop_dedup.spark.audit import audit  # noqa: PLC0415
    from kop_dedup.spark.groups import GroupReportError  # noqa: PLC0415
    from kop_dedup.spark.jars import spark_session  # noqa: PLC0415

    if args.stream and args.group:
        print("audit: --group reports a batch audit; it does not go with --stream", file=sys.stderr)
        return 2
    spark = spark_session(master=args.master)
    try:
        if args.stream:
            from kop_dedup.spark.stream import run_stream  # noqa: PLC0415

            reports = run_stream(
                spark,
                args.topics,
                service_url=args.pulsar_service_url,
                admin_url=args.pulsar_admin_url,
                tenant=args.tenant,
                namespace=args.namespace,
                system_namespace=args.system_namespace,
                checkpoint=args.checkpoint,
                trigger_seconds=args.trigger_seconds,
                max_batches=args.max_batches,
            )
            if not reports:
                print("audit stream: no data read")
                return 0
            report = reports[-1]
        else:
            report = audit(
                spark,
                args.topics,
                service_url=args.pulsar_service_url,
                admin_url=args.pulsar_admin_url,
                tenant=args.tenant,
                namespace=args.namespace,
                system_namespace=args.system_namespace,
                parquet_path=args.parquet,
                progress=not args.quiet,
                groups=args.group or (),
                group_url=args.url,
                group_token=args.token,
            )
    except GroupReportError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else report.render())
    return 0 if report.ok else 1


def _jars(_args: argparse.Namespace) -> int:
    from kop_dedup.resources import fetched  # noqa: PLC0415
    from kop_dedup.spark.jars import ARTIFACTS, connector_jars, jars_dir  # noqa: PLC0415

    print(fetched(ARTIFACTS, connector_jars(), jars_dir()))
    return 0


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="prove with Spark that topics hold no duplicates, no gaps, whole transactions",
        description="Read Kafka topics written by the sidecar (all partitions, earliest to "
        "latest) through the Pulsar Spark connector; report records, duplicates and sequence "
        "gaps, and check transactions against the coordinator's decisions: committed ones "
        "wholly present, aborted ones invisible, none visible without a decision. Exit "
        "status 1 when any violation is found.",
    )
    p.add_argument("topics", nargs="+", help="Kafka topic names (or full Pulsar topic names)")
    add_pulsar_url_options(p)
    p.add_argument("--tenant", default=os.environ.get("KOP_DEDUP_TENANT", "public"))
    p.add_argument("--namespace", default=os.environ.get("KOP_DEDUP_NAMESPACE", "kafka"))
    p.add_argument(
        "--system-namespace",
        default=os.environ.get("KOP_DEDUP_SYSTEM_NAMESPACE", "kop-dedup-system"),
        help="the sidecar's system namespace, where the transaction decisions are "
        "(default $KOP_DEDUP_SYSTEM_NAMESPACE or kop-dedup-system)",
    )
    p.add_argument(
        "--group",
        action="append",
        metavar="GROUP",
        help="also report this consumer group's offsets on the topics: per partition the "
        "records read before its committed offset, inflight, ready and its lag (repeat for "
        "several groups; asked of the sidecar at --url)",
    )
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8090",
        help="with --group: a sidecar to read the groups' offsets from (any sidecar sharing "
        "the broker; default http://127.0.0.1:8090)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("KOP_DEDUP_TOKEN"),
        help="with --group: the sidecar's bearer token (default $KOP_DEDUP_TOKEN)",
    )
    p.add_argument("--parquet", help="also write the records to this Parquet path")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--master", help="Spark master (default $KOP_DEDUP_SPARK_MASTER or local[*])")
    p.add_argument("--stream", action="store_true", help="keep auditing new data (readStream)")
    p.add_argument("--checkpoint", default="audit-checkpoint", help="with --stream")
    p.add_argument("--trigger-seconds", type=float, default=10.0, help="with --stream")
    p.add_argument("--max-batches", type=int, default=None, help="with --stream: stop after N")
    p.set_defaults(func=_audit)

    j = subparsers.add_parser(
        "spark-jars", help="resolve the Spark jars (Pulsar connector, Spark's Kafka source)"
    )
    j.set_defaults(func=_jars)
