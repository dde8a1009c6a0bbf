"""``kop-dedup bench --wide-produce``: its flag chooses its mode, its options keep their
defaults, and its records are spread evenly over producers and partitions."""

from __future__ import annotations

import argparse
from collections import Counter

from kop_dedup_tools.bench import command, wide


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    command.add_cli(p.add_subparsers())
    return p


def test_the_wide_flag_chooses_its_mode_whatever_else_is_given():
    for flags in (["--wide-produce"], ["--wide-produce", "--against-kafka"]):
        assert command.chosen(parser().parse_args(["bench", *flags])) is wide.run


def test_the_wide_options_default_to_the_issues_cell():
    args = parser().parse_args(["bench", "--wide-produce"])
    assert (args.wide_producers, args.wide_partitions, args.wide_records) == (20, 512, 200_000)
    assert args.max_open_producers is None


def test_every_producer_writes_every_partition_evenly():
    plan = wide._spread(20 * 512 * 3, 20, 512)
    assert [len(mine) for mine in plan] == [512 * 3] * 20
    names = Counter((producer, p) for producer, mine in enumerate(plan) for p in mine)
    assert len(names) == 20 * 512
    assert set(names.values()) == {3}
