"""``kop-dedup bench``: the sidecar measured against the Pulsar client used directly (and,
with ``--against-kafka``, a real Kafka), on the same machine in the same run.

Every mode measures **cells** (a workload against a target: records/s, latency p50 and
p99, the sidecar's CPU per record, memory where measured) and writes them the one way:
a results file, a markdown table and a plot (:mod:`.cells`, :mod:`.results`,
:mod:`.table`, :mod:`.plot`). The modes: :mod:`.produce` (the default: batch sizes x
producers, HTTP), :mod:`.memory`, :mod:`.txn` (``--transactions``), :mod:`.groups`,
:mod:`.kafka` and :mod:`.kafka_groups`; what they share: :mod:`.support`,
:mod:`.keepalive` (the HTTP client), :mod:`.kafka_clients`. The command, its options
and the broker of the run: :mod:`.command`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_cli"]


def add_cli(subparsers: Any) -> None:
    """The ``bench`` subcommand (its modes load only when the command is built)."""
    from kop_dedup_tools.bench.command import add_cli as add  # noqa: PLC0415

    add(subparsers)
