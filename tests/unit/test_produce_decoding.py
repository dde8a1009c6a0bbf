"""The produce body's one-pass decoder (msgspec, straight into KafkaBatch) against the
documented schema (the pydantic models and to_batch): it accepts nothing the schema
refuses, decodes what it accepts to the same batches, and ``decode`` as a whole gives
the schema's answer for every body: a 422, or batches with a per-batch 87 for bad
base64."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kop_dedup import errors
from kop_dedup.protocol.records import Header, KafkaBatch, KafkaRecord, rec
from kop_dedup.transports.http.models import ProduceIn, to_batch
from kop_dedup.transports.http.produce import InvalidBody, ProduceRequest, Refused, decode

# -- the record types as Python objects -------------------------------------------------


def test_record_types_construct_positionally_compare_by_value_and_hash():
    h = Header("h", None)
    r = KafkaRecord(b"k", b"v", (h,), 5)
    b = KafkaBatch("t", 1, 17, 2, 0, 0, (r,))
    assert (r.key, r.value, r.headers, r.timestamp) == (b"k", b"v", (h,), 5)
    assert (b.topic, b.partition, b.producer_id, b.producer_epoch) == ("t", 1, 17, 2)
    assert (b.base_sequence, b.last_sequence, b.records) == (0, 0, (r,))
    twin = KafkaBatch("t", 1, 17, 2, 0, 0, (KafkaRecord(b"k", b"v", (Header("h", None),), 5),))
    assert b == twin
    assert hash(b) == hash(twin)
    assert len({b, twin, rec(b"v")}) == 2
    assert KafkaRecord(None, None) == rec(None)  # a tombstone without a key
    assert (r.size, b.size, b.idempotent) == (3, 3, True)


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (Header("h", None), "value"),
        (rec(b"v"), "value"),
        (KafkaBatch("t", 0, -1, -1, -1, -1, ()), "topic"),
    ],
)
def test_record_types_are_immutable(obj, field):
    with pytest.raises(AttributeError):
        setattr(obj, field, None)


def test_a_record_needs_its_value_even_from_python():
    with pytest.raises(TypeError, match="value"):
        KafkaRecord(b"k")
    assert KafkaRecord(b"k", None).value is None


def test_a_batch_decodes_from_camel_case_json_with_base64_payloads():
    raw = (
        b'{"topic":"t","partition":0,"producerId":17,"producerEpoch":1,"baseSequence":0,'
        b'"lastSequence":1,"records":[{"value":"dg=="},'
        b'{"key":null,"value":null,"headers":[{"key":"h","value":"AAE="}],"timestamp":5}]}'
    )
    batch = msgspec.json.decode(raw, type=KafkaBatch)
    assert batch == KafkaBatch(
        "t", 0, 17, 1, 0, 1, (rec(b"v"), KafkaRecord(None, None, (Header("h", b"\0\1"),), 5))
    )
    for bad in (raw.replace(b'"dg=="}', b'"dg==","x":1}'), raw.replace(b'{"value":"dg=="}', b"{}")):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(bad, type=KafkaBatch)


# -- the decoder against the schema ----------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def reference(raw: bytes) -> Any:
    """The documented answer: "422", or (batches with "87" for a refused one, timeoutMs)."""
    try:
        body = ProduceIn.model_validate_json(raw)
    except ValidationError:
        return "422"
    out: list[Any] = []
    for b in body.batches:
        try:
            out.append(to_batch(b))
        except errors.InvalidRecord:
            out.append("87")
    return out, body.timeoutMs


def fast(raw: bytes) -> Any:
    try:
        body = msgspec.json.decode(raw, type=ProduceRequest)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return list(body.batches), body.timeoutMs


def whole(raw: bytes) -> Any:
    try:
        batches, timeout_ms, _ = decode(raw)
    except InvalidBody:
        return "422"
    return ["87" if isinstance(b, Refused) else b for b in batches], timeout_ms


# valid bodies, then at most one thing made wrong (or odd) by ``mutated``
payloads = st.none() | st.binary(max_size=12).map(b64)
odd_payloads = st.sampled_from(
    ["", "=", "QR==", "QQ", "QQ=", "Q===", "aGk=\n", " aGk=", "a-_b", "aGk=aGk=", "%%%"]
)
small = st.integers(min_value=-1, max_value=100)
edges = st.sampled_from([
    -(1 << 63) - 1, -(1 << 63), -(1 << 31) - 1, -(1 << 31), -(1 << 15) - 1, -(1 << 15),
    32767, 32768, (1 << 31) - 1, 1 << 31, (1 << 63) - 1, 1 << 63, 1 << 64,
])  # fmt: skip
json_scalars = (
    st.none()
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | odd_payloads
    | edges
    | small
)
headers = st.fixed_dictionaries({"key": st.text(max_size=4), "value": payloads})
records = st.fixed_dictionaries(
    {"value": payloads | payloads | odd_payloads},
    optional={
        "key": payloads,
        "headers": st.lists(headers, max_size=2),
        "timestamp": st.none() | small,
    },
)
batches = st.fixed_dictionaries(
    {
        "topic": st.sampled_from(["t", "orders", ""]) | st.text(max_size=6),
        "partition": small,
        "producerId": small,
        "producerEpoch": small,
        "baseSequence": small,
        "lastSequence": small,
        "records": st.lists(records, max_size=3),
    }
)
bodies = st.fixed_dictionaries(
    {"batches": st.lists(batches, min_size=1, max_size=3)},
    optional={"timeoutMs": st.none() | st.integers(min_value=1, max_value=3_600_000)},
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A body, maybe with one field dropped, replaced by any JSON value, or added."""
    body = draw(bodies)
    objects: list[dict[str, Any]] = [body]
    for b in body["batches"]:
        objects.append(b)
        for r in b["records"]:
            objects.append(r)
            objects.extend(r.get("headers", []))
    target = draw(st.sampled_from(objects))
    how = draw(st.sampled_from(["keep", "drop", "replace", "replace", "add"]))
    if how == "drop" and target:
        del target[draw(st.sampled_from(sorted(target)))]
    elif how == "replace" and target:
        target[draw(st.sampled_from(sorted(target)))] = draw(
            json_scalars | st.lists(json_scalars, max_size=2)
        )
    elif how == "add":
        target[draw(st.text(max_size=12))] = draw(json_scalars)
    return json.dumps(body, ensure_ascii=draw(st.booleans())).encode()


VALID = json.dumps(
    {
        "batches": [
            {
                "topic": "t",
                "partition": 0,
                "producerId": 1,
                "producerEpoch": 0,
                "baseSequence": 0,
                "lastSequence": 1,
                "records": [
                    {"value": b64(b"v")},
                    {
                        "key": None,
                        "value": None,
                        "headers": [{"key": "h", "value": "AAE="}],
                        "timestamp": 5,
                    },
                ],
            }
        ],
        "timeoutMs": 1000,
    }
).encode()


@given(raw=mutated())
@example(raw=VALID)
@example(raw=VALID.replace(b'"AAE="', b'"%%%"'))
@example(raw=VALID.replace(b'"topic": "t"', b'"topic": "\\ud800"'))
@example(raw=VALID.replace(b'"partition": 0', b'"partition": 0, "partition": 1'))
@example(raw=b"\xef\xbb\xbf" + VALID)
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_one_pass_decoder_accepts_only_what_the_schema_accepts_and_decodes_it_alike(raw):
    expected, got = reference(raw), fast(raw)
    if got is not None:
        assert got == expected  # nothing the schema refuses; the very same batches
    else:  # refused: the schema refuses it too, or it carries bad base64 (per-batch 87)
        assert expected == "422" or "87" in expected[0], expected
    assert whole(raw) == expected


@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
@settings(max_examples=200, deadline=None)
def test_garbage_is_422_for_both(raw):
    assert whole(raw) == reference(raw) == "422"


def test_a_valid_body_decodes_straight_into_kafka_batches():
    batches, timeout_ms, _ = decode(VALID)
    assert timeout_ms == 1000
    (batch,) = batches
    assert type(batch) is KafkaBatch
    assert batch == KafkaBatch(
        "t", 0, 1, 0, 0, 1, (rec(b"v"), KafkaRecord(None, None, (Header("h", b"\0\1"),), 5))
    )


def test_bad_base64_refuses_only_its_batch_and_says_where():
    doc = json.loads(VALID)
    good = doc["batches"][0]
    bad = {**good, "topic": "bad", "records": [{"value": "%%%"}]}
    doc["batches"] = [good, bad, good]
    batches, _, _ = decode(json.dumps(doc).encode())
    assert [type(b).__name__ for b in batches] == ["KafkaBatch", "Refused", "KafkaBatch"]
    refused = batches[1]
    assert isinstance(refused, Refused)
    assert (refused.topic, refused.records) == ("bad", 1)
    assert isinstance(refused.error, errors.InvalidRecord)
    assert "records[0].value" in refused.error.message


def _set(doc: dict[str, Any], where: str, field: str, value: Any) -> bytes:
    batch = doc["batches"][0]
    target = {"body": doc, "batch": batch, "record": batch["records"][1]}.get(where)
    if where == "header":
        target = batch["records"][1]["headers"][0]
    assert target is not None
    target[field] = value
    return json.dumps(doc).encode()


BOUNDS = [
    ("batch", "partition", -(1 << 31), (1 << 31) - 1),
    ("batch", "producerId", -(1 << 63), (1 << 63) - 1),
    ("batch", "producerEpoch", -(1 << 15), (1 << 15) - 1),
    ("batch", "baseSequence", -(1 << 31), (1 << 31) - 1),
    ("batch", "lastSequence", -(1 << 31), (1 << 31) - 1),
    ("record", "timestamp", -(1 << 63), (1 << 63) - 1),
    ("body", "timeoutMs", 1, (1 << 63) - 1),  # the decoders; the route caps it at MAX_TIMEOUT_MS
]


@pytest.mark.parametrize(("where", "field", "low", "high"), BOUNDS, ids=[b[1] for b in BOUNDS])
def test_integer_bounds_are_the_schemas(where, field, low, high):
    for value, accepted in ((low - 1, False), (low, True), (high, True), (high + 1, False)):
        raw = _set(json.loads(VALID), where, field, value)
        assert (fast(raw) is not None) is accepted, (field, value)
        assert (reference(raw) != "422") is accepted, (field, value)
        assert whole(raw) == reference(raw)


@pytest.mark.parametrize(
    ("where", "field", "limit"), [("batch", "topic", 1000), ("header", "key", 32_767)]
)
def test_string_lengths_are_the_schemas(where, field, limit):
    for length, accepted in ((limit, True), (limit + 1, False)):
        raw = _set(json.loads(VALID), where, field, "é" * length)  # characters, not bytes
        assert (fast(raw) is not None) is accepted, length
        assert whole(raw) == reference(raw)


def test_a_transaction_token_comes_with_its_transactional_id_on_both_decoders():
    good = json.loads(VALID)
    with_id = json.dumps({**good, "transactionalId": "app", "transactionToken": "t1"}).encode()
    _, _, txn = decode(with_id)
    assert txn is not None
    assert (txn.transactional_id, txn.token) == ("app", "t1")
    alone = json.dumps({**good, "transactionToken": "t1"}).encode()
    with pytest.raises(InvalidBody) as refused:
        decode(alone)
    assert refused.value.problems[0]["loc"] == ("body", "transactionToken")
    # the slow path (a body the fast decoder refuses) says the same
    slow = json.dumps({**good, "transactionToken": "t1", "timeoutMs": 1.5}).encode()
    with pytest.raises(InvalidBody):
        decode(slow)
    too_long = json.dumps({**good, "transactionalId": "app", "transactionToken": "x" * 257})
    with pytest.raises(InvalidBody):
        decode(too_long.encode())
