"""``kop-dedup bench --wide-produce``: its flag chooses its mode, its options keep their
defaults, and its records are spread evenly over producers and partitions."""

from __future__ import annotations

import argparse
from collections import Counter

from kop_dedup_tools.bench import command, support, wide


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


def test_a_benchs_sidecars_share_a_system_namespace_of_the_run_alone(monkeypatch):
    """Two benches on one broker formed one cluster with the default system namespace
    (each forwarded the other's partitions' batches to it)."""
    monkeypatch.delenv("KOP_DEDUP_SYSTEM_NAMESPACE", raising=False)
    ours = support.sidecar_settings(max_open_producers=5)
    assert ours == {"max_open_producers": 5, "system_namespace": support.RUN_SYSTEM_NAMESPACE}
    assert support.RUN_SYSTEM_NAMESPACE != "kop-dedup-system"
    assert support.sidecar_settings(system_namespace="x") == {"system_namespace": "x"}
    monkeypatch.setenv("KOP_DEDUP_SYSTEM_NAMESPACE", "mine")
    assert support.sidecar_settings() == {}
