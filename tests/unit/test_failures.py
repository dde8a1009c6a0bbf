"""The one translation of Pulsar, admin API and transport failures into Kafka errors."""

from __future__ import annotations

import _pulsar
import httpx
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup import errors
from kop_dedup.pulsar.admin import AdminError
from kop_dedup.pulsar.failures import SendFailed, translate

R = _pulsar.Result


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (R.Timeout, errors.RequestTimedOut),
        (R.ProducerBusy, errors.NotLeaderOrFollower),
        (R.ProducerQueueIsFull, errors.NotLeaderOrFollower),
        (R.ConnectError, errors.NotLeaderOrFollower),
        (R.TopicNotFound, errors.UnknownTopicOrPartition),
        (R.MessageTooBig, errors.MessageTooLarge),
        (R.AuthorizationError, errors.TopicAuthorizationFailed),
        (R.UnknownError, errors.KafkaStorageError),
    ],
)
def test_every_form_of_a_pulsar_result_translates_the_same(result, expected):
    """A Result from a callback, a failed send, the asyncio client's exception and the
    synchronous client's exception class all give the same Kafka error."""
    forms = [result, SendFailed(result), pulsar_async.PulsarException(result)]
    sync_class = getattr(_pulsar, result.name, None)
    if isinstance(sync_class, type) and issubclass(sync_class, _pulsar.PulsarException):
        forms.append(sync_class("detail"))
    for form in forms:
        assert type(translate(form, "publish")) is expected, form


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (404, errors.UnknownTopicOrPartition),
        (403, errors.TopicAuthorizationFailed),
        (401, errors.TopicAuthorizationFailed),
        (409, errors.KafkaStorageError),
        (500, errors.KafkaStorageError),
        (503, errors.KafkaStorageError),
    ],
)
def test_admin_api_answers_translate_by_status(status, expected, caplog):
    error = translate(AdminError(status, "reason from the broker"), "looking up partitions")
    assert type(error) is expected
    assert str(status) in error.message
    # Pulsar's own text is logged for the operator, never answered to a client
    assert "reason from the broker" not in error.message
    assert "reason from the broker" in caplog.text


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (httpx.ConnectError("refused"), errors.NotLeaderOrFollower),
        (httpx.ReadTimeout("slow"), errors.RequestTimedOut),
        (TimeoutError(), errors.RequestTimedOut),
        (ConnectionResetError("reset"), errors.NotLeaderOrFollower),
        (RuntimeError("surprise"), errors.KafkaStorageError),
    ],
)
def test_transport_failures_are_retriable_and_say_what_failed(failure, expected):
    error = translate(failure, "reading the producer epochs")
    assert type(error) is expected
    assert error.retriable
    assert error.message.startswith("reading the producer epochs")


def test_kafka_errors_pass_through_unchanged():
    original = errors.InvalidProducerEpoch("fenced")
    assert translate(original, "produce") is original
