"""Kafka Connect in distributed mode on the sidecar's listener: the worker creates its
config, offset and status topics compacted (and checks that they are, with
DescribeConfigs), joins its group, runs a file source connector, stops, and a new
worker of the same Connect cluster takes the connector back from the config topic and
goes on from the position in the offset topic: the records after the restart follow
the ones before, none sent twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.kafka_admin_wire import describe_configs
from tests.kafka_conformance import Target
from tests.kafka_connect import ConnectWorker
from tests.kafka_wire import WireClient

pytestmark = [pytest.mark.integration]

_SOURCE = "org.apache.kafka.connect.file.FileStreamSourceConnector"


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f}s"
        time.sleep(0.2)
    return value


def _end(target: Target, topic: str, partitions: int = 1) -> int:
    return sum(target.end_offsets(topic, partitions).values())


def _running(worker: ConnectWorker, name: str) -> bool:
    resp = worker.rest("GET", f"/connectors/{name}/status")
    if resp.status_code != 200:
        return False
    status = resp.json()
    tasks = status.get("tasks") or []
    return status["connector"]["state"] == "RUNNING" and any(t["state"] == "RUNNING" for t in tasks)


def test_connect_runs_a_connector_across_a_worker_restart_and_keeps_its_offsets(
    pulsar, sidecar_kafka, tmp_path
):
    target = Target("sidecar", sidecar_kafka)
    topic = target.create_topic(partitions=1, stem="connect-out")
    source = tmp_path / "in.txt"
    source.write_text("".join(f"line-{i}\n" for i in range(20)))
    group = target.unique("connect")
    connector = {
        "name": "file-source",
        "config": {
            "connector.class": _SOURCE,
            "tasks.max": "1",
            "file": str(source),
            "topic": topic,
        },
    }
    first = ConnectWorker(tmp_path / "first", sidecar_kafka, group)
    with first:
        _until(
            lambda: first.rest("POST", "/connectors", connector).status_code == 201,
            30,
            f"the connector created ({first.tail()})",
        )
        _until(lambda: _end(target, topic) == 20, 30, "20 records copied")
        offsets = first.topics["offsets"]
        _until(lambda: _end(target, offsets, 2) > 0, 30, "the source offsets committed")
        with WireClient(sidecar_kafka) as c:
            for internal in first.topics.values():
                policy = describe_configs(c, internal, ["cleanup.policy"]).configs[0]
                assert (policy.value, policy.config_source) == ("compact", 1), internal
        kept = httpx.get(
            f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{first.topics['configs']}/retention"
        ).json()
        assert kept == {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    with source.open("a") as f:
        f.write("".join(f"line-{i}\n" for i in range(20, 30)))
    second = ConnectWorker(tmp_path / "second", sidecar_kafka, group)
    with second:
        _until(lambda: _running(second, "file-source"), 60, f"the connector back ({second.tail()})")
        _until(lambda: _end(target, topic) >= 30, 30, "the appended records copied")
        time.sleep(1.5)  # a second copy of the first 20 would have come by now
        values = [r.value for r in target.read(topic, 1, settle=False)[0]]
    assert values == [f"line-{i}".encode() for i in range(30)]
