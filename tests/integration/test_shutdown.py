"""SIGTERM: nothing new is taken, a batch held in the sidecar gets a retriable code at once,
producers close, the process exits 0, and what was acknowledged is in Pulsar."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pulsar as pulsar_client
import pytest

from kop_dedup.coordination.partitions import partition_of
from kop_dedup.settings import Settings
from tests.helpers import batch, new_pid, read_all, uniq, wait_until, waiting_batches
from tests.integration.groups import commit, configure, join, offsets, produce, pull
from tests.sidecar import SESSION_SYSTEM_NAMESPACE, ProcessSidecar, ThreadSidecar

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


def test_sigterm_while_the_broker_does_not_answer_stops_within_the_shutdown_timeout(
    pulsar_control, pulsar_reader_client, tmp_path
):
    """The broker is paused (SIGSTOP) when the sidecar is told to stop: it exits within
    shutdown_timeout_ms all the same. Nothing acknowledged is lost, and the next owner
    of its consumer-group partitions, which were not marked closed cleanly, sends the
    records answered but not committed again."""
    budget_s = 8.0
    sc = ProcessSidecar(
        pulsar_control,
        tmp_path,
        shutdown_timeout_ms=int(budget_s * 1000),
        coordinator_adopt_interval_ms=300,
        log_level="INFO",
    ).start()
    topic, group = uniq("stop"), uniq("g")
    try:
        with httpx.Client(base_url=sc.url, timeout=30) as api:
            produce(api, topic, 10, per_batch=5)
            configure(api, group, sessionTimeoutMs=120_000)
            join(api, group, [topic], member="m")
            assert offsets(pull(api, group, "m", 4)) == [0, 1, 2, 3]
            assert commit(api, group, "m").json()["committed"][0]["offset"] == 4
            assert offsets(pull(api, group, "m", 3)) == [4, 5, 6]  # answered, not committed
        assert sc.proc is not None
        pulsar_control.pause()
        try:
            signalled_ms = int(time.time() * 1000)
            signalled = time.monotonic()
            sc.proc.send_signal(signal.SIGTERM)
            try:
                exit_code: int | None = sc.proc.wait(timeout=budget_s + 10)
            except subprocess.TimeoutExpired:
                exit_code = None
            stopped_in = time.monotonic() - signalled
        finally:
            pulsar_control.resume()
    finally:
        sc.stop()
    print(f"\nstopped {stopped_in:.1f} s after SIGTERM (budget {budget_s:.0f} s)")
    assert exit_code == 0, sc.log_tail()
    assert stopped_in < budget_s + 2  # the budget, and the interpreter's own exit
    read_all(pulsar_reader_client, f"persistent://public/kafka/{topic}-partition-0", expect=10)
    # the "closed cleanly" marker may still reach the broker from the socket's buffer
    # when it resumes: then the records answered (4-6) are with the client and not sent
    # again; when it did not, the next owner recovers the partition and sends them again
    # (the broker takes in what the dead sidecar left in its socket as it resumes: read
    # the markers until two reads a second apart agree, before the next owner starts).
    # Another sidecar of the test session may adopt the partition meanwhile and clear
    # the marker as it takes it: what counts is whether the stopping sidecar wrote one
    clean = closed_cleanly(pulsar_reader_client, group, since_ms=signalled_ms)
    while True:
        time.sleep(1.0)
        later = closed_cleanly(pulsar_reader_client, group, since_ms=signalled_ms)
        if later == clean:
            break
        clean = later
    with ThreadSidecar(pulsar_control, coordinator_adopt_interval_ms=300) as nxt:
        with httpx.Client(base_url=nxt.url, timeout=60) as api:
            stored = api.get(f"/v1/groups/{group}/offsets").json()["offsets"]
            assert [(o["topic"], o["offset"]) for o in stored] == [(topic, 4)]
            again = offsets(pull(api, group, "m", 10))
    print(f"marked closed cleanly: {clean}; pulled after: {again}")
    assert again == ([7, 8, 9] if clean else [4, 5, 6, 7, 8, 9])


def closed_cleanly(client: pulsar_client.Client, group: str, since_ms: int) -> bool:
    """Whether an owner of the group's store partition marked it closed cleanly at or
    after ``since_ms`` (the marker says when it was written)."""
    partition = partition_of(group, Settings().offsets_partitions)
    topic = f"persistent://public/{SESSION_SYSTEM_NAMESPACE}/consumer-groups"
    reader = client.create_reader(
        f"{topic}-partition-{partition}", pulsar_client.MessageId.earliest
    )
    marked = False
    try:
        while reader.has_message_available():
            msg = reader.read_next(10_000)
            if msg.partition_key() == '["c",""]' and msg.data():
                marker = json.loads(msg.data())
                if marker.get("clean") and int(marker.get("atMs", 0)) >= since_ms:
                    marked = True
    finally:
        reader.close()
    return marked


def test_a_pull_cut_off_by_a_stop_is_sent_again_by_the_next_owner(pulsar, tmp_path):
    """A pull recorded but not answered yet when the sidecar is told to stop (its answer
    waits 60 s, longer than the stop may take): the stop cuts it off within the
    shutdown timeout, does not hand the group's partition over as closed cleanly, and
    the next owner sends those records again."""
    budget_s = 6.0
    sc = ProcessSidecar(
        pulsar,
        tmp_path,
        shutdown_timeout_ms=int(budget_s * 1000),
        group_pull_answer_delay_ms=60_000,
        log_level="INFO",
    ).start()
    topic, group = uniq("stop"), uniq("g")
    try:
        with httpx.Client(base_url=sc.url, timeout=30) as api:
            produce(api, topic, 6, per_batch=3)
            configure(api, group, sessionTimeoutMs=120_000)
            join(api, group, [topic], member="m")
            with ThreadPoolExecutor(1) as pool:
                cut = pool.submit(
                    httpx.post,
                    f"{sc.url}/v1/groups/{group}/members/m/pull",
                    json={"maxRecords": 10},
                    timeout=90,
                )

                def recorded() -> bool:
                    rows = api.get(f"/v1/groups/{group}/lag").json()["partitions"]
                    return bool(rows and rows[0]["pulled"] == 6)

                wait_until("the pull to be recorded", recorded)
                assert sc.proc is not None
                signalled = time.monotonic()
                sc.proc.send_signal(signal.SIGTERM)
                exit_code = sc.proc.wait(timeout=budget_s + 10)
                stopped_in = time.monotonic() - signalled
                with pytest.raises(httpx.HTTPError):
                    cut.result(timeout=30).raise_for_status()
    finally:
        sc.stop()
    print(f"\nstopped {stopped_in:.1f} s after SIGTERM (budget {budget_s:.0f} s)")
    assert exit_code == 0, sc.log_tail()
    assert stopped_in < budget_s + 2
    with ThreadSidecar(pulsar) as nxt, httpx.Client(base_url=nxt.url, timeout=60) as api:
        assert offsets(pull(api, group, "m", 10)) == [0, 1, 2, 3, 4, 5]
