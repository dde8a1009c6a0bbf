"""Names clients choose are checked before anything stores them or builds a URL: Kafka's
topic rules, bounded group and transactional ids, and the admin client's last guard
on every path it is asked to call."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kop_dedup import errors
from kop_dedup.coordination.names import (
    MAX_ID_LENGTH,
    validate_group_id,
    validate_topics,
    validate_transactional_id,
)
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming, check_admin_path

HOSTILE_TOPICS = [
    "../../acme/pay/ledger",
    "..",
    ".",
    "a/b",
    "%2e%2e",
    "a%2Fb",
    "a\\b",
    "",
    "x" * 250,
    "orders-partition-3",
    "ünïcode",
    "a b",
]


@pytest.mark.parametrize("topic", HOSTILE_TOPICS)
def test_a_topic_kafka_refuses_is_invalid_topic(topic):
    with pytest.raises(errors.InvalidTopic):
        validate_topics(["fine", topic])


def test_kafkas_legal_topics_pass():
    validate_topics(["orders", "a.b_c-d", "x" * 249, "..."])


@pytest.mark.parametrize("bad", ["", "x" * (MAX_ID_LENGTH + 1)])
def test_an_empty_or_overlong_id_is_refused(bad):
    with pytest.raises(errors.InvalidGroupId):
        validate_group_id(bad)
    with pytest.raises(errors.InvalidRequest):
        validate_transactional_id(bad)


def test_ids_kafka_clients_use_pass():
    # Kafka takes any text: control characters too (the metrics escape them)
    for ok in ("payments", "app-1/sub", "x" * MAX_ID_LENGTH, "ünïcode id", "a\nb", "del\x7f"):
        validate_group_id(ok)
        validate_transactional_id(ok)


@pytest.mark.parametrize(
    "path",
    [
        "/admin/v2/persistent/public/kafka/../../acme/pay/ledger/partitions",
        "/admin/v2/persistent/public/kafka/./x/partitions",
        "/admin/v2/persistent/public/kafka//partitions",
        "/admin/v2/persistent/public/kafka/a%2Fb/partitions",
        "/admin/v2/persistent/public/kafka/%2e%2e/partitions",
        "/admin/v2/persistent/public/kafka/a%252Fb/partitions",
        "/admin/v2/persistent/public/kafka/a\\b/partitions",
        "/other/v2/x",
    ],
)
def test_an_admin_path_that_could_step_out_is_refused(path):
    with pytest.raises(errors.InvalidTopic):
        check_admin_path(path)


def test_an_ordinary_admin_path_passes_its_query_unchecked():
    check_admin_path("/admin/v2/persistent/public/kafka/orders/partitions?force=true&x=..")


def test_the_admin_client_never_sends_a_refused_path_or_a_bad_topic():
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(200, json={"partitions": 1})

    async def scenario() -> None:
        admin = PulsarAdmin("http://broker:8080", Naming("public", "kafka", "kop"))
        await admin.close()
        admin._http = httpx.AsyncClient(
            base_url="http://broker:8080", transport=httpx.MockTransport(handler)
        )
        try:
            with pytest.raises(errors.InvalidTopic):
                await admin.request("GET", "/admin/v2/persistent/public/kafka/../x/partitions")
            with pytest.raises(errors.InvalidTopic):
                await admin.partitions("../../acme/pay/ledger", create_with=1)
            with pytest.raises(errors.InvalidTopic):
                await admin.delete_topic("a/b")
            assert await admin.partitions("orders", create_with=None) == 1
        finally:
            await admin.close()

    asyncio.run(scenario())
    assert sent == ["http://broker:8080/admin/v2/persistent/public/kafka/orders/partitions"]
