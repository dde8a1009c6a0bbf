"""The ``kop-dedup`` command: serve, pulsar, audit, load, bench, registry-startup.

Each subcommand lives with the module that does the work and registers
itself through an ``add_cli(subparsers)`` function; this file only wires
them together, importing each lazily so ``kop-dedup serve`` never imports
Spark.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# subcommand modules: each has add_cli(subparsers) that sets func=handler(args) -> int
_COMMANDS = (
    "kop_dedup.transports.http.server",
    "kop_dedup_tools.launcher",
    "kop_dedup.spark.cli",
    "kop_dedup_tools.load",
    "kop_dedup_tools.bench",
    "kop_dedup_tools.registry_startup",
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
        print(f"kop-dedup {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
