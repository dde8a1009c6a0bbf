"""Bad input: fuzzing the served OpenAPI and hand-picked extremes. Never a 5xx, never a hang,
and nothing accepted before is disturbed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    use_after_free,
)

from tests.helpers import b64, batch, new_pid, read_all, uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


@pytest.fixture(scope="module")
def control(sidecar) -> dict[str, Any]:
    """A producer whose records must come through every fuzz test intact."""
    with httpx.Client(base_url=sidecar.url, timeout=30) as api:
        topic, pid = uniq("control"), new_pid(api)
        r = api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 5)]})
    assert r.json()["results"][0]["errorCode"] == 0
    return {"topic": topic, "pid": pid}


def assert_control_intact(pulsar_reader_client, control: dict[str, Any]) -> None:
    msgs = read_all(pulsar_reader_client, f"{NS}/{control['topic']}-partition-0", expect=5)
    assert [m.data().decode() for m in msgs] == [f"{control['pid']}:0:{i}" for i in range(5)]


def test_no_endpoint_answers_5xx_or_breaks_its_schema(sidecar):
    """Schemathesis generates requests from the served OpenAPI; every answer must be a
    non-5xx that conforms to the spec. (Its pytest plugin does not run under this pytest,
    so its strategies drive a plain hypothesis test.) The positive/negative acceptance
    checks are off: per-batch problems are 200 with a Kafka code by design."""
    api_schema = schemathesis.openapi.from_url(f"{sidecar.url}/openapi.json")
    excluded = [positive_data_acceptance, negative_data_rejection, use_after_free]
    operations = [op.ok() for op in api_schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=20,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def call(case):
            response = case.call_and_validate(
                base_url=sidecar.url, timeout=30, excluded_checks=excluded
            )
            assert response.status_code < 500

        call()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
field_values = st.one_of(
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from([-1, 0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 32767, 32768]),
    st.text(max_size=10),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
)


@given(
    field=st.sampled_from(
        [
            "topic",
            "partition",
            "producerId",
            "producerEpoch",
            "baseSequence",
            "lastSequence",
            "records",
        ]
    ),
    value=field_values | json_values,
)
@settings(
    max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
def test_any_field_with_any_value_is_a_4xx_or_a_kafka_code(api, field, value):
    body = batch(uniq("fz"), 7, 0, 1)
    body[field] = value
    r = api.post("/v1/produce", json={"batches": [body], "timeoutMs": 3000}, timeout=30)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        assert r.json()["results"][0]["errorCode"] in {0, 3, 17, 45, 46, 47, 87, 10, 42}


@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_garbage_bodies_get_a_4xx(api, raw):
    r = api.post("/v1/produce", content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (200, 422), r.text  # 200 only if the garbage was a valid request
    if r.status_code == 422:
        assert r.json()["errorMessage"]


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda b: b.update(records=[]), 87),
        (lambda b: b.update(baseSequence=-1, lastSequence=-1), 87),
        (lambda b: b.update(producerId=-5), 87),
        (lambda b: b.update(producerEpoch=-1), 87),
        (lambda b: b.update(lastSequence=b["baseSequence"] + 3), 87),
        (lambda b: b.update(topic="bad topic!"), 17),
        (lambda b: b.update(topic="x-partition-1"), 17),
        (lambda b: b.update(topic="a" * 250), 17),
        (lambda b: b.update(partition=-1), 3),
        (lambda b: b.update(partition=99), 3),
        (lambda b: b["records"][0].update(value="###"), 87),
        (lambda b: b["records"][0].update(headers=[{"key": "h", "value": "*"}]), 87),
        (lambda b: b.update(records=[{"value": b64("x")}] * 10_001, lastSequence=10_000), 10),
    ],
    ids=[
        "empty",
        "negative-seq",
        "pid-minus-5",
        "epoch-minus-1",
        "last-mismatch",
        "topic-chars",
        "topic-partition-suffix",
        "topic-too-long",
        "partition-negative",
        "partition-range",
        "value-not-base64",
        "header-not-base64",
        "too-many-records",
    ],
)
def test_bad_batches_get_their_kafka_code(api, pulsar_reader_client, control, mutate, code):
    body = batch(uniq("bad"), new_pid(api), 0, 1)
    mutate(body)
    r = api.post("/v1/produce", json={"batches": [body]}, timeout=30)
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert result["errorCode"] == code, result
    assert result["errorMessage"]
    assert_control_intact(pulsar_reader_client, control)


@pytest.mark.parametrize(
    "body",
    [
        {"batches": []},
        {"batches": [{"topic": "t"}]},
        {"batches": [batch("t", 1 << 63, 0, 1)]},
        {"batches": [batch("t", 1, 1 << 31, 1)]},
        {"batches": [batch("t", 1, 0, 1, epoch=32768)]},
        {"batches": [batch("t", 1, 0, 1)], "timeoutMs": 0},
        {"batches": "nope"},
        [],
    ],
    ids=[
        "no-batches",
        "missing-fields",
        "pid-overflow",
        "seq-overflow",
        "epoch-overflow",
        "timeout-zero",
        "batches-not-list",
        "not-an-object",
    ],
)
def test_malformed_requests_are_422_with_a_reason(api, body):
    r = api.post("/v1/produce", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "INVALID_REQUEST"
    assert r.json()["errorMessage"]


def test_huge_bodies_are_413_and_the_limit_is_configurable(pulsar, pulsar_reader_client, control):
    with (
        ThreadSidecar(pulsar, max_request_bytes=4096) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as small,
    ):
        body = {"batches": [batch(uniq(), 1, 0, 1) | {"records": [{"value": b64("x" * 8000)}]}]}
        r = small.post("/v1/produce", json=body)
        assert r.status_code == 413
        assert "KOP_DEDUP_MAX_REQUEST_BYTES" in r.json()["errorMessage"]
        # streamed without a length: still refused once it passes the limit
        chunks = (json.dumps(body).encode()[i : i + 1000] for i in range(0, 9000, 1000))
        r = small.post("/v1/produce", content=chunks, headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert small.get("/healthz").status_code == 200
    assert_control_intact(pulsar_reader_client, control)


def test_epoch_and_sequence_extremes(api, pulsar_reader_client, control):
    topic, pid = uniq(), new_pid(api)
    top = 2**31 - 1
    r = api.post("/v1/produce", json={"batches": [batch(topic, pid, top, 1, epoch=32767)]})
    assert r.json()["results"][0]["errorCode"] == 0
    r = api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 1, epoch=32767)]})
    assert r.json()["results"][0]["errorCode"] == 0  # wrapped to 0
    r = api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 1, epoch=32766)]})
    assert r.json()["results"][0]["errorCode"] == 47
    assert_control_intact(pulsar_reader_client, control)
