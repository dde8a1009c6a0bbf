"""``kop-dedup bench --streams-restart``: its flag chooses its mode, its fill is sized
from the changelog asked for, and what the Streams application prints and writes
(restores, progress, checkpoint files) becomes the figures reported."""

from __future__ import annotations

import argparse

import pytest

from kop_dedup_tools.bench import command, streams_restart
from kop_dedup_tools.bench.streams_app import checkpoints, processed_of, restore_of


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    command.add_cli(p.add_subparsers())
    return p


def test_the_streams_restart_flag_chooses_its_mode_whatever_else_is_given():
    for flags in (["--streams-restart"], ["--streams-restart", "--against-kafka", "--groups"]):
        assert command.chosen(parser().parse_args(["bench", *flags])) is streams_restart.run


def test_the_streams_restart_options_default_to_the_issues_gibibyte_on_both_sides():
    args = parser().parse_args(["bench", "--streams-restart"])
    assert args.changelog_mib == 1024
    assert args.streams_value_bytes == 4096
    assert args.streams_sides == ["kafka", "listener"]
    assert args.commit_interval_ms == 100
    args = parser().parse_args(
        ["bench", "--streams-restart", "--changelog-mib", "16", "--streams-sides", "listener"]
    )
    assert (args.changelog_mib, args.streams_sides) == (16, ["listener"])
    with pytest.raises(SystemExit):
        parser().parse_args(["bench", "--streams-restart", "--streams-sides", "pulsar"])


def test_the_fill_writes_the_changelog_asked_for_over_a_quarter_as_many_keys():
    fill = streams_restart.plan(1024, 4096)
    assert fill.records == 262_144
    assert fill.keys == 65_536
    assert fill.changelog_mib == 1024
    assert fill.store_mib == 256
    odd = streams_restart.plan(1, 3000, keys=10, partitions=4)
    assert odd.records == 350  # rounded up: at least the MiB asked for
    assert odd.changelog_mib >= 1
    assert (odd.keys, odd.partitions, odd.store_mib) == (10, 4, 10 * 3000 / (1 << 20))
    assert streams_restart.plan(0.001, 4096).keys == 1
    for bad in ((0, 4096), (16, 0), (16, 4096, -1)):
        with pytest.raises(ValueError):
            streams_restart.plan(*bad)


def test_a_restore_is_read_from_the_listener_lines_of_the_run():
    lines = [
        "900 state REBALANCING -> REBALANCING",
        "1500 restore-start app-store-changelog 0 120 4500",
        "1510 restore-start app-store-changelog 1 0 4400",
        "2000 restoring 3000",
        "3500 restore-end app-store-changelog 1 4399 1990",
        "4000 restore-end app-store-changelog 0 4380 2500",
        "4100 state REBALANCING -> RUNNING",
    ]
    restore = restore_of(lines)
    assert restore.ranges == {0: (120, 4500), 1: (0, 4400)}
    assert restore.records == {0: 4380, 1: 4399}
    assert restore.total == 8779
    assert restore.seconds == 2.5
    nothing = restore_of(["100 state CREATED -> REBALANCING", "800 state REBALANCING -> RUNNING"])
    assert (nothing.total, nothing.seconds, nothing.ranges) == (0, 0.0, {})


def test_progress_is_the_last_count_said():
    assert processed_of([]) == 0
    assert processed_of(["10 processed 1000", "20 state A -> B", "30 processed 2000"]) == 2000


def test_checkpoints_are_read_for_the_changelog_only(tmp_path):
    for task, body in {
        "0_0": "0\n2\napp-store-changelog 0 4501\nother 0 9\n",
        "0_1": "0\n1\napp-store-changelog 1 4400\n",
        "1_0": "0\n0\n",
    }.items():
        (tmp_path / task).mkdir()
        (tmp_path / task / ".checkpoint").write_text(body)
    (tmp_path / "0_2").mkdir()  # a task with no checkpoint (killed: none written)
    assert checkpoints(tmp_path, "app-store-changelog") == {0: 4501, 1: 4400}


def test_the_table_has_a_row_per_side_and_restart():
    fill = streams_restart.plan(16, 4096)
    restart = {
        "how": "clean",
        "to_running_s": 3.2,
        "restore_s": 0.0,
        "restored": 0,
        "restored_mib": 0.0,
        "checkpoints": {0: 2100, 1: 2000},
        "ends": {0: 2101, 1: 2001},
        "load": 7.5,
    }
    killed = {**restart, "how": "killed", "restored": 4096, "restored_mib": 16.0}
    killed["ends"] = {0: 2048, 1: 2048}
    table = streams_restart.render(fill, {"kafka": {"fill_s": 30.0, "restarts": [restart, killed]}})
    lines = table.splitlines()
    assert "4,096 records of 4,096 B over 1,024 keys" in lines[1]
    clean_row, killed_row = lines[-2:]
    assert clean_row.split()[:4] == ["kafka", "30.0", "clean", "4,100/4,102"]
    assert "0.0%" in clean_row
    assert "100.0%" in killed_row
