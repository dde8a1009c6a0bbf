"""kop-dedup bench without a broker: the flags choose the modes they always chose, a
results file renders again, failures say what failed, a broker is started or clearly
asked for."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kop_dedup import cli
from kop_dedup_tools.bench import command, groups, kafka, kafka_groups, memory, produce, txn
from kop_dedup_tools.bench.support import BenchError, Sidecars, describe_failure, step
from kop_dedup_tools.launcher import BrokerError, free_port
from kop_dedup_tools.sidecar import SidecarProcess

DOCS_BENCH = Path(__file__).parents[2] / "docs" / "bench"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    command.add_cli(p.add_subparsers())
    return p


@pytest.mark.parametrize(
    ("flags", "run"),
    [
        ((), produce.run),
        (("--quick",), produce.run),
        (("--memory",), memory.run),
        (("--transactions",), txn.run),
        (("--groups",), groups.run),
        (("--kafka",), kafka.run),
        (("--against-kafka",), kafka.run),
        (("--kafka", "--groups"), kafka_groups.run),
        (("--against-kafka", "--groups"), kafka_groups.run),
        (("--groups", "--memory"), groups.run),  # the order the modes were always chosen in
    ],
)
def test_the_flags_choose_the_mode_they_always_chose(flags, run):
    assert command.chosen(parser().parse_args(["bench", *flags])) is run


def test_every_option_keeps_its_default():
    args = parser().parse_args(["bench"])
    assert (args.batch_sizes, args.producers, args.reps, args.seconds) == (
        [1, 10, 100, 1000],
        [1, 8, 64],
        2,
        4.0,
    )
    assert (args.members, args.pull_records, args.prefill) == ([1, 8], 100, 200_000)
    assert (args.kafka_producers, args.txn_records, args.fetch_records) == (
        [1, 8],
        [100, 1000],
        100_000,
    )
    assert (args.copiers, args.ctp_records, args.idle_states, args.sidecars) == (
        [1],
        100,
        10_000,
        1,
    )
    assert args.kafka_measures == ["produce", "fetch", "txn"]


def test_render_prints_a_results_files_table_and_writes_its_plot_again(tmp_path, capsys):
    results_file = tmp_path / "kafka.json"
    shutil.copy(DOCS_BENCH / "kafka" / "kafka.json", results_file)
    assert cli.main(["bench", "--render", str(results_file)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Kafka clients through the kop-dedup listener")
    assert "| fetch, 1 consumer |" in printed
    assert (tmp_path / "kafka.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failure_without_a_message_still_says_what_failed_and_shows_the_sidecar_log(
    tmp_path,
):
    sc = SidecarProcess("pulsar://127.0.0.1:1", "http://127.0.0.1:1", log_dir=tmp_path)
    sc.log_path.write_text("line 1\nERROR producer creation timed out\n")
    with pytest.raises(BenchError) as err, step("creating 10 producer states", sc):
        raise TimeoutError
    message = str(err.value)
    assert message.startswith("creating 10 producer states failed: TimeoutError: (no message)")
    assert f"log {sc.log_path}" in message
    assert "ERROR producer creation timed out" in message
    assert sc.log_path.exists()  # the log a message names stays


def test_the_cli_names_the_type_of_an_error_without_a_message(monkeypatch, capsys):
    def boom(args):
        raise TimeoutError

    monkeypatch.setattr(command, "_handler", boom)
    assert cli.main(["bench", "--no-start-broker"]) == 1
    assert "kop-dedup bench: error: TimeoutError: (no message)" in capsys.readouterr().err


def urls(service: str, admin: str, *, no_start: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        pulsar_service_url=service, pulsar_admin_url=admin, no_start_broker=no_start
    )


def test_a_local_broker_is_started_only_for_loopback_urls_and_when_allowed():
    assert command.may_start_broker(urls("pulsar://127.0.0.1:6650", "http://localhost:8080"))
    assert not command.may_start_broker(urls("pulsar://pulsar.prod:6650", "http://127.0.0.1:8080"))
    assert not command.may_start_broker(
        urls("pulsar://127.0.0.1:6650", "http://127.0.0.1:8080", no_start=True)
    )


def test_without_a_broker_and_told_not_to_start_one_it_fails_at_once_saying_how(tmp_path):
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "kop_dedup", "bench", "--no-start-broker"),
            *("--out", str(tmp_path)),
            *("--service-url", f"pulsar://127.0.0.1:{free_port()}"),
            *("--admin-url", f"http://127.0.0.1:{free_port()}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "no Pulsar broker answers at http://127.0.0.1:" in proc.stderr
    assert "kop-dedup pulsar start" in proc.stderr


class FakeBroker:
    """Stands in for LocalPulsar: records what the bench asked of it."""

    made: list[FakeBroker] = []  # noqa: RUF012 - a test double's log

    def __init__(self, log_dir, data_dir):
        self.service_url = f"pulsar://127.0.0.1:{free_port()}"
        self.admin_url = f"http://127.0.0.1:{free_port()}"
        self.data_dir, self.log_dir = data_dir, log_dir
        self.log_file = log_dir / "pulsar.log"
        self.wiped = False
        FakeBroker.made.append(self)

    @classmethod
    def throwaway(cls, log_dir, prefix):
        data_dir = log_dir.parent / f"{prefix}data"
        data_dir.mkdir()
        return cls(log_dir, data_dir)

    def start(self):
        self.log_file.parent.mkdir(parents=True)
        self.log_file.write_text("the broker's own words\n")
        raise BrokerError(f"Pulsar exited with 1 before it was ready; log tail ({self.log_file})")

    def wipe(self):
        self.wiped = True


def test_a_broker_started_for_the_run_is_stopped_and_wiped_and_its_log_kept(tmp_path, monkeypatch):
    FakeBroker.made.clear()
    monkeypatch.setattr(command, "LocalPulsar", FakeBroker)
    monkeypatch.setattr(command, "broker_ready", lambda url: False)
    args = urls(f"pulsar://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BrokerError, match="log tail"), command._broker(args, tmp_path):
        pytest.fail("the broker did not start: the run must not go on")
    [broker] = FakeBroker.made
    assert broker.wiped
    assert broker.log_file.is_relative_to(tmp_path)
    assert broker.log_file.read_text() == "the broker's own words\n"


def test_the_first_failed_batch_stops_the_run_and_is_raised():
    calls = []

    async def send(i: int, seq: int) -> None:
        calls.append(seq)
        await asyncio.sleep(0.001)
        if (i, seq) == (0, 20):  # producer 0's third batch
            raise RuntimeError("sidecar answered 200: MESSAGE_TOO_LARGE")

    with pytest.raises(RuntimeError, match="MESSAGE_TOO_LARGE"):
        asyncio.run(produce.drive(2, 10, seconds=30, rate=None, send=send))
    assert len(calls) <= 2 * (3 + 5)  # what was in flight when it failed, not 30 s of it


def test_producers_are_spread_over_the_sidecars_one_owner_each_and_failures_show_every_log(
    tmp_path,
):
    procs = [
        SidecarProcess("pulsar://127.0.0.1:1", "http://127.0.0.1:1", log_dir=tmp_path, port=p)
        for p in (7001, 7002)
    ]
    group = Sidecars(procs)
    assert [group.url_for(i) for i in range(4)] == [procs[0].url, procs[1].url] * 2
    for sc, text in zip(procs, ("first log line", "second log line"), strict=True):
        sc.log_path.write_text(text)
    message = describe_failure("the cell", RuntimeError("boom"), group)
    assert "first log line" in message
    assert "second log line" in message
