"""SIGTERM with Kafka clients connected: a Kafka batch held in the sidecar gets a
retriable code at once, Kafka connections are closed, the process exits 0."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from kafka.protocol.producer import InitProducerIdRequest

from kop_dedup.protocol.records import rec
from tests.helpers import batch, read_all, uniq, wait_until, waiting_batches
from tests.kafka_wire import WireClient, produce_request
from tests.sidecar import ProcessSidecar

pytestmark = pytest.mark.integration


def test_sigterm_answers_a_held_kafka_batch_retriably_then_closes_kafka_connections(
    pulsar, pulsar_reader_client, tmp_path
):
    sc = ProcessSidecar(pulsar, tmp_path, reorder_window_ms=20_000, log_level="INFO").start()
    topic = uniq("kterm")
    try:
        with WireClient(sc.kafka_bootstrap) as c, WireClient(sc.kafka_bootstrap) as idle:
            pid = c.call(
                InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1), 4
            ).producer_id
            meta = httpx.post(
                f"{sc.url}/v1/produce", json={"batches": [batch(topic, pid, 0, 2)]}, timeout=30
            )
            assert meta.json()["results"][0]["errorCode"] == 0
            # sequences 4..5 wait inside the sidecar for 2..3, which never come
            cid = c.send(
                produce_request(
                    topic, 0, [rec(b"4"), rec(b"5")], producer_id=pid, epoch=0, base_sequence=4
                ),
                9,
            )
            with httpx.Client(base_url=sc.url, timeout=30) as api:
                wait_until("the held batch to wait", lambda: waiting_batches(api) == 1)
            assert sc.proc is not None
            signalled = time.monotonic()
            sc.proc.send_signal(signal.SIGTERM)
            got, answer = c.receive(produce_request(topic, 0, []), 9)
            answered_in = time.monotonic() - signalled
            assert got == cid
            assert answer.responses[0].partition_responses[0].error_code == 6
            assert idle.closed_by_peer(timeout=30)
        exit_code = sc.proc.wait(timeout=40)
    finally:
        sc.stop()
    assert answered_in < 5
    assert exit_code == 0
    assert "kafka listener closed" in sc.log_path.read_text()
    read_all(pulsar_reader_client, f"persistent://public/kafka/{topic}-partition-0", expect=2)
