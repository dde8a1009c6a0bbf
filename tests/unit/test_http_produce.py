"""POST /v1/produce at the HTTP edge: what reaches the service, what the client is told.

The app runs in-process with a stub runtime (tests/unit/asgi.py); nothing here
publishes, so nothing here mocks Pulsar: the publishing path has its own tests.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from kop_dedup import errors
from tests.unit.asgi import Client, StubService


@pytest.fixture
def client() -> Client:
    return Client()


def service(client: Client) -> StubService:
    return client.runtime.service


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def one_batch(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "topic": "t",
        "partition": 0,
        "producerId": 17,
        "producerEpoch": 0,
        "baseSequence": 0,
        "lastSequence": 0,
        "records": [{"value": b64(b"v")}],
    }
    doc.update(over)
    return doc


REQUIRED_BATCH_FIELDS = [
    "topic",
    "partition",
    "producerId",
    "producerEpoch",
    "baseSequence",
    "lastSequence",
    "records",
]


@pytest.mark.parametrize("field", REQUIRED_BATCH_FIELDS)
def test_a_batch_without_a_required_field_is_a_422_naming_it(client, field):
    doc = one_batch()
    del doc[field]
    r = client.post("/v1/produce", json={"batches": [one_batch(), doc]})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == errors.InvalidRequest.name
    assert body["errorCode"] == errors.InvalidRequest.errno
    assert f"body.batches.1.{field}: Field required" in body["errorMessage"]
    assert {"loc": ["body", "batches", 1, field], "msg": "Field required", "type": "missing"} in (
        body["detail"]
    )
    assert service(client).batches == []  # nothing of the request reached the service


@pytest.mark.parametrize(
    ("records", "path"),
    [
        ([{"key": b64(b"k")}], "records.0.value"),
        ([{"value": None, "headers": [{"value": None}]}], "records.0.headers.0.key"),
        ([{"value": None, "headers": [{"key": "h"}]}], "records.0.headers.0.value"),
    ],
)
def test_a_record_or_header_without_a_required_field_is_a_422_naming_it(client, records, path):
    r = client.post("/v1/produce", json={"batches": [one_batch(records=records)]})
    assert r.status_code == 422, r.text
    assert f"body.batches.0.{path}: Field required" in r.json()["errorMessage"]
    assert service(client).batches == []


@pytest.mark.parametrize(
    ("where", "field"),
    [("batch", f) for f in REQUIRED_BATCH_FIELDS]
    + [("record", "headers"), ("header", "key"), ("request", "batches")],
)
def test_an_explicit_null_where_none_is_documented_is_a_422(client, where, field):
    body: dict[str, Any] = {"batches": [one_batch()]}
    record = body["batches"][0]["records"][0]
    if where == "batch":
        body["batches"][0][field] = None
    elif where == "record":
        record[field] = None
    elif where == "header":
        record["headers"] = [{"key": None, "value": None}]
    else:
        body[field] = None
    r = client.post("/v1/produce", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["errorMessage"]


@pytest.mark.parametrize("value", [True, 1.0, "1", [1]])
@pytest.mark.parametrize("field", ["partition", "producerId", "producerEpoch", "baseSequence"])
def test_a_mistyped_integer_is_a_422_not_coerced(client, field, value):
    r = client.post("/v1/produce", json={"batches": [one_batch(**{field: value})]})
    assert r.status_code == 422, r.text
    assert f"body.batches.0.{field}" in r.json()["errorMessage"]


def test_optional_record_fields_may_be_left_out_and_documented_nulls_are_kept(client):
    records = [
        {"value": b64(b"v")},  # no key, headers or timestamp
        {"key": None, "value": None, "headers": [{"key": "h", "value": None}], "timestamp": None},
        {"key": b64(b"k"), "value": b64(b""), "headers": [], "timestamp": 5},
    ]
    r = client.post("/v1/produce", json={"batches": [one_batch(records=records, lastSequence=2)]})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["errorCode"] == 0
    (batch,) = service(client).batches
    first, tombstone, last = batch.records
    assert (first.key, first.value, first.headers, first.timestamp) == (None, b"v", (), None)
    assert (tombstone.key, tombstone.value, tombstone.timestamp) == (None, None, None)
    assert [(h.key, h.value) for h in tombstone.headers] == [("h", None)]
    assert (last.key, last.value, last.timestamp) == (b"k", b"", 5)


def test_a_non_idempotent_batch_sends_minus_one_and_reaches_the_service_as_such(client):
    plain = one_batch(producerId=-1, producerEpoch=-1, baseSequence=-1, lastSequence=-1)
    assert client.post("/v1/produce", json={"batches": [plain]}).status_code == 200
    (batch,) = service(client).batches
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert batch.last_sequence == -1
    assert not batch.idempotent


def test_bad_base64_fails_only_its_own_batch_with_invalid_record(client):
    bad = one_batch(topic="bad", records=[{"value": "%%%"}])
    r = client.post("/v1/produce", json={"batches": [one_batch(), bad, one_batch(partition=1)]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["errorCode"] for x in results] == [0, errors.InvalidRecord.errno, 0]
    assert results[1]["error"] == errors.InvalidRecord.name
    assert "records[0].value is not valid base64" in results[1]["errorMessage"]
    assert results[1]["messageId"] is None
    assert [(b.topic, b.partition) for b in service(client).batches] == [("t", 0), ("t", 1)]
