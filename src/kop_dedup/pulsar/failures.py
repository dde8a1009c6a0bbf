"""The one translation of Pulsar failures into Kafka errors.

Everything that can fail below the produce path ends here: a ``_pulsar.Result`` from a
send callback, the client's exceptions (``pulsar.asyncio.PulsarException`` carries a
Result; the synchronous API raises one ``_pulsar`` class per Result), the admin API's
:class:`~kop_dedup.pulsar.admin.AdminError` and httpx's transport errors, timeouts and
OS errors. Matching is by Result member and by class, never by name. What is not
listed becomes KAFKA_STORAGE_ERROR (56, retriable): a client retries rather than
losing data, and the retry is safe.

>>> translate(TimeoutError(), "publish").errno
7
"""

from __future__ import annotations

import asyncio
import logging

import _pulsar
import httpx
import pulsar.asyncio as pulsar_async

from kop_dedup import errors
from kop_dedup.pulsar.admin import AdminError

__all__ = ["SendFailed", "translate"]

log = logging.getLogger(__name__)

R = _pulsar.Result

# (Result, the synchronous API's exception class, the Kafka error), one row per Result
_ROWS: tuple[tuple[_pulsar.Result, type[Exception], type[errors.KafkaError]], ...] = (
    (R.Timeout, _pulsar.Timeout, errors.RequestTimedOut),
    # the name is held elsewhere, or the connection or lookup is not there yet: retriable
    (R.ProducerBusy, _pulsar.ProducerBusy, errors.NotLeaderOrFollower),
    (R.ProducerFenced, _pulsar.ProducerFenced, errors.NotLeaderOrFollower),
    (R.AlreadyClosed, _pulsar.AlreadyClosed, errors.NotLeaderOrFollower),
    (R.ProducerNotInitialized, _pulsar.ProducerNotInitialized, errors.NotLeaderOrFollower),
    (R.NotConnected, _pulsar.NotConnected, errors.NotLeaderOrFollower),
    (R.ConnectError, _pulsar.ConnectError, errors.NotLeaderOrFollower),
    (R.ReadError, _pulsar.ReadError, errors.NotLeaderOrFollower),
    (R.LookupError, _pulsar.LookupError, errors.NotLeaderOrFollower),
    (R.ServiceUnitNotReady, _pulsar.ServiceUnitNotReady, errors.NotLeaderOrFollower),
    (
        R.TooManyLookupRequestException,
        _pulsar.TooManyLookupRequestException,
        errors.NotLeaderOrFollower,
    ),
    (R.BrokerMetadataError, _pulsar.BrokerMetadataError, errors.NotLeaderOrFollower),
    (R.BrokerPersistenceError, _pulsar.BrokerPersistenceError, errors.NotLeaderOrFollower),
    (R.Interrupted, _pulsar.Interrupted, errors.NotLeaderOrFollower),
    (R.ProducerQueueIsFull, _pulsar.ProducerQueueIsFull, errors.NotLeaderOrFollower),
    (R.MemoryBufferIsFull, _pulsar.MemoryBufferIsFull, errors.NotLeaderOrFollower),
    (
        R.ProducerBlockedQuotaExceededError,
        _pulsar.ProducerBlockedQuotaExceededError,
        errors.NotLeaderOrFollower,
    ),
    (
        R.ProducerBlockedQuotaExceededException,
        _pulsar.ProducerBlockedQuotaExceededException,
        errors.NotLeaderOrFollower,
    ),
    (R.TopicNotFound, _pulsar.TopicNotFound, errors.UnknownTopicOrPartition),
    (R.TopicTerminated, _pulsar.TopicTerminated, errors.UnknownTopicOrPartition),
    (R.MessageTooBig, _pulsar.MessageTooBig, errors.MessageTooLarge),
    (R.AuthenticationError, _pulsar.AuthenticationError, errors.TopicAuthorizationFailed),
    (R.AuthorizationError, _pulsar.AuthorizationError, errors.TopicAuthorizationFailed),
)
_BY_RESULT: dict[_pulsar.Result, type[errors.KafkaError]] = {r: k for r, _, k in _ROWS}
_BY_CLASS: dict[type[Exception], type[errors.KafkaError]] = {c: k for _, c, k in _ROWS}


class SendFailed(Exception):
    """A send's callback reported a Result other than Ok."""

    def __init__(self, result: _pulsar.Result) -> None:
        super().__init__(f"Pulsar answered {result.name}")
        self.result = result


def _for_admin(exc: AdminError, what: str) -> errors.KafkaError:
    # Pulsar's own text (paths, class names, internal addresses) is logged, not answered
    log.warning("%s: %s", what, exc)
    detail = f"{what}: the Pulsar admin API answered {exc.status}"
    if exc.status == 404:
        return errors.UnknownTopicOrPartition(detail)
    if exc.status in {401, 403}:
        return errors.TopicAuthorizationFailed(
            f"{detail} (the sidecar's Pulsar credentials lack a permission)"
        )
    return errors.KafkaStorageError(detail)


def translate(  # noqa: PLR0911 - one answer per kind of failure
    failure: BaseException | _pulsar.Result, what: str
) -> errors.KafkaError:
    """The Kafka error for a failure below the produce path; ``what`` names the operation.

    Kafka errors pass through. Timeouts -> REQUEST_TIMED_OUT (7); a producer name held
    elsewhere, connection and lookup trouble, a full client queue -> NOT_LEADER_OR_FOLLOWER
    (6); both retriable. A topic that does not exist or was terminated ->
    UNKNOWN_TOPIC_OR_PARTITION (3); an entry the broker refuses as too big ->
    MESSAGE_TOO_LARGE (10); refused credentials -> TOPIC_AUTHORIZATION_FAILED (29); the
    admin API unreachable -> 6; anything else -> KAFKA_STORAGE_ERROR (56, retriable).
    """
    if isinstance(failure, errors.KafkaError):
        return failure
    if isinstance(failure, _pulsar.Result):
        return _BY_RESULT.get(failure, errors.KafkaStorageError)(
            f"{what}: Pulsar answered {failure.name}"
        )
    detail = f"{what}: {failure}" if str(failure) else f"{what}: {type(failure).__name__}"
    if isinstance(failure, SendFailed | pulsar_async.PulsarException):
        result = failure.result if isinstance(failure, SendFailed) else failure.error()
        return _BY_RESULT.get(result, errors.KafkaStorageError)(detail)
    if isinstance(failure, _pulsar.PulsarException):
        return _BY_CLASS.get(type(failure), errors.KafkaStorageError)(detail)
    if isinstance(failure, asyncio.TimeoutError | TimeoutError | httpx.TimeoutException):
        return errors.RequestTimedOut(f"{what}: timed out waiting for Pulsar")
    if isinstance(failure, AdminError):
        return _for_admin(failure, what)
    if isinstance(failure, httpx.TransportError | OSError):
        log.warning("%s: Pulsar unreachable: %r", what, failure)
        return errors.NotLeaderOrFollower(f"{what}: Pulsar unreachable")
    log.error("untranslated failure in %s: %r", what, failure)
    # its text may hold internal addresses or state: logged above, named by kind here
    return errors.KafkaStorageError(
        f"{what}: an unexpected {type(failure).__name__} (the sidecar's log has the detail)"
    )
