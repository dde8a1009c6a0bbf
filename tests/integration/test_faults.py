"""Faults that really happen, under load: nothing lost, nothing duplicated, nothing reordered.

The load driver (kop_dedup_tools.load) plays idempotent Kafka producers that retry
every batch with the same producer id, epoch and sequences until a definite
answer. While it runs, the broker is SIGKILLed and restarted or paused past
the request timeouts, or a sidecar process is SIGKILLed and restarted or
replaced by a second one. Each test then waits until the load makes progress
again, stops it (batches in flight still get their answer), reads every
partition back from the earliest and compares with what the producers were
told was delivered.

Counts and timings are printed (``pytest -s`` or ``-rA``), logged, and written
as JSON to the test's tmp dir and to ``<basetemp>/faults.json``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kop_dedup_tools.load import BackgroundLoad, LoadConfig, LoadReport, verify
from tests.helpers import batch, new_pid, read_all, uniq
from tests.sidecar import ProcessSidecar, ThreadSidecar

pytestmark = [pytest.mark.integration, pytest.mark.faults]

log = logging.getLogger(__name__)

WARM_UP_BATCHES = 30
"""Batches answered before the fault, so producers are open and in flight."""
AFTER_RECOVERY_BATCHES = 60
"""Batches answered after the recovery, so the load is seen to go on."""


@pytest.fixture(scope="module")
def fault_results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    results: list[dict[str, Any]] = []
    yield results
    if results:
        path = tmp_path_factory.getbasetemp() / "faults.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"\nfault results: {path}")
        for r in results:
            print(
                f"  {r['fault']:<18} delivered {r['delivered_records']:>5} read back "
                f"{r['read_back']:>5} lost {r['lost']} duplicated {r['duplicated']} answered-46 "
                f"{r['answered_duplicate']:>3} retries {r['retries']:>4} outage "
                f"{r['outage_s']:>5}s (restart {r['restart_s']:>5}s) delivering again after "
                f"{r['recovered_after_s']:>5}s, total {r['total_s']:>5}s"
            )


def fault_config(urls: list[str], **over: Any) -> LoadConfig:
    """A load that runs until it is stopped (bounded at 80 s in case nobody does)."""
    base: dict[str, Any] = {
        "urls": tuple(urls),
        "topics": (uniq("fault"),),
        "partitions": 2,
        "producers": 3,
        "batches": 1_000_000,
        "records": 5,
        "in_flight": 5,
        "request_timeout_ms": 4000,
        "delivery_timeout_s": 75.0,
        "duration_s": 80.0,
        "progress_every_s": 5.0,
    }
    base.update(over)
    return LoadConfig(**base)


class Timeline:
    """When the fault began, when recovery began and was done, when the load went on."""

    def __init__(self, load: BackgroundLoad) -> None:
        self.load = load
        self.t0 = time.monotonic()
        self.fault_at = self.recover_at = self.ready_at = self.back_at = self.t0

    def warm_up(self) -> None:
        self.load.wait_for(lambda r: r.answered >= WARM_UP_BATCHES, timeout=60)

    def fault(self, inject: Callable[[], None], felt: Callable[[LoadReport], bool]) -> None:
        """Inject the fault and wait until the load notices it."""
        before = self.load.snapshot()
        self.fault_at = time.monotonic()
        inject()
        self.load.wait_for(lambda r: r.retries > before.retries and felt(r), timeout=30)

    def recover(self, action: Callable[[], None]) -> None:
        """Undo the fault; wait until the load delivers again, then for a while more."""
        self.recover_at = time.monotonic()
        action()
        self.ready_at = time.monotonic()
        answered = self.load.snapshot().answered
        self.load.wait_for(lambda r: r.answered > answered, timeout=60)
        self.back_at = time.monotonic()
        self.load.wait_for(lambda r: r.answered > answered + AFTER_RECOVERY_BATCHES, timeout=60)

    def finish(self) -> LoadReport:
        self.load.stop()
        return self.load.join(timeout=self.load.config.delivery_timeout_s + 15)

    def timings(self) -> dict[str, float]:
        return {
            "outage_s": round(self.ready_at - self.fault_at, 1),
            "restart_s": round(self.ready_at - self.recover_at, 1),
            "recovered_after_s": round(self.back_at - self.ready_at, 1),
            "total_s": round(time.monotonic() - self.t0, 1),
        }


def check(
    name: str,
    broker: Any,
    report: LoadReport,
    timeline: Timeline,
    tmp_path: Path,
    results: list[dict[str, Any]],
) -> dict[str, Any]:
    """Read everything back; record and print the counts; assert exactly once, in order."""
    v = verify(broker.service_url, report_topics(timeline), report)
    summary = {
        "fault": name,
        "sent_batches": report.sent_batches,
        "sent_records": report.sent_records,
        "acknowledged": report.acknowledged,
        "answered_duplicate": report.duplicates,
        "retries": report.retries,
        "retry_reasons": report.retry_reasons,
        "failovers": report.failovers,
        "fatal": report.fatal,
        "delivered_records": report.delivered_records,
        "read_back": v.read,
        "lost": v.lost,
        "duplicated": v.duplicated,
        "out_of_order": v.out_of_order,
        "unexpected": v.unexpected,
        "corrupt": v.corrupt,
        "latency_ms": report.latency_ms,
        "load_s": report.elapsed_s,
        "verify_s": v.seconds,
        **timeline.timings(),
    }
    results.append(summary)
    text = json.dumps(summary)
    print(f"\nFAULT {text}")
    log.info("fault %s", text)
    (tmp_path / f"fault-{name}.json").write_text(json.dumps(summary, indent=2))
    assert report.fatal == {}, summary
    assert report.answered == report.sent_batches, summary  # every batch had a definite answer
    assert report.retries > 0, summary  # the fault was felt
    assert v.lost == 0, summary
    assert v.duplicated == 0, summary
    assert v.out_of_order == 0, summary
    assert v.unexpected == 0, summary
    assert v.corrupt == 0, summary
    assert v.read == report.delivered_records == report.sent_records, summary
    return summary


def report_topics(timeline: Timeline) -> tuple[str, ...]:
    return timeline.load.config.topics


def test_broker_sigkill_and_restart_loses_and_duplicates_nothing(
    pulsar_control, tmp_path, fault_results
):
    with ProcessSidecar(pulsar_control, tmp_path, default_partitions=2) as sc:
        load = BackgroundLoad(fault_config([sc.url])).start()
        timeline = Timeline(load)
        down = False
        try:
            timeline.warm_up()

            def kill() -> None:
                nonlocal down
                down = True
                pulsar_control.kill()

            def start() -> None:
                nonlocal down
                pulsar_control.start()
                down = False

            timeline.fault(kill, lambda r: True)
            timeline.recover(start)
            report = timeline.finish()
        finally:
            load.stop()
            if down:  # later tests in the session need a broker
                pulsar_control.start()
        check("broker-sigkill", pulsar_control, report, timeline, tmp_path, fault_results)


def test_sidecar_sigkill_and_restart_on_the_same_port_loses_and_duplicates_nothing(
    pulsar, tmp_path, fault_results
):
    sc = ProcessSidecar(pulsar, tmp_path, default_partitions=2).start()
    load = BackgroundLoad(fault_config([sc.url])).start()
    timeline = Timeline(load)
    try:
        timeline.warm_up()
        timeline.fault(sc.kill, lambda r: any(k.startswith("http:") for k in r.retry_reasons))
        timeline.recover(sc.start)
        report = timeline.finish()
    finally:
        load.stop()
        sc.stop()
    check("sidecar-sigkill", pulsar, report, timeline, tmp_path, fault_results)


def test_second_sidecar_serves_the_same_producers_after_the_first_dies(
    pulsar, tmp_path, fault_results
):
    first = ProcessSidecar(pulsar, tmp_path, default_partitions=2).start()
    second = ProcessSidecar(pulsar, tmp_path, default_partitions=2).start()
    # the producers start spread over both URLs; those on the first must move over
    load = BackgroundLoad(fault_config([first.url, second.url])).start()
    timeline = Timeline(load)
    try:
        timeline.warm_up()
        timeline.fault(first.kill, lambda r: r.failovers > 0)
        timeline.recover(lambda: None)  # nothing comes back: the second sidecar carries on
        report = timeline.finish()
    finally:
        load.stop()
        first.stop()
        second.stop()
    summary = check("sidecar-failover", pulsar, report, timeline, tmp_path, fault_results)
    assert summary["failovers"] > 0


def test_broker_paused_past_the_timeouts_loses_and_duplicates_nothing(
    pulsar_control, tmp_path, fault_results
):
    hold_s = 6.0  # > the request (2 s) and send (1 s) timeouts: both must fire
    with ProcessSidecar(pulsar_control, tmp_path, default_partitions=2, send_timeout_ms=1000) as sc:
        load = BackgroundLoad(fault_config([sc.url], request_timeout_ms=2000)).start()
        timeline = Timeline(load)
        paused = False
        try:
            timeline.warm_up()

            def pause() -> None:
                nonlocal paused
                paused = True
                pulsar_control.pause()

            timed_out = ("code:7", "http:ReadTimeout")
            timeline.fault(pause, lambda r: any(k in r.retry_reasons for k in timed_out))
            # the fault is the pause itself: hold it a while past the first timeouts
            time.sleep(max(0.0, timeline.fault_at + hold_s - time.monotonic()))

            def resume() -> None:
                nonlocal paused
                pulsar_control.resume()
                paused = False

            timeline.recover(resume)
            report = timeline.finish()
        finally:
            load.stop()
            if paused:
                pulsar_control.resume()
        check("broker-paused", pulsar_control, report, timeline, tmp_path, fault_results)


def test_the_first_batches_after_a_broker_restart_are_stored_at_once(
    pulsar_control, pulsar_reader_client
):
    """A broker restart must not cost a round of retriable answers from the sidecar's own
    state. It did: the epoch registry's reader kept a subscription the new broker did not
    know, so with strict fencing every idempotent batch was answered 6 until the reader
    reconnected, or 7 after the whole request timeout while it waited on a dead
    connection (in a repro, 12 of 12 first batches after restarts). Twice, with four
    batches each; new producers on new topics, so the client's backoff for producers
    that were open during the outage (a documented limit) plays no part."""
    answers: list[list[int]] = []
    topics: list[str] = []
    with ThreadSidecar(pulsar_control) as sc, httpx.Client(base_url=sc.url, timeout=60) as api:
        warm = api.post("/v1/produce", json={"batches": [batch(uniq("warm"), new_pid(api), 0, 1)]})
        assert warm.json()["results"][0]["errorCode"] == 0, warm.text  # registry reader open
        for _ in range(2):
            pulsar_control.kill()
            pulsar_control.start()
            started, round_topics = time.monotonic(), [uniq("restart") for _ in range(4)]
            answers.append(
                [
                    api.post("/v1/produce", json={"batches": [b]}).json()["results"][0]["errorCode"]
                    for b in (
                        batch(topic, new_pid(api), 0, 2, epoch=i % 2)  # odd: a registry write
                        for i, topic in enumerate(round_topics)
                    )
                ]
            )
            topics += round_topics
            log.info(
                "first batches after a restart: %s in %.1fs",
                answers[-1],
                time.monotonic() - started,
            )
    assert answers == [[0] * 4] * 2
    stored = [
        read_all(pulsar_reader_client, f"persistent://public/kafka/{t}-partition-0") for t in topics
    ]
    assert [len(msgs) for msgs in stored] == [2] * len(topics)
