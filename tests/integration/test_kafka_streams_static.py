"""Kafka Streams (exactly_once_v2) as static members (``group.instance.id``, KIP-345):
two instances of the counting application of :mod:`.test_kafka_streams`, each with an
instance id; one is killed (SIGKILL) mid-input and started again with the same instance
id and state directory within its session. On Kafka the survivor goes on without a
rebalance and the restarted instance takes its tasks back; the sidecar must do the same,
and the counts must still be exact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_kafka_streams import (
    PARTITIONS,
    RECORDS,
    _expected,
    _inputs,
    _outcome,
    _stopped_cleanly,
    _until_seen,
)
from tests.kafka_conformance import Target
from tests.kafka_streams import StreamsApp

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SESSION_S = 30  # StreamsCount's session for a static member


def _rebalances(app: StreamsApp, since: int) -> int:
    return sum(1 for line in app.lines()[since:] if line.endswith("-> REBALANCING"))


def restart_static(target: Target, workdir: Path) -> dict[str, Any]:
    source = target.create_topic(partitions=PARTITIONS, stem="streams-in")
    sink = target.create_topic(partitions=PARTITIONS, stem="streams-out")
    sent = target.produce(source, _inputs(), enable_idempotence=True)
    assert not [d for d in sent if d.error], sent
    group = target.unique("counter")
    apps = [
        StreamsApp(
            workdir / name, target.bootstrap, group, source, sink, sleep_ms=20, instance=name
        )
        for name in ("static-a", "static-b")
    ]
    try:
        for app in apps:
            app.start()
        for app in apps:
            app.wait_running(90)
        deadline = time.monotonic() + 60
        while min(app.processed() for app in apps) < 20:  # both at work
            assert time.monotonic() < deadline, (  # each instance's own story
                f"{target.name}: processed {[app.processed() for app in apps]}\n"
                + "\n".join(f"{app.workdir.name}: {app.tail()}" for app in apps)
            )
            time.sleep(0.05)
        survivor, restarted = apps
        seen = len(survivor.lines())
        restarted.kill()
        killed = time.monotonic()
        restarted.start()  # the same instance id and state directory
        restarted.wait_running(SESSION_S)
        back_s = time.monotonic() - killed
        _until_seen(target, survivor, sink, RECORDS, 120)
        survivor_rebalances = _rebalances(survivor, seen)
    finally:
        codes = [app.stop() for app in apps]
    for app, code in zip(apps, codes, strict=True):
        _stopped_cleanly(target, app, code)
    return {
        "survivor_rebalances": survivor_rebalances,
        "back_within_session": back_s < SESSION_S,
        "counts_exact": _outcome(target, group, source, sink) == _expected(),
    }


def test_streams_static_member_restarted_takes_its_tasks_back_without_a_rebalance(
    conformance, tmp_path
):
    kafka, sidecar = conformance
    on_kafka = restart_static(kafka, tmp_path / "kafka")
    on_sidecar = restart_static(sidecar, tmp_path / "sidecar")
    print(f"\nkafka: {on_kafka}\nsidecar: {on_sidecar}")
    assert on_kafka == {"survivor_rebalances": 0, "back_within_session": True, "counts_exact": True}
    assert on_sidecar == on_kafka
