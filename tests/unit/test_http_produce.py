"""POST /v1/produce at the HTTP edge: what reaches the service, what the client is told.

The app runs in-process with a stub runtime (tests/unit/asgi.py); nothing here
publishes, so nothing here mocks Pulsar: the publishing path has its own tests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kop_dedup import errors
from tests.helpers import one_batch
from tests.unit.asgi import Client, StubService


@pytest.fixture(params=["shortcut", "router"])
def client(request: pytest.FixtureRequest) -> Client:
    """Every test runs through the produce shortcut and through FastAPI's full path."""
    return Client(shortcut=request.param == "shortcut")


def service(client: Client) -> StubService:
    return client.runtime.service


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


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


# -- what still applies on the produce path: auth, body limit, byte budget, OpenAPI ----


@pytest.mark.parametrize("shortcut", [True, False], ids=["shortcut", "router"])
def test_produce_demands_a_bearer_token_when_tokens_are_configured(shortcut):
    client = Client(shortcut=shortcut, auth_tokens=["s3cret"])
    body = {"batches": [one_batch()]}
    missing = client.post("/v1/produce", json=body)
    assert missing.status_code == 401, missing.text
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json() == {"detail": "missing bearer token"}
    wrong = client.post("/v1/produce", json=body, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 403, wrong.text
    assert "invalid_token" in wrong.headers["www-authenticate"]
    assert service(client).batches == []
    good = client.post("/v1/produce", json=body, headers={"authorization": "Bearer s3cret"})
    assert good.status_code == 200, good.text
    assert len(service(client).batches) == 1


@pytest.mark.parametrize("shortcut", [True, False], ids=["shortcut", "router"])
def test_produce_bodies_over_the_limit_are_413_whether_sized_or_streamed(shortcut):
    client = Client(shortcut=shortcut, max_request_bytes=1024)
    raw = json.dumps({"batches": [one_batch(records=[{"value": b64(b"x" * 2000)}])]}).encode()
    sized = client.post("/v1/produce", content=raw)
    assert sized.status_code == 413, sized.text
    assert "KOP_DEDUP_MAX_REQUEST_BYTES" in sized.json()["errorMessage"]

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: chunked
        for i in range(0, len(raw), 500):
            yield raw[i : i + 500]

    streamed = client.post("/v1/produce", content=chunks())
    assert streamed.status_code == 413, streamed.text
    assert service(client).batches == []
    assert client.app.state.admission.in_use == 0


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0)


@pytest.mark.parametrize("shortcut", [True, False], ids=["shortcut", "router"])
def test_a_produce_body_holds_its_size_in_the_budget_from_its_read_until_its_answer(shortcut):
    client = Client(shortcut=shortcut, max_inflight_bytes=1024)
    budget = client.app.state.admission

    def body(topic: str) -> bytes:
        doc = {"batches": [one_batch(topic=topic, records=[{"value": b64(b"x" * 300)}])]}
        return json.dumps(doc).encode()

    first, second = body("first"), body("second")
    assert max(len(first), len(second)) <= 1024 < len(first) + len(second)

    async def scenario() -> None:
        client.runtime.service.gate = gate = asyncio.Event()
        one = asyncio.create_task(client.arequest("POST", "/v1/produce", content=first))
        await _until(lambda: len(service(client).batches) == 1)
        assert budget.in_use == len(first)  # held while the service works on it
        two = asyncio.create_task(client.arequest("POST", "/v1/produce", content=second))
        await _until(lambda: budget.waiting == 1)
        assert [b.topic for b in service(client).batches] == ["first"]  # two waits for room
        gate.set()
        answers = [await one, await two]
        assert [a.status_code for a in answers] == [200, 200]
        assert [b.topic for b in service(client).batches] == ["first", "second"]
        assert (budget.in_use, budget.waiting) == (0, 0)

    asyncio.run(scenario())


def test_produce_while_the_sidecar_is_starting_is_503():
    client = Client()
    del client.app.state.runtime
    r = client.post("/v1/produce", json={"batches": [one_batch()]})
    assert r.status_code == 503, r.text
    assert r.json() == {"detail": "the sidecar is starting"}


def test_produce_is_documented_in_the_served_openapi_with_its_models_and_answers():
    doc = Client().get("/openapi.json").json()
    op = doc["paths"]["/v1/produce"]["post"]
    schemas = doc["components"]["schemas"]
    body_ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    answer_ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert (body_ref, answer_ref) == (
        "#/components/schemas/ProduceIn",
        "#/components/schemas/ProduceOut",
    )
    assert {"ProduceIn", "BatchIn", "RecordIn", "HeaderIn", "ProduceOut", "BatchOut"} <= set(
        schemas
    )
    assert set(op["responses"]) == {"200", "401", "403", "413", "422", "503"}
    assert set(schemas["BatchIn"]["required"]) == set(REQUIRED_BATCH_FIELDS)
    assert schemas["RecordIn"]["required"] == ["value"]
    assert str(errors.InvalidRequest.errno) in op["responses"]["422"]["description"]


def test_other_methods_on_produce_are_405():
    assert Client().get("/v1/produce").status_code == 405
