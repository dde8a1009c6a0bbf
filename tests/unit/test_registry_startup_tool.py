"""The registry-startup tool's wiring and report (its measurement against the broker is
in tests/integration/test_registry.py)."""

from __future__ import annotations

import argparse

from kop_dedup.cli import build_parser
from kop_dedup_tools.registry_startup import Run, _report


def test_registry_startup_is_a_cli_command_with_the_issue_s_shape():
    args = build_parser().parse_args(["registry-startup", "--records", "100000", "--keys", "1000"])
    assert (args.command, args.records, args.keys, args.runs) == (
        "registry-startup",
        100_000,
        1000,
        3,
    )


def test_the_report_gives_each_run_and_the_range_before_and_after():
    args = argparse.Namespace(records=100_000, keys=1000)
    runs = [Run("before", 2.5, 100_000, 0, 1000), Run("before", 2.4, 100_000, 0, 1000)]
    runs += [Run("after", 0.05, 1000, 73, 1000), Run("after", 0.04, 1000, 73, 1000)]
    text = _report(args, "public/x", 6.0, 0.4, runs)
    assert "before compaction: 2.40-2.50 s" in text
    assert "after compaction: 0.04-0.05 s" in text
    assert len([line for line in text.splitlines() if line.startswith("after  ")]) == 2
