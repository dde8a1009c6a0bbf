"""The ``kop-dedup`` command: serve, pulsar, kafka, audit, load, bench, soak, registry-startup.

Each subcommand lives with the module that does the work and registers
itself through an ``add_cli(subparsers)`` function; this file only wires
them together, importing each lazily so ``kop-dedup serve`` never imports
Spark.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = [
    "DEFAULT_ADMIN_URL",
    "DEFAULT_SERVICE_URL",
    "ENV_ADMIN_URL",
    "ENV_SERVICE_URL",
    "add_pulsar_url_options",
    "main",
]

ENV_SERVICE_URL = "KOP_DEDUP_PULSAR_SERVICE_URL"
ENV_ADMIN_URL = "KOP_DEDUP_PULSAR_ADMIN_URL"
DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"
"""The local broker's (``kop-dedup pulsar start``); the same as Settings' default."""
DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"

# subcommand modules: each has add_cli(subparsers) that sets func=handler(args) -> int
_COMMANDS = (
    "kop_dedup.transports.http.server",
    "kop_dedup_tools.launcher",
    "kop_dedup_tools.kafka_broker",
    "kop_dedup.spark.cli",
    "kop_dedup_tools.load",
    "kop_dedup_tools.bench",
    "kop_dedup_tools.soak",
    "kop_dedup_tools.edges",
    "kop_dedup_tools.registry_startup",
)


def add_pulsar_url_options(
    parser: argparse.ArgumentParser,
    *,
    env_defaults: bool = True,
    optional_admin: bool = False,
    service_help: str = "Pulsar service URL",
    admin_help: str = "Pulsar admin (HTTP) URL",
) -> None:
    """Add ``--service-url`` and ``--admin-url`` (also spelt ``--pulsar-service-url`` and
    ``--pulsar-admin-url``), read as ``args.pulsar_service_url`` and
    ``args.pulsar_admin_url``: the names of the settings they stand for.

    Defaults: ``$KOP_DEDUP_PULSAR_SERVICE_URL`` / ``$KOP_DEDUP_PULSAR_ADMIN_URL``, else
    the local broker's. ``env_defaults=False`` leaves both None, for a caller that builds
    :class:`~kop_dedup.settings.Settings` (which reads the environment and ``.env``
    itself); ``optional_admin=True`` leaves the admin URL None unless given, for a command
    that works without one.
    """
    service = os.environ.get(ENV_SERVICE_URL, DEFAULT_SERVICE_URL) if env_defaults else None
    admin = (
        os.environ.get(ENV_ADMIN_URL, DEFAULT_ADMIN_URL)
        if env_defaults and not optional_admin
        else None
    )
    origin = f" (default ${ENV_SERVICE_URL}, else {DEFAULT_SERVICE_URL})"
    parser.add_argument(
        "--service-url",
        "--pulsar-service-url",
        dest="pulsar_service_url",
        default=service,
        metavar="URL",
        help=service_help + origin,
    )
    origin = "" if optional_admin else f" (default ${ENV_ADMIN_URL}, else {DEFAULT_ADMIN_URL})"
    parser.add_argument(
        "--admin-url",
        "--pulsar-admin-url",
        dest="pulsar_admin_url",
        default=admin,
        metavar="URL",
        help=admin_help + origin,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kop-dedup",
        description="Kafka-style idempotent produce over HTTP on Apache Pulsar deduplication.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.startswith("kop_dedup"):
                continue  # that subcommand is not part of this build
            raise
        module.add_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the CLI's last word: say what failed, no traceback wall
        if getattr(args, "debug", False):
            raise
        # our own errors say what failed in their message; anything else also needs its
        # type (an httpx timeout's message is empty)
        detail = str(exc).strip() or "(no message)"
        if not type(exc).__module__.startswith("kop_dedup") or detail == "(no message)":
            detail = f"{type(exc).__name__}: {detail}"
        print(f"kop-dedup {args.command}: error: {detail}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
