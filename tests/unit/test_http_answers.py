"""What the HTTP edge answers is rendered from the error classes (errors.py) and the
service's result object, never from codes written by hand."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.produce.service import BatchResult
from kop_dedup.pulsar.failures import translate
from tests.helpers import one_batch
from tests.unit.asgi import Client


def test_init_producer_id_success_is_kafkas_none():
    body = Client().post("/v1/init-producer-id", json={}).json()
    assert (body["errorCode"], body["error"]) == (errors.NONE_ERRNO, errors.NONE_NAME)
    assert (body["producerId"], body["producerEpoch"]) == (1000, 0)


def test_init_producer_id_pulsar_trouble_goes_through_the_one_translation():
    client = Client()
    failure = ConnectionResetError("broker went away")

    async def broken() -> int:
        raise failure

    client.runtime.registry.allocator.allocate = broken
    body = client.post("/v1/init-producer-id", json={}).json()
    expected = translate(failure, "the producer-id registry in Pulsar")
    assert (body["errorCode"], body["error"]) == (expected.errno, expected.name)
    assert "Pulsar unreachable" in body["errorMessage"]
    assert "broker went away" not in body["errorMessage"]  # logged, not answered
    assert (body["producerId"], body["producerEpoch"]) == (-1, -1)
    assert errors.error_for_code(body["errorCode"]).retriable


def test_init_producer_id_kafka_errors_are_answered_with_their_own_code():
    client = Client()

    async def busy(_request: object) -> tuple[int, int]:
        raise errors.ConcurrentTransactions("another init is running")

    client.runtime.transactions.init_producer_id = busy
    body = client.post("/v1/init-producer-id", json={"transactionalId": "app"}).json()
    assert body["errorCode"] == errors.ConcurrentTransactions.errno
    assert body["error"] == errors.ConcurrentTransactions.name
    assert body["errorMessage"] == "another init is running"


def test_init_producer_id_timeout_out_of_range_is_invalid_transaction_timeout():
    r = Client().post("/v1/init-producer-id", json={"transactionTimeoutMs": 900_001})
    assert r.json()["errorCode"] == errors.InvalidTransactionTimeout.errno
    assert r.json()["error"] == errors.InvalidTransactionTimeout.name


@pytest.mark.parametrize(
    ("error", "message_id"),
    [
        (None, "3:4:0:-1"),
        (errors.DuplicateSequenceNumber("already stored"), "3:4:0:-1"),  # a recent retry
        (errors.DuplicateSequenceNumber("already stored"), None),
        (errors.OutOfOrderSequenceNumber("expected 2"), None),
        (errors.RequestTimedOut("no receipt"), None),
    ],
)
def test_a_batch_result_is_rendered_from_the_result_object(error, message_id):
    client = Client()
    client.runtime.service.answer = lambda b: BatchResult(b.topic, b.partition, error, message_id)
    r = client.post("/v1/produce", json={"batches": [one_batch()]})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [
        {
            "topic": "t",
            "partition": 0,
            "errorCode": errors.NONE_ERRNO if error is None else error.errno,
            "error": errors.NONE_NAME if error is None else error.name,
            "messageId": message_id,
            "errorMessage": None if error is None else error.message,
        }
    ]


def test_too_many_batches_are_answered_once_413_invalid_request():
    client = Client(max_batches_per_request=2)
    r = client.post("/v1/produce", json={"batches": [one_batch(), one_batch(), one_batch()]})
    assert r.status_code == 413, r.text
    body = r.json()
    assert (body["errorCode"], body["error"]) == (
        errors.InvalidRequest.errno,
        errors.InvalidRequest.name,
    )
    assert "3 batches in one request; the limit is 2" in body["errorMessage"]
    assert "results" not in body  # one answer, not one copy per batch
    assert client.runtime.service.batches == []
