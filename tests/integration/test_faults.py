"""Faults that really happen, under load: nothing lost, nothing duplicated.

The load driver plays idempotent Kafka producers that retry every batch until
a definite answer (kop_dedup.load). While it runs, the broker or a sidecar is
killed, paused or replaced. Afterwards every partition is read back from the
earliest and compared with what the producers were told was delivered.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kop_dedup.load import LoadConfig, LoadReport, run_load, verify
from tests.helpers import uniq
from tests.sidecar import ProcessSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]

RESULTS: list[dict[str, Any]] = []


class Background:
    """Run the load driver in a thread with its own event loop; its report is live."""

    def __init__(self, cfg: LoadConfig) -> None:
        self.cfg = cfg
        self.report = LoadReport()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(run_load(self.cfg, report=self.report))
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def start(self, answered: int = 20, timeout: float = 60) -> Background:
        """Start, and return once ``answered`` batches had an answer (polled, no bare sleep)."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while self.report.acknowledged + self.report.duplicates < answered:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise TimeoutError(f"the load made no progress: {self.error!r}")
            time.sleep(0.05)
        return self

    def join(self, timeout: float = 240) -> LoadReport:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the load driver did not finish in time"
        if self.error is not None:
            raise self.error
        return self.report


def check(
    name: str, pulsar: Any, cfg: LoadConfig, report: LoadReport, seconds: float, tmp_path: Path
) -> None:
    v = verify(pulsar.service_url, cfg.topic, partitions=cfg.partitions, expected=report.expected)
    summary = {
        "fault": name,
        "sent_batches": report.sent_batches,
        "acknowledged": report.acknowledged,
        "answered_duplicate": report.duplicates,
        "retries": report.retries,
        "fatal": report.fatal,
        "delivered_records": report.delivered_records,
        "read_back": v.read,
        "lost": v.lost,
        "duplicated": v.duplicated,
        "out_of_order": v.out_of_order,
        "seconds": round(seconds, 1),
    }
    RESULTS.append(summary)
    print(f"\nFAULT {json.dumps(summary)}")
    (tmp_path / f"fault-{name}.json").write_text(json.dumps(summary, indent=2))
    assert report.fatal == {}, report.fatal
    assert v.lost == 0
    assert v.duplicated == 0
    assert v.out_of_order == 0
    assert v.foreign == 0
    assert (
        v.read
        == report.delivered_records
        == cfg.producers * cfg.partitions * cfg.batches * cfg.records
    )


def load_config(urls: list[str], **over: Any) -> LoadConfig:
    base = {
        "urls": tuple(urls),
        "topic": uniq("fault"),
        "partitions": 2,
        "producers": 3,
        "batches": 40,
        "records": 5,
        "in_flight": 5,
        "request_timeout_ms": 4000,
        "delivery_timeout_s": 150,
        "progress_every_s": 5,
    }
    base.update(over)
    return LoadConfig(**base)


def test_broker_sigkill_and_restart_under_load(pulsar_control, tmp_path):
    with ProcessSidecar(pulsar_control, tmp_path, default_partitions=2) as sc:
        cfg = load_config([sc.url])
        started = time.monotonic()
        bg = Background(cfg).start()
        pulsar_control.kill()
        time.sleep(1.0)  # the broker stays dead for a moment while requests pile up
        pulsar_control.start()
        report = bg.join()
        check("broker-sigkill", pulsar_control, cfg, report, time.monotonic() - started, tmp_path)
        assert report.retries > 0  # the fault was felt


def test_sidecar_sigkill_and_restart_under_load(pulsar, tmp_path):
    sc = ProcessSidecar(pulsar, tmp_path, default_partitions=2).start()
    try:
        cfg = load_config([sc.url])
        started = time.monotonic()
        bg = Background(cfg).start()
        sc.kill()
        time.sleep(0.5)
        sc.start()
        report = bg.join()
        check("sidecar-sigkill", pulsar, cfg, report, time.monotonic() - started, tmp_path)
        assert report.retries > 0
    finally:
        sc.stop()


def test_second_sidecar_takes_over_when_the_first_dies(pulsar, tmp_path):
    first = ProcessSidecar(pulsar, tmp_path, default_partitions=2).start()
    second = ProcessSidecar(pulsar, tmp_path, default_partitions=2).start()
    try:
        cfg = load_config([first.url, second.url])
        started = time.monotonic()
        bg = Background(cfg).start()
        first.kill()
        report = bg.join()
        check("sidecar-failover", pulsar, cfg, report, time.monotonic() - started, tmp_path)
        assert report.retries > 0
    finally:
        first.stop()
        second.stop()


def test_broker_paused_long_enough_to_time_requests_out(pulsar_control, tmp_path):
    with ProcessSidecar(pulsar_control, tmp_path, default_partitions=2, send_timeout_ms=2000) as sc:
        cfg = load_config([sc.url], request_timeout_ms=1500)
        started = time.monotonic()
        bg = Background(cfg).start()
        pulsar_control.pause()
        try:
            time.sleep(6)  # longer than the request and send timeouts: they must fire
        finally:
            pulsar_control.resume()
        report = bg.join()
        check("broker-paused", pulsar_control, cfg, report, time.monotonic() - started, tmp_path)
        assert report.retries > 0
