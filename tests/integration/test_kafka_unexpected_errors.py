"""An unexpected exception in a Kafka handler is answered UNKNOWN_SERVER_ERROR naming
its kind, never its repr (issue 36, item 9): its text may hold internal addresses or
state, and goes to the log only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kop_dedup.transports.kafka import routed
from tests.helpers import uniq
from tests.kafka_admin_wire import describe_cluster
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

SECRET_TEXT = "peer http://10.9.8.7:8080/internal/v1 said token=abc"


@pytest.fixture(scope="module")
def sc(pulsar) -> Iterator[ThreadSidecar]:
    with ThreadSidecar(pulsar, system_namespace=uniq("sys")) as sidecar:
        yield sidecar


def test_an_unexpected_exception_is_answered_by_its_kind_not_its_repr(sc, monkeypatch, caplog):
    real = routed.handle

    async def failing(session: Any, api: Any, request: Any, version: int) -> Any:
        if api.name == "DescribeCluster":
            raise RuntimeError(SECRET_TEXT)
        return await real(session, api, request, version)

    monkeypatch.setattr(routed, "handle", failing)
    with WireClient(sc.kafka_bootstrap) as c:
        answer = describe_cluster(c, 0)
    assert answer.error_code == -1  # UNKNOWN_SERVER_ERROR
    assert "10.9.8.7" not in (answer.error_message or ""), answer.error_message
    assert "RuntimeError" in (answer.error_message or ""), answer.error_message
    assert SECRET_TEXT in caplog.text  # the operator has it
