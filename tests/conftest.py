"""Session fixtures: one real Pulsar broker per test session, started lazily.

Where the broker comes from, in order:
1. ``PULSAR_SERVICE_URL`` and ``PULSAR_ADMIN_URL`` when both are set (not controllable);
2. a testcontainers Pulsar container when a Docker daemon answers;
3. the project's own launcher (``kop_dedup_tools.launcher.LocalPulsar``) on free ports
   with a fresh data dir, stopped and wiped when the session ends.

Tests that need the broker carry the ``integration`` marker; the unit tests
never start one. ``KOP_DEDUP_SKIP_INTEGRATION=1`` skips the integration tests.

A reference Apache Kafka broker (``kafka_reference``: one KRaft node from
``kop_dedup_tools.kafka_broker``, free ports, a fresh data dir) is started the first
time a test asks for it and stopped and wiped when the session ends; tests that use it
carry the ``kafka`` marker. ``conformance`` and ``observe_both`` pair it with the
sidecar's Kafka listener (``tests/kafka_conformance.py``).
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from kop_dedup_tools.kafka_broker import LocalKafka
    from tests.kafka_conformance import Observed, Target

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=200,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KOP_DEDUP_SKIP_INTEGRATION") == "1":
        skip = pytest.mark.skip(reason="KOP_DEDUP_SKIP_INTEGRATION=1")
        for item in items:
            if "integration" in item.keywords:
                item.add_marker(skip)


def _docker_answers() -> bool:
    sock_path = "/var/run/docker.sock"
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        sock_path = host.removeprefix("unix://")
    elif host:
        return False  # remote daemons are the user's business; we only probe the local one
    if not Path(sock_path).exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1.0)
            s.connect(sock_path)
            s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b"OK" in s.recv(1024)
    except OSError:
        return False


@dataclass
class Broker:
    """What tests see of the session's broker."""

    service_url: str
    admin_url: str
    controllable: bool
    _local: Any = None

    def _need_local(self) -> Any:
        if self._local is None:
            pytest.skip("this broker is not controllable (external or container)")
        return self._local

    @property
    def local(self) -> Any:
        """The launcher's broker itself (a ``LocalPulsar``), for a tool that kills, pauses
        and restarts it on its own (``kop-dedup soak``); skips when not controllable."""
        return self._need_local()

    def kill(self) -> None:
        self._need_local().kill()

    def start(self) -> None:
        self._need_local().start()

    def restart(self) -> None:
        self._need_local().restart()

    def pause(self) -> None:
        self._need_local().pause()

    def resume(self) -> None:
        self._need_local().resume()


@pytest.fixture(scope="session")
def pulsar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    service, admin = os.environ.get("PULSAR_SERVICE_URL"), os.environ.get("PULSAR_ADMIN_URL")
    if service and admin:
        yield Broker(service, admin, controllable=False)
        return
    if _docker_answers():
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        container = (
            DockerContainer("apachepulsar/pulsar:4.0.8")
            .with_exposed_ports(6650, 8080)
            .with_env("PULSAR_STANDALONE_USE_ZOOKEEPER", "1")
            .with_env("PULSAR_PREFIX_brokerDeduplicationEnabled", "true")
            .with_env("PULSAR_PREFIX_transactionCoordinatorEnabled", "false")
            .with_env("PULSAR_PREFIX_keepAliveIntervalSeconds", "5")
            .with_env(
                "PULSAR_PREFIX_brokerEntryMetadataInterceptors",
                "org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor",
            )
            .with_command(
                "sh -c 'bin/apply-config-from-env.py conf/standalone.conf && "
                "bin/pulsar standalone -nfw -nss'"
            )
        )
        with container:
            wait_for_logs(container, "messaging service is ready", timeout=180)
            host = container.get_container_host_ip()
            yield Broker(
                f"pulsar://{host}:{container.get_exposed_port(6650)}",
                f"http://{host}:{container.get_exposed_port(8080)}",
                controllable=False,
            )
        return
    from kop_dedup_tools.launcher import LocalPulsar

    # the broker's log outlives its data, next to the sidecars' logs, for post-mortems
    local = LocalPulsar.throwaway(tmp_path_factory.getbasetemp() / "pulsar-logs")

    def cleanup() -> None:
        local.wipe(timeout=30)

    atexit.register(cleanup)  # a session that dies mid-way still stops its broker
    local.start()
    try:
        yield Broker(local.service_url, local.admin_url, controllable=True, _local=local)
    finally:
        cleanup()
        atexit.unregister(cleanup)


@pytest.fixture
def pulsar_control(pulsar: Broker) -> Broker:
    """The session broker, for tests that kill, pause or restart it (skips otherwise)."""
    if not pulsar.controllable:
        pytest.skip("needs the local launcher's broker (not external or container)")
    return pulsar


@pytest.fixture
def unique_topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def kafka_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A real Apache Kafka broker (one KRaft node, Kafka's defaults but for one node), the
    oracle for the Kafka listener: started at the first test that asks, stopped and wiped
    at the end of the session (its log stays under the session's basetemp)."""
    from kop_dedup_tools.kafka_broker import LocalKafka

    local = LocalKafka.throwaway(tmp_path_factory.getbasetemp() / "kafka-logs")

    def cleanup() -> None:
        local.wipe(timeout=30)

    atexit.register(cleanup)  # a session that dies mid-way still stops its broker
    try:
        seconds = local.start(timeout=180)  # a busy 2-core machine took 55 s
        print(f"\nreference Kafka ready in {seconds:.1f}s (RSS {local.rss_bytes()} bytes)")
        yield local
    finally:
        cleanup()
        atexit.unregister(cleanup)


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> tuple[Target, Target]:
    """(kafka, sidecar): the reference broker and the sidecar's Kafka listener as targets
    of the same scenario; skips while no ``sidecar_kafka`` fixture exists."""
    from tests.kafka_conformance import Target

    try:  # first: no reference broker is started for a test that would skip
        sidecar = request.getfixturevalue("sidecar_kafka")
    except pytest.FixtureLookupError:
        pytest.skip("no sidecar_kafka fixture: the Kafka listener provides it")
    reference = request.getfixturevalue("kafka_reference")
    bootstrap = sidecar if isinstance(sidecar, str) else sidecar.bootstrap
    return Target("kafka", reference.bootstrap), Target("sidecar", bootstrap)


@pytest.fixture
def observe_both(conformance: tuple[Target, Target]) -> Callable[..., Observed[Any]]:
    """``observe_both(scenario)`` runs it against both targets: ``.kafka``, ``.sidecar``."""
    from tests.kafka_conformance import observe_both as run_both

    kafka, sidecar = conformance
    return functools.partial(run_both, kafka=kafka, sidecar=sidecar)
