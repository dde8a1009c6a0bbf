"""A Kafka Connect worker in distributed mode (``ConnectDistributed`` from the Kafka
jars) against a bootstrap address, for tests: its config, its REST API, start and a
graceful stop (SIGTERM: it commits its source offsets and leaves its group).

>>> with ConnectWorker(workdir, bootstrap, "connect-1") as worker:
...     worker.rest("POST", "/connectors", {"name": "src", "config": {...}})
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any, Self

import httpx

from kop_dedup_tools import kafka_jars
from kop_dedup_tools.launcher import free_port
from tests.process_groups import stop_group

__all__ = ["ConnectWorker"]

_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.reflections.name = org.reflections
logger.reflections.level = error
"""


class ConnectWorker:
    """One distributed worker; ``group`` names its Connect cluster (and its internal
    topics ``<group>-configs``, ``-offsets``, ``-status``)."""

    def __init__(self, workdir: Path, bootstrap: str, group: str) -> None:
        self.workdir = workdir
        self.group = group
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.topics = {k: f"{group}-{k}" for k in ("configs", "offsets", "status")}
        workdir.mkdir(parents=True, exist_ok=True)
        props = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "config.storage.topic": self.topics["configs"],
            "offset.storage.topic": self.topics["offsets"],
            "status.storage.topic": self.topics["status"],
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.storage.partitions": "2",
            "status.storage.partitions": "1",
            "offset.flush.interval.ms": "500",
            "listeners": self.url,
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            # only Kafka's own plugins, found through their service manifests: no scan
            "plugin.discovery": "service_load",
            # a worker that restarts gets its connector back at once, not 5 minutes later
            "scheduled.rebalance.max.delay.ms": "0",
        }
        self.config = workdir / f"{group}.properties"
        self.config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.log = workdir / f"{group}.log"
        self.log_config = workdir / f"{group}-log4j2.properties"
        self.log_config.write_text(_LOG4J.format(log=self.log))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> Self:
        cmd = kafka_jars.java_command(
            kafka_jars.CONNECT_DISTRIBUTED,
            str(self.config),
            heap="384m",
            jvm_options=("-XX:+UseSerialGC",),
            log_config=self.log_config,
        )
        with (self.workdir / f"{self.group}.out").open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"Connect exited {self.proc.returncode}: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/connectors", timeout=2).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                raise AssertionError(f"Connect not ready in {timeout:.0f}s: {self.tail()}")
            time.sleep(0.2)

    def rest(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", json=body, timeout=30)

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM (a graceful stop: source offsets committed, the group left), SIGKILL
        after ``grace``; the exit code."""
        return None if self.proc is None else stop_group(self.proc, grace)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
