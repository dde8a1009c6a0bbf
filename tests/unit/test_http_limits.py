"""Bounds the HTTP edge enforces: negative offsets and partitions are refused (422
naming the field), and the caps on ``timeoutMs`` and ``waitMs`` are the settings
``MAX_TIMEOUT_MS`` and ``MAX_PULL_WAIT_MS``, in the answer and in the OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest

from kop_dedup import errors
from tests.helpers import one_batch
from tests.unit.asgi import Client


def refused(r: Any, field: str) -> str:
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["errorCode"], body["error"]) == (
        errors.InvalidRequest.errno,
        errors.InvalidRequest.name,
    )
    assert field in body["errorMessage"], body
    return str(body["errorMessage"])


TXN = {"transactionalId": "app", "producerId": 1, "producerEpoch": 0, "groupId": "g"}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/v1/groups/g/offsets",
            {"offsets": [{"topic": "t", "partition": 0, "offset": -1}]},
            "body.offsets.0.offset",
        ),
        (
            "/v1/groups/g/offsets",
            {"offsets": [{"topic": "t", "partition": -1, "offset": 3}]},
            "body.offsets.0.partition",
        ),
        (
            "/v1/txn-offset-commit",
            {**TXN, "offsets": [{"topic": "t", "partition": 0, "offset": -42}]},
            "body.offsets.0.offset",
        ),
        (
            "/v1/groups/g/members/m/commit",
            {"offsets": [{"topic": "t", "partition": 0, "offset": -7}]},
            "body.offsets.0.offset",
        ),
        (
            "/v1/groups/g/members/m/commit",
            {"offsets": [{"topic": "t", "partition": -2, "offset": 7}]},
            "body.offsets.0.partition",
        ),
    ],
)
def test_a_negative_offset_or_partition_is_refused_naming_the_field(path, body, field):
    refused(Client().post(path, json=body), field)


def test_an_epoch_above_32767_is_a_422_naming_the_field():
    r = Client().post("/v1/produce", json={"batches": [one_batch(producerEpoch=32768)]})
    refused(r, "body.batches.0.producerEpoch")


def test_a_timeout_above_max_timeout_ms_is_refused_and_one_at_it_is_taken():
    client = Client(max_timeout_ms=300_000)
    message = refused(
        client.post("/v1/produce", json={"timeoutMs": 300_001, "batches": [one_batch()]}),
        "body.timeoutMs",
    )
    assert "300000" in message
    assert "MAX_TIMEOUT_MS" in message
    assert client.runtime.service.batches == []
    r = client.post("/v1/produce", json={"timeoutMs": 300_000, "batches": [one_batch()]})
    assert r.status_code == 200, r.text


def test_a_wait_above_max_pull_wait_ms_is_refused():
    r = Client(max_pull_wait_ms=60_000).post(
        "/v1/groups/g/members/m/pull", json={"maxRecords": 1, "waitMs": 60_001}
    )
    message = refused(r, "body.waitMs")
    assert "60000" in message
    assert "MAX_PULL_WAIT_MS" in message


def test_the_openapi_document_shows_the_settings_caps():
    doc = Client(max_timeout_ms=123_000, max_pull_wait_ms=45_000).get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    timeout = schemas["ProduceIn"]["properties"]["timeoutMs"]
    assert [k.get("maximum") for k in timeout["anyOf"] if k.get("type") == "integer"] == [123_000]
    assert schemas["PullIn"]["properties"]["waitMs"]["maximum"] == 45_000
