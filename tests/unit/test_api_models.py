from __future__ import annotations

import pytest
from pydantic import ValidationError

from kop_dedup import errors
from kop_dedup.errors import InvalidRecord
from kop_dedup.observability.stats import Stats, outcome_for
from kop_dedup.transports.http.models import BatchIn, ProduceIn, to_batch


def batch_json(**over):
    doc = {
        "topic": "t",
        "partition": 0,
        "producerId": 1,
        "producerEpoch": 0,
        "baseSequence": 0,
        "lastSequence": 0,
        "records": [
            {
                "key": "aw==",
                "value": "dg==",
                "headers": [{"key": "h", "value": None}],
                "timestamp": 5,
            }
        ],
    }
    doc.update(over)
    return doc


def test_to_batch_decodes_base64():
    b = to_batch(BatchIn.model_validate(batch_json()))
    assert b.records[0].key == b"k"
    assert b.records[0].value == b"v"
    assert b.records[0].headers[0].value is None


def test_non_base64_payload_is_invalid_record():
    with pytest.raises(InvalidRecord, match=r"records\[0\]\.value"):
        to_batch(BatchIn.model_validate(batch_json(records=[{"value": "!!notb64"}])))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("producerId", 1 << 63),
        ("partition", 1 << 31),
        ("producerEpoch", 1 << 15),
        ("baseSequence", "x"),
    ],
)
def test_overflowing_or_mistyped_fields_fail_validation(field, value):
    with pytest.raises(ValidationError):
        BatchIn.model_validate(batch_json(**{field: value}))


def test_unknown_fields_and_empty_batch_list_are_refused():
    with pytest.raises(ValidationError):
        BatchIn.model_validate(batch_json(surprise=1))
    with pytest.raises(ValidationError):
        ProduceIn.model_validate({"batches": []})


def test_stats_count_outcomes_and_render_prometheus():
    stats = Stats()
    stats.record("t", 1, 0, None, 3, 0.002)
    stats.record("t", 1, 0, errors.DuplicateSequenceNumber(), 3, 0.001)
    stats.record("t", -1, -1, errors.RequestTimedOut(), 1, 0.5)
    assert stats.total.batches["accepted"] == 1
    assert stats.by_producer[1].records["duplicate"] == 3
    assert -1 not in stats.by_producer
    text = stats.prometheus({"open_producers": 2})
    assert 'kop_dedup_batches_total{topic="t",outcome="failed"} 1' in text
    assert "kop_dedup_batch_latency_seconds_count 3" in text
    assert outcome_for(47) == "fenced"
