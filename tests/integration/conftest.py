"""Integration fixtures: a sidecar on a real socket against the session's broker, and one
Spark session for the Spark tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pulsar as pulsar_client
import pytest

from tests.helpers import uniq
from tests.sidecar import ThreadSidecar


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession (local[2], the connector on its classpath) for every Spark test of
    the session: a JVM takes seconds to start."""
    from kop_dedup.spark.jars import spark_session

    started = time.monotonic()
    session = spark_session("kop-dedup-tests", master="local[2]")
    print(f"\nSpark session ready in {time.monotonic() - started:.1f}s")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def data_namespace(pulsar: Any) -> str:
    """``public/kafka`` (the sidecar's default data namespace) with deduplication on, for
    tests that create topics before any sidecar has started (a sidecar creates it too)."""
    ns = "public/kafka"
    r = httpx.put(f"{pulsar.admin_url}/admin/v2/namespaces/{ns}", json={}, timeout=30)
    assert r.status_code in {204, 409}, r.text
    r = httpx.post(
        f"{pulsar.admin_url}/admin/v2/namespaces/{ns}/deduplication", json=True, timeout=30
    )
    assert r.status_code == 204, r.text
    return ns


@pytest.fixture(scope="session")
def sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    """One in-process sidecar (uvicorn in a thread) shared by the session: a cluster of
    its own (its own system namespace), so that the sidecars a test starts side by side
    (which share the default one) never move its state partitions."""
    with ThreadSidecar(pulsar, reorder_window_ms=1500, system_namespace=uniq("sys")) as sc:
        yield sc


@pytest.fixture(scope="session")
def sidecar_kafka(sidecar: ThreadSidecar) -> str:
    """``host:port`` of the session sidecar's Kafka listener (a free port), for
    ``bootstrap.servers``."""
    return sidecar.kafka_bootstrap


@pytest.fixture
def api(sidecar: ThreadSidecar) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sidecar.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="session")
def pulsar_reader_client(pulsar: Any) -> Iterator[pulsar_client.Client]:
    client = pulsar_client.Client(
        pulsar.service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Warn)
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def groups_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    """A sidecar for consumer-group tests (one per module): sessions swept, lag refreshed
    and subscriptions moved every 100-200 ms."""
    with ThreadSidecar(
        pulsar,
        group_sweep_interval_ms=100,
        group_cursor_interval_ms=200,
        group_lag_interval_ms=200,
        system_namespace=uniq("sys"),
    ) as sc:
        yield sc


@pytest.fixture(scope="module")
def kg(pulsar: Any) -> Iterator[ThreadSidecar]:
    """Kafka groups with sessions from 1 s, swept every 100 ms."""
    with ThreadSidecar(
        pulsar,
        kafka_group_min_session_timeout_ms=1000,
        group_sweep_interval_ms=100,
        system_namespace=uniq("sys"),
    ) as sc:
        yield sc


@pytest.fixture
def g(groups_sidecar: ThreadSidecar) -> Iterator[httpx.Client]:
    """A client of :func:`groups_sidecar`."""
    with httpx.Client(base_url=groups_sidecar.url, timeout=60) as client:
        yield client
