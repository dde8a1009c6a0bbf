"""The one translation of Pulsar failures into Kafka errors.

Minimal stand-in with the agreed signature: every failure becomes a retriable
KAFKA_STORAGE_ERROR naming what failed. The produce core's full translation
(Pulsar results, client exceptions, admin HTTP errors) replaces this module.

>>> translate(TimeoutError("no answer"), "the producer-id registry").errno
56
"""

from __future__ import annotations

from kop_dedup import errors

__all__ = ["translate"]


def translate(exc: BaseException, what: str) -> errors.KafkaError:
    """The Kafka error to answer for ``exc``, raised while doing ``what``."""
    return errors.KafkaStorageError(f"{what}: {exc}")
