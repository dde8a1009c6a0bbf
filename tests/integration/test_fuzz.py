"""Bad input: the served OpenAPI fuzzed by schemathesis, hypothesis over every field and
over whole bodies, and hand-picked extremes. Never a 5xx, never a hang, every answer in
the documented shape, and the records a control producer wrote before stay exactly as
they were.

Generated requests carry arbitrary producer ids and epochs, and an epoch seen once
fences that producer id on every partition (the registry is global per system
namespace), so the generators run against their own sidecar with their own data and
system namespaces: they cannot fence a producer id another test is handed later. The
hand-picked cases use producer ids of their own from the session's shared sidecar.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pulsar as pulsar_client
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    use_after_free,
)

from kop_dedup.protocol.records import SEQ_MODULUS
from tests.fuzz_checks import (
    TIMEOUT,
    Control,
    assert_produce_answer,
    code_name,
)
from tests.helpers import b64, batch, new_pid, read_all, uniq
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

FUZZ_NAMESPACE = "kafka-fuzz"

# -- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    """A sidecar for generated producer ids: its own namespaces, a short reorder window
    (a generated batch ahead of a gap answers 45 after 300 ms) and a 5 s default timeout."""
    with ThreadSidecar(
        pulsar,
        namespace=FUZZ_NAMESPACE,
        system_namespace="kop-dedup-fuzz-system",
        reorder_window_ms=300,
        default_timeout_ms=5000,
    ) as sc:
        yield sc


@pytest.fixture
def fuzz_api(fuzz_sidecar: ThreadSidecar) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_sidecar.url, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture(scope="module")
def controls(sidecar: ThreadSidecar, fuzz_sidecar: ThreadSidecar) -> tuple[Control, ...]:
    return (
        Control.write(sidecar.url, "kafka"),
        Control.write(fuzz_sidecar.url, FUZZ_NAMESPACE),
    )


@pytest.fixture
def intact(controls: tuple[Control, ...], pulsar_reader_client: pulsar_client.Client) -> Any:
    """Checks after the test that every control producer's records are intact."""
    yield
    for control in controls:
        control.assert_intact(pulsar_reader_client)


# -- schemathesis over the served OpenAPI ----------------------------------------------


def served_schema(url: str) -> Any:
    """The served OpenAPI, with the 422 that /v1/produce answers but does not document
    added (see test_produce_documents_its_422), so every other check still applies."""
    raw = httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json()
    responses = raw["paths"]["/v1/produce"]["post"]["responses"]
    responses.setdefault("422", {"description": "not the documented shape", **_JSON_OBJECT})
    # and the 400 init-producer-id answers for a body that is not UTF-8
    # (see test_init_producer_id_answers_an_undecodable_body_in_the_house_shape)
    responses = raw["paths"]["/v1/init-producer-id"]["post"]["responses"]
    responses.setdefault("400", {"description": "body not decodable", **_JSON_OBJECT})
    return schemathesis.openapi.from_dict(raw)


_JSON_OBJECT = {"content": {"application/json": {"schema": {"type": "object"}}}}


def fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    examples: int,
    url: str,
    headers: dict[str, str] | None = None,
) -> int:
    """Run schemathesis' checks on ``examples`` generated cases (sent with ``headers``);
    how many were sent."""
    excluded = [positive_data_acceptance, negative_data_rejection, use_after_free]
    sent = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: Any) -> None:
        nonlocal sent
        response = case.call_and_validate(
            base_url=url, headers=headers, timeout=15, excluded_checks=excluded
        )
        assert response.status_code < 500
        sent += 1

    try:
        call()
    except Unsatisfiable:  # nothing to negate (an operation with no parameters or body)
        assert mode is GenerationMode.NEGATIVE, operation.label
    return sent


@pytest.mark.usefixtures("intact")
def test_served_openapi_fuzzed_never_answers_5xx_and_conforms(fuzz_sidecar):
    """Every operation, valid data then invalid data, through schemathesis' own checks
    (no 5xx; status code, content type, headers and body as documented). Excluded: its
    acceptance checks, since per-batch problems are a 200 with a Kafka code by design and
    the stats lookups answer 404 for names nobody produced to; and use-after-free, which
    assumes REST resources."""
    schema = served_schema(fuzz_sidecar.url)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8, [op.label for op in operations]
    budget = {"POST /v1/produce": (30, 20)}  # (valid, invalid) examples; the rest 8, 6
    sent = {
        f"{op.label} {mode.value}": fuzz_operation(op, mode, examples, fuzz_sidecar.url)
        for op in operations
        for mode, examples in zip(
            (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
            budget.get(op.label, (8, 6)),
            strict=True,
        )
    }
    print(f"\nschemathesis: {sum(sent.values())} requests: {json.dumps(sent)}")
    assert sum(sent.values()) >= 100


FUZZ_TOKEN = "fuzz-bearer-token"


@pytest.fixture(scope="module")
def auth_fuzz_sidecar(pulsar: Any) -> Iterator[ThreadSidecar]:
    """As ``fuzz_sidecar``, with authentication on (a bearer token)."""
    with ThreadSidecar(
        pulsar,
        namespace=uniq("kafka-fuzz-auth"),
        system_namespace=uniq("sys"),
        reorder_window_ms=300,
        default_timeout_ms=5000,
        auth_tokens=[FUZZ_TOKEN],
    ) as sc:
        yield sc


def test_served_openapi_fuzzed_with_authentication_on(auth_fuzz_sidecar):
    """With tokens: every operation fuzzed with the token as before (fewer examples);
    without a token (401), or with a wrong one (403), every ``/v1`` operation is
    refused whatever it is sent (nothing decoded, nothing done) and the open ones never
    answer a 5xx."""
    url = auth_fuzz_sidecar.url
    schema = served_schema(url)
    operations = [result.ok() for result in schema.get_all_operations()]
    good = {"Authorization": f"Bearer {FUZZ_TOKEN}"}
    started = time.monotonic()
    sent = sum(
        fuzz_operation(op, mode, examples, url, headers=good)
        for op in operations
        for mode, examples in ((GenerationMode.POSITIVE, 3), (GenerationMode.NEGATIVE, 2))
    )
    assert sent >= 30
    fuzzed_s = time.monotonic() - started
    refused = 0

    def unauthenticated(op: Any, headers: dict[str, str]) -> None:
        @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
        @settings(
            max_examples=2,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case: Any) -> None:
            nonlocal refused
            response = case.call(base_url=url, headers=headers, timeout=15)
            if case.path.startswith(("/v1/", "/metrics")):
                assert response.status_code in (401, 403), (case.path, response.text)
                refused += 1
            else:
                assert response.status_code < 500, (case.path, response.text)

        call()

    for op in operations:
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            unauthenticated(op, headers)
    assert refused >= 20
    print(f"\nwith the token: {sent} requests in {fuzzed_s:.1f} s; without: {refused} refused")


def test_produce_documents_its_422(sidecar):
    raw = httpx.get(f"{sidecar.url}/openapi.json", timeout=TIMEOUT).json()
    assert "422" in raw["paths"]["/v1/produce"]["post"]["responses"]


# -- hypothesis: any value in any field, any body ---------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
INT_EDGES = [-(2**63) - 1, -(2**63), -(2**31) - 1, -5, -1, 0, 1, 32767, 32768]
edge_integers = st.sampled_from([*INT_EDGES, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 10**30])
field_values = (
    edge_integers
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.text(max_size=12)
    | st.none()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_values
)
BATCH_FIELDS = ["topic", "partition", "producerId", "producerEpoch", "baseSequence"]
batch_fields = st.sampled_from([*BATCH_FIELDS, "lastSequence", "records", "extra"])
record_fields = st.sampled_from(["key", "value", "headers", "timestamp", "extra"])


@pytest.fixture(scope="module")
def fuzz_pid(fuzz_sidecar: ThreadSidecar) -> int:
    with httpx.Client(base_url=fuzz_sidecar.url, timeout=TIMEOUT) as api:
        return new_pid(api)


@pytest.mark.usefixtures("intact")
@given(
    where=st.sampled_from(["batch", "record", "request"]),
    field=batch_fields,
    rfield=record_fields,
    value=field_values,
)
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_any_value_in_any_field_is_a_4xx_or_a_kafka_code(
    fuzz_api, fuzz_pid, where, field, rfield, value
):
    body: dict[str, Any] = {"batches": [batch(uniq("fz"), fuzz_pid, 0, 2)], "timeoutMs": 3000}
    if where == "batch":
        body["batches"][0][field] = value
    elif where == "record":
        body["batches"][0]["records"][1][rfield] = value
    else:
        body["timeoutMs" if field == "topic" else field] = value
    timeout = body.get("timeoutMs")
    short = type(timeout) is int and timeout < 1000  # may well run out: 7, retriable
    assert_produce_answer(
        fuzz_api.post("/v1/produce", json=body), also=frozenset({7} if short else ())
    )


@pytest.mark.usefixtures("intact")
@given(
    raw=st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | json_values.map(lambda v: json.dumps(v).encode())
)
@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_garbage_bodies_are_a_422_with_a_reason(fuzz_api, raw):
    for path in ("/v1/produce", "/v1/init-producer-id"):
        r = fuzz_api.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code < 500, r.text
        if path == "/v1/produce":
            assert_produce_answer(r, batches=len(r.json().get("results", [])))
        elif r.status_code != 200:
            assert r.status_code == 422, r.text
            assert r.json()["errorMessage"]


def test_init_producer_id_answers_an_undecodable_body_in_the_house_shape(api):
    r = api.post(
        "/v1/init-producer-id", content=b"\x80", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert r.json()["errorMessage"]


# -- hand-picked extremes ---------------------------------------------------------------


@pytest.mark.usefixtures("intact")
@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        pytest.param(lambda b: b.update(records=[]), 87, id="zero-records"),
        pytest.param(lambda b: b.update(baseSequence=-1, lastSequence=-1), 87, id="seq-minus-1"),
        pytest.param(lambda b: b.update(producerId=-5), 87, id="pid-minus-5"),
        pytest.param(lambda b: b.update(producerEpoch=-1), 87, id="epoch-minus-1"),
        pytest.param(lambda b: b.update(lastSequence=b["baseSequence"] + 3), 87, id="last-off"),
        pytest.param(lambda b: b.update(topic="bad topic!"), 17, id="topic-chars"),
        pytest.param(lambda b: b.update(topic="x-partition-1"), 17, id="topic-partition-suffix"),
        pytest.param(lambda b: b.update(topic=""), 17, id="topic-empty"),
        pytest.param(lambda b: b.update(topic="a" * 250), 17, id="topic-too-long"),
        pytest.param(lambda b: b.update(partition=-1), 3, id="partition-negative"),
        pytest.param(lambda b: b.update(partition=99), 3, id="partition-out-of-range"),
        pytest.param(lambda b: b["records"][0].update(value="###"), 87, id="value-not-base64"),
        pytest.param(lambda b: b["records"][0].update(key="a=b"), 87, id="key-not-base64"),
        pytest.param(
            lambda b: b["records"][0].update(headers=[{"key": "h", "value": "*"}]),
            87,
            id="header-not-base64",
        ),
        pytest.param(
            lambda b: b.update(records=[{"value": b64("x")}] * 10_001, lastSequence=10_000),
            10,
            id="10001-records",
        ),
    ],
)
def test_bad_batches_get_their_kafka_code_and_store_nothing(
    api, pulsar_reader_client, mutate, code
):
    body = batch(uniq("bad"), new_pid(api), 0, 1)
    mutate(body)
    r = api.post("/v1/produce", json={"batches": [body]}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert result["errorCode"] == code, result
    assert result["error"] == code_name(code)
    assert result["errorMessage"]
    assert result["messageId"] is None
    if code in (10, 87):  # the topic is valid: it must hold nothing
        assert not read_all(
            pulsar_reader_client, f"persistent://public/kafka/{body['topic']}-partition-0"
        )


@pytest.mark.usefixtures("intact")
@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"batches": []}, id="no-batches"),
        pytest.param({"batches": [{"topic": "t"}]}, id="missing-fields"),
        pytest.param({"batches": [batch("t", 1 << 63, 0, 1)]}, id="pid-int64-overflow"),
        pytest.param({"batches": [batch("t", -(1 << 63) - 1, 0, 1)]}, id="pid-int64-underflow"),
        pytest.param({"batches": [batch("t", 1, SEQ_MODULUS, 1)]}, id="seq-int32-overflow"),
        pytest.param({"batches": [batch("t", 1, 0, 1, partition=1 << 31)]}, id="partition-int32"),
        pytest.param({"batches": [batch("t", 1, 0, 1, epoch=32768)]}, id="epoch-int16-overflow"),
        pytest.param({"batches": [batch("t", 1, 0, 1)], "timeoutMs": 0}, id="timeout-zero"),
        pytest.param({"batches": [batch("t", 1, 0, 1)], "timeoutMs": "soon"}, id="timeout-text"),
        pytest.param({"batches": [batch("t", 1, 0, 1) | {"extra": 1}]}, id="unknown-field"),
        pytest.param({"batches": "nope"}, id="batches-not-a-list"),
        pytest.param([], id="not-an-object"),
    ],
)
def test_malformed_requests_are_422_with_a_reason(api, body):
    r = api.post("/v1/produce", json=body, timeout=TIMEOUT)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "INVALID_REQUEST"
    assert r.json()["errorMessage"]


@pytest.mark.usefixtures("intact")
@pytest.mark.parametrize(
    "raw", [b"", b"{", b'{"batches": [', b"\xff\xfe", b"null", b"1e999"], ids=repr
)
def test_broken_json_is_422(api, raw):
    r = api.post(
        "/v1/produce", content=raw, headers={"content-type": "application/json"}, timeout=TIMEOUT
    )
    assert r.status_code == 422, r.text
    assert r.json()["errorMessage"]


@pytest.mark.usefixtures("intact")
def test_bodies_over_the_limit_are_413_whether_sized_or_streamed(pulsar):
    with (
        ThreadSidecar(pulsar, max_request_bytes=4096) as sc,
        httpx.Client(base_url=sc.url, timeout=TIMEOUT) as small,
    ):
        body = {"batches": [batch(uniq(), 1, 0, 1) | {"records": [{"value": b64("x" * 8000)}]}]}
        r = small.post("/v1/produce", json=body)
        assert r.status_code == 413, r.text
        assert "KOP_DEDUP_MAX_REQUEST_BYTES" in r.json()["errorMessage"]
        raw = json.dumps(body).encode()
        chunks = (raw[i : i + 1000] for i in range(0, len(raw), 1000))  # no content-length
        r = small.post("/v1/produce", content=chunks, headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        r = small.post("/v1/init-producer-id", content=b"{" + b" " * 5000 + b"}")
        assert r.status_code == 413, r.text
        assert small.get("/healthz").status_code == 200  # and it still serves


@pytest.mark.usefixtures("intact")
def test_top_epoch_is_accepted_and_sequences_wrap_from_2147483647_to_0(api, pulsar_reader_client):
    topic, pid, top = uniq("wrap"), new_pid(api), SEQ_MODULUS - 1
    results = [
        api.post("/v1/produce", json={"batches": [b]}).json()["results"][0]
        for b in (
            batch(topic, pid, top - 1, 2, epoch=32767),  # ..2147483647
            batch(topic, pid, 0, 2, epoch=32767),  # wrapped: 0, 1
            batch(topic, pid, 0, 2, epoch=32767),  # its retry
            batch(topic, pid, 2, 1, epoch=32766),  # a lower epoch: fenced
        )
    ]
    assert [r["errorCode"] for r in results] == [0, 0, 46, 47], [
        (r["errorCode"], r["errorMessage"]) for r in results
    ]
    msgs = read_all(pulsar_reader_client, f"persistent://public/kafka/{topic}-partition-0")
    assert [m.properties()["kafka.sequence"] for m in msgs] == [str(top - 1), str(top), "0", "1"]


# -- a producer that started above 0 ---------------------------------------------------


def test_batch_below_a_fresh_start_that_was_never_stored_is_not_answered_duplicate(
    api, pulsar_reader_client
):
    topic, pid = uniq("below"), new_pid(api)
    first = api.post("/v1/produce", json={"batches": [batch(topic, pid, 3, 3)]})
    assert first.json()["results"][0]["errorCode"] == 0  # after the reorder window
    late = api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 3)]})
    stored = read_all(pulsar_reader_client, f"persistent://public/kafka/{topic}-partition-0")
    assert [m.data().decode() for m in stored] == [f"{pid}:0:{i}" for i in (3, 4, 5)]
    answer = late.json()["results"][0]
    # below where the producer started nothing was ever stored: out of order, not a
    # duplicate (a 46 would tell the client its records are stored)
    assert answer["errorCode"] == 45, answer
    assert "never stored" in answer["errorMessage"], answer
