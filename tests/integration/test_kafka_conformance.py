"""Kafka itself as the oracle: the same scenario against the reference broker and the
sidecar's Kafka listener, observations equal. Skips until the listener's tests provide
the ``sidecar_kafka`` fixture (see ``tests/kafka_conformance.py``)."""

from __future__ import annotations

import pytest

from tests.kafka_conformance import commit_then_abort

pytestmark = pytest.mark.kafka


def test_a_committed_and_an_aborted_transaction_read_alike_on_kafka_and_the_sidecar(conformance):
    kafka, sidecar = conformance
    assert commit_then_abort(kafka) == commit_then_abort(sidecar)
