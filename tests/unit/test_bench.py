"""kop-dedup bench without a broker: one aggregation behind the table, the plot and the
JSON; failures that say what failed; a broker started or clearly asked for."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys

import pytest

from kop_dedup import cli
from kop_dedup_tools import bench
from kop_dedup_tools.bench_results import (
    Cell,
    Row,
    plot_series,
    render_table,
    summarize,
    summary_json,
)
from kop_dedup_tools.launcher import BrokerError, free_port
from kop_dedup_tools.sidecar import SidecarProcess


def cell(mode, size, prods, records, p99, **extra) -> Cell:
    return Cell(mode, size, prods, records, records // size, 2.0, p99 / 2, p99, **extra)


# three repetitions per mode where the best is neither the first nor the last, a row
# with only a direct cell, and a paced half-load cell that must not count
CELLS = [
    cell("direct", 100, 8, 20_000, 9.0),
    cell("direct", 100, 8, 24_000, 8.0),
    cell("direct", 100, 8, 22_000, 7.0),
    cell("sidecar", 100, 8, 18_000, 11.0, cpu_pct=80, rss_mb=90),
    cell("sidecar", 100, 8, 19_000, 12.0, cpu_pct=85, rss_mb=91),
    cell("sidecar", 100, 8, 16_000, 10.0, cpu_pct=70, rss_mb=92),
    cell("sidecar", 100, 8, 999_000, 1.0, rate_limited=500.0),
    cell("direct", 1, 1, 2_000, 3.0),
    cell("direct", 1, 1, 2_400, 4.0),
    cell("direct", 1, 1, 2_200, 5.0),
]


def table_rows(table: str) -> dict[tuple[int, int], list[str]]:
    rows = {}
    for line in table.splitlines()[3:]:
        cols = line.replace("|", " ").split()
        rows[int(cols[0]), int(cols[1])] = cols[2:]
    return rows


def test_each_mode_shows_its_best_repetition_by_records_per_second():
    rows = {(r.batch_size, r.producers): r for r in summarize(CELLS)}
    assert rows[100, 8].direct.records == 24_000
    assert rows[100, 8].sidecar.records == 19_000  # not the paced 999,000
    assert rows[100, 8].reps == 3
    assert rows[100, 8].ratio == pytest.approx(19_000 / 24_000)
    assert rows[1, 1].sidecar is None
    assert rows[1, 1].ratio is None


def test_table_plot_and_json_show_the_same_figures():
    rows = summarize(CELLS)
    table = table_rows(render_table(rows))
    series = plot_series(rows)
    summary = {(s["batch_size"], s["producers"]): s for s in summary_json(rows)}
    for r in rows:
        key = (r.batch_size, r.producers)
        for mode in ("direct", "sidecar"):
            best = getattr(r, mode)
            points = {p[0]: p for p in series.get(f"{mode}, {r.producers} producers", [])}
            if best is None:
                assert summary[key][mode] is None
                assert r.batch_size not in points
                continue
            assert summary[key][mode]["records_per_s"] == round(best.records_per_s, 1)
            assert summary[key][mode]["p99_ms"] == best.p99_ms
            assert points[r.batch_size] == (r.batch_size, best.records_per_s, best.p99_ms)
            assert f"{best.records_per_s:,.0f}" in table[key]
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        assert table[key][-1] == ratio
        assert summary[key]["ratio"] == (None if r.ratio is None else round(r.ratio, 3))


def test_the_table_prints_the_ratio_the_json_stores_also_on_a_rounding_boundary():
    # 3,249.6 / 10,000 = 0.32496: the JSON stores 0.325, which reads 0.33 at two decimals;
    # the table must not round the raw ratio to 0.32 on its own
    rows = summarize([cell("direct", 10, 1, 20_000, 1.0), cell("sidecar", 10, 1, 6_499, 2.0)])
    [stored] = summary_json(rows)
    assert stored["ratio"] == 0.325
    assert table_rows(render_table(rows))[10, 1][-1] == f"{stored['ratio']:.2f}" == "0.33"


def test_the_table_heading_says_what_it_shows_and_columns_line_up():
    table = render_table(summarize(CELLS))
    heading, header, rule, *lines = table.splitlines()
    assert heading.startswith("best of 3 repetitions by records/s, each mode on its own")
    bars = [m.start() for m in re.finditer(r"\|", header)]
    for line in lines:  # a missing mode keeps the columns in place
        assert [m.start() for m in re.finditer(r"\|", line)] == bars, line
    assert len(rule) == len(header)


def test_written_results_agree_with_the_printed_table_and_the_plot(tmp_path, monkeypatch):
    plotted: list[list[Row]] = []
    monkeypatch.setattr(bench, "plot", lambda rows, path: plotted.append(rows))
    report = bench.write_results(tmp_path, CELLS, {}, {"started": False})
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["aggregation"] == "best repetition by records/s, chosen for each mode on its own"
    assert len(written["cells"]) == len(CELLS)  # every repetition is kept
    [rows] = plotted
    assert written["summary"] == summary_json(rows)
    assert render_table(rows) in report
    printed = table_rows(report.split("\n\n")[0])
    for s in written["summary"]:
        ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}"
        assert printed[s["batch_size"], s["producers"]][-1] == ratio


def test_a_failure_without_a_message_still_says_what_failed_and_shows_the_sidecar_log(
    tmp_path,
):
    sc = SidecarProcess("pulsar://127.0.0.1:1", "http://127.0.0.1:1", log_dir=tmp_path)
    sc.log_path.write_text("line 1\nERROR producer creation timed out\n")
    with pytest.raises(bench.BenchError) as err, bench._step("creating 10 producer states", sc):
        raise TimeoutError
    message = str(err.value)
    assert message.startswith("creating 10 producer states failed: TimeoutError: (no message)")
    assert f"log {sc.log_path}" in message
    assert "ERROR producer creation timed out" in message
    assert sc.log_path.exists()  # the log a message names stays


def test_the_cli_names_the_type_of_an_error_without_a_message(monkeypatch, capsys):
    def boom(args):
        raise TimeoutError

    monkeypatch.setattr(bench, "_handler", boom)
    assert cli.main(["bench", "--no-start-broker"]) == 1
    assert "kop-dedup bench: error: TimeoutError: (no message)" in capsys.readouterr().err


def urls(service: str, admin: str, *, no_start: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        pulsar_service_url=service, pulsar_admin_url=admin, no_start_broker=no_start
    )


def test_a_local_broker_is_started_only_for_loopback_urls_and_when_allowed():
    assert bench.may_start_broker(urls("pulsar://127.0.0.1:6650", "http://localhost:8080"))
    assert not bench.may_start_broker(urls("pulsar://pulsar.prod:6650", "http://127.0.0.1:8080"))
    assert not bench.may_start_broker(
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
    monkeypatch.setattr(bench, "LocalPulsar", FakeBroker)
    monkeypatch.setattr(bench, "broker_ready", lambda url: False)
    args = urls(f"pulsar://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BrokerError, match="log tail"), bench._broker(args, tmp_path):
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
        asyncio.run(bench._drive(2, 10, seconds=30, rate=None, send=send))
    assert len(calls) <= 2 * (3 + 5)  # what was in flight when it failed, not 30 s of it


def test_producers_are_spread_over_the_sidecars_one_owner_each_and_failures_show_every_log(
    tmp_path,
):
    procs = [
        SidecarProcess("pulsar://127.0.0.1:1", "http://127.0.0.1:1", log_dir=tmp_path, port=p)
        for p in (7001, 7002)
    ]
    group = bench.Sidecars(procs)
    assert [group.url_for(i) for i in range(4)] == [procs[0].url, procs[1].url] * 2
    for sc, text in zip(procs, ("first log line", "second log line"), strict=True):
        sc.log_path.write_text(text)
    message = bench.describe_failure("the cell", RuntimeError("boom"), group)
    assert "first log line" in message
    assert "second log line" in message
