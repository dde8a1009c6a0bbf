"""SIGTERM: nothing new is taken, a batch held in the sidecar gets a retriable code at once,
producers close, the process exits 0, and what was acknowledged is in Pulsar."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.helpers import batch, new_pid, read_all, uniq, wait_until, waiting_batches
from tests.sidecar import ProcessSidecar

pytestmark = pytest.mark.integration


def test_sigterm_answers_held_batches_retriably_and_exits_cleanly(
    pulsar, pulsar_reader_client, tmp_path
):
    sc = ProcessSidecar(pulsar, tmp_path, reorder_window_ms=20_000, log_level="INFO").start()
    topic = uniq("term")
    try:
        with httpx.Client(base_url=sc.url, timeout=30) as api:
            pid = new_pid(api)
            first = api.post("/v1/produce", json={"batches": [batch(topic, pid, 0, 2)]})
            assert first.json()["results"][0]["errorCode"] == 0
            with ThreadPoolExecutor(1) as pool:
                # sequences 4..5 wait inside the sidecar for 2..3, which never come
                held = pool.submit(
                    api.post, "/v1/produce", json={"batches": [batch(topic, pid, 4, 2)]}
                )
                wait_until("the held batch to wait", lambda: waiting_batches(api) == 1)
                assert sc.proc is not None
                signalled = time.monotonic()
                sc.proc.send_signal(signal.SIGTERM)
                answer = held.result(timeout=30).json()["results"][0]
                answered_in = time.monotonic() - signalled
        exit_code = sc.proc.wait(timeout=40)
    finally:
        sc.stop()
    assert answer["errorCode"] == 6, answer  # retriable: the client retries elsewhere
    assert answered_in < 5  # not after the 20 s reorder window
    assert exit_code == 0
    assert "Application shutdown complete" in sc.log_path.read_text()
    read_all(pulsar_reader_client, f"persistent://public/kafka/{topic}-partition-0", expect=2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{sc.url}/healthz", timeout=2)
