"""The produce API as a client sees it: real uvicorn socket, real Pulsar broker."""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from kop_dedup import errors
from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup.pulsar.wire import PROP_EPOCH, PROP_HEADERS, PROP_PRODUCER_ID, PROP_SEQUENCE
from tests.helpers import (
    b64,
    batch,
    gauges,
    new_pid,
    read_all,
    uniq,
    wait_until,
    waiting_batches,
)
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


def produce(
    api: httpx.Client, *batches: dict[str, Any], timeout_ms: int | None = None
) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"batches": list(batches)}
    if timeout_ms is not None:
        body["timeoutMs"] = timeout_ms
    r = api.post("/v1/produce", json=body)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def codes(results: list[dict[str, Any]]) -> list[int]:
    return [r["errorCode"] for r in results]


def test_retried_batch_is_duplicate_with_its_original_position_and_stored_once(
    api, pulsar_reader_client
):
    topic, pid = uniq(), new_pid(api)
    first = produce(api, batch(topic, pid, 0, 3))
    assert codes(first) == [0]
    assert first[0]["messageId"]
    retry = produce(api, batch(topic, pid, 0, 3))
    assert codes(retry) == [46]
    assert retry[0]["error"] == "DUPLICATE_SEQUENCE_NUMBER"
    assert retry[0]["messageId"] == first[0]["messageId"]
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=3)
    assert [m.properties()[PROP_SEQUENCE] for m in msgs] == ["0", "1", "2"]


def test_five_shuffled_pipelined_batches_over_separate_connections(pulsar, pulsar_reader_client):
    """A sidecar of its own with a reorder window far longer than the test's steps: on
    the session sidecar's 1.5 s, batch 3 (the first to arrive) expired with 45 whenever
    the four later arrivals, each awaited by a poll, took longer than that (a loaded
    machine), and the poll for the next waiting count never saw it."""
    with (
        ThreadSidecar(pulsar, reorder_window_ms=30_000, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as api,
    ):
        _five_shuffled(sc, api, pulsar_reader_client)


def _five_shuffled(sidecar: ThreadSidecar, api: httpx.Client, pulsar_reader_client: Any) -> None:
    topic, pid = uniq(), new_pid(api)
    batches = [batch(topic, pid, i * 4, 4) for i in range(5)]
    # arrival order 3, 1, 4, 0, 2: each is sent once the one before is seen inside the
    # sidecar (waiting batches: 3; 3 and 1; 3, 1 and 4; 0 and 1 stored, 3 and 4 still)
    arrivals = [(3, 1), (1, 2), (4, 3), (0, 2), (2, 0)]
    results: dict[int, dict[str, Any]] = {}

    def send(i: int) -> None:
        with httpx.Client(base_url=sidecar.url, timeout=30) as own_connection:
            r = own_connection.post("/v1/produce", json={"batches": [batches[i]]})
        results[i] = r.json()["results"][0]

    threads = []
    for i, waiting in arrivals:
        threads.append(threading.Thread(target=send, args=(i,)))
        threads[-1].start()
        wait_until(
            f"{waiting} waiting batches once batch {i} arrived",
            lambda n=waiting: waiting_batches(api) == n,
        )
    for t in threads:
        t.join(timeout=30)
    assert [results[i]["errorCode"] for i in range(5)] == [0] * 5, results
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=20)
    assert [int(m.properties()[PROP_SEQUENCE]) for m in msgs] == list(range(20))


def test_batches_in_one_request_are_ordered_too(api, pulsar_reader_client):
    topic, pid = uniq(), new_pid(api)
    results = produce(api, batch(topic, pid, 2, 2), batch(topic, pid, 0, 2))
    assert codes(results) == [0, 0]
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=4)
    assert [int(m.properties()[PROP_SEQUENCE]) for m in msgs] == [0, 1, 2, 3]


def test_gap_that_never_fills_is_out_of_order_and_writes_nothing(api, pulsar_reader_client):
    topic, pid = uniq(), new_pid(api)
    assert codes(produce(api, batch(topic, pid, 0, 2))) == [0]
    started = time.monotonic()
    results = produce(api, batch(topic, pid, 5, 1))
    assert codes(results) == [45]
    assert "expected sequence 2" in results[0]["errorMessage"]
    assert time.monotonic() - started < 10
    read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=2)
    assert codes(produce(api, batch(topic, pid, 2, 1))) == [0]


def test_partial_overlap_with_stored_sequences_is_out_of_order(api, pulsar_reader_client):
    topic, pid = uniq(), new_pid(api)
    assert codes(produce(api, batch(topic, pid, 0, 5))) == [0]
    results = produce(api, batch(topic, pid, 3, 5))
    assert codes(results) == [45]
    read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=5)


def test_duplicate_is_decided_by_the_broker_after_sidecar_restart(pulsar, pulsar_reader_client):
    topic = uniq()
    with ThreadSidecar(pulsar) as one, httpx.Client(base_url=one.url, timeout=30) as api:
        pid = new_pid(api)
        assert codes(produce(api, batch(topic, pid, 0, 3), batch(topic, pid, 3, 3))) == [0, 0]
    with ThreadSidecar(pulsar) as two, httpx.Client(base_url=two.url, timeout=30) as api:
        assert not two.runtime.service.channels  # no local memory of this producer
        assert codes(produce(api, batch(topic, pid, 3, 3))) == [46]
        assert codes(produce(api, batch(topic, pid, 0, 3))) == [46]
        assert codes(produce(api, batch(topic, pid, 6, 1))) == [0]
    read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=7)


def test_stale_epoch_is_refused_after_sidecar_restart_and_across_sidecars(pulsar):
    topic, txn = uniq(), uniq("txn")
    with ThreadSidecar(pulsar) as one, httpx.Client(base_url=one.url, timeout=30) as api1:
        r0 = api1.post("/v1/init-producer-id", json={"transactionalId": txn}).json()
        pid, e0 = r0["producerId"], r0["producerEpoch"]
        assert codes(produce(api1, batch(topic, pid, 0, 1, epoch=e0))) == [0]
        with ThreadSidecar(pulsar) as two, httpx.Client(base_url=two.url, timeout=30) as api2:
            r1 = api2.post("/v1/init-producer-id", json={"transactionalId": txn}).json()
            assert (r1["producerId"], r1["producerEpoch"]) == (pid, e0 + 1)
            # the old instance keeps writing through the first sidecar: fenced
            stale = produce(api1, batch(topic, pid, 1, 1, epoch=e0))
            assert codes(stale) == [47], stale
            assert codes(produce(api2, batch(topic, pid, 0, 1, epoch=e0 + 1))) == [0]
    with ThreadSidecar(pulsar) as three, httpx.Client(base_url=three.url, timeout=30) as api3:
        assert codes(produce(api3, batch(topic, pid, 1, 1, epoch=e0))) == [47]
        assert codes(produce(api3, batch(topic, pid, 1, 1, epoch=e0 + 1))) == [0]


def test_epoch_bump_without_init_must_start_at_zero(api, pulsar_reader_client):
    topic, pid = uniq(), new_pid(api)
    assert codes(produce(api, batch(topic, pid, 0, 3))) == [0]
    assert codes(produce(api, batch(topic, pid, 3, 1, epoch=1))) == [45]
    assert codes(produce(api, batch(topic, pid, 0, 2, epoch=1))) == [0]
    assert codes(produce(api, batch(topic, pid, 3, 1, epoch=0))) == [47]
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=5)
    assert [m.properties()[PROP_EPOCH] for m in msgs] == ["0", "0", "0", "1", "1"]


def test_two_sidecars_never_hand_out_the_same_producer_id(pulsar, sidecar):
    with ThreadSidecar(pulsar, cluster_of=sidecar) as other:
        urls = [sidecar.url, other.url] * 30

        def init(url: str) -> int:
            with httpx.Client(base_url=url, timeout=60) as c:
                return new_pid(c)

        with ThreadPoolExecutor(8) as pool:
            pids = list(pool.map(init, urls))
    assert len(set(pids)) == len(pids)


def test_sequence_wraparound_is_in_order_and_retry_before_wrap_is_duplicate(
    api, pulsar_reader_client
):
    topic, pid = uniq(), new_pid(api)
    top = SEQ_MODULUS - 1
    assert codes(produce(api, batch(topic, pid, top - 1, 2))) == [0]  # ..2147483647
    assert codes(produce(api, batch(topic, pid, 0, 2))) == [0]  # wraps to 0
    assert codes(produce(api, batch(topic, pid, top - 1, 2))) == [46]
    assert codes(produce(api, batch(topic, pid, 2, 1))) == [0]
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=5)
    assert [int(m.properties()[PROP_SEQUENCE]) for m in msgs] == [top - 1, top, 0, 1, 2]


def test_records_reach_pulsar_losslessly(api, pulsar_reader_client):
    topic, pid = uniq(), new_pid(api)
    raw_key = bytes([0xFF, 0x00, 0x10])
    records = [
        {
            "key": b64("user-1"),
            "value": b64("hello"),
            "timestamp": 1_700_000_000_123,
            "headers": [{"key": "h", "value": b64(b"\x00\x01")}, {"key": "h", "value": None}],
        },
        {"key": base64.b64encode(raw_key).decode(), "value": None},
        {"key": None, "value": b64(b"")},
    ]
    body = {
        "topic": topic,
        "partition": 0,
        "producerId": pid,
        "producerEpoch": 0,
        "baseSequence": 0,
        "lastSequence": 2,
        "records": records,
    }
    assert codes(produce(api, body)) == [0]
    m0, m1, m2 = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=3)
    assert m0.partition_key() == "user-1"
    assert m0.data() == b"hello"
    assert m0.event_timestamp() == 1_700_000_000_123
    assert json.loads(m0.properties()[PROP_HEADERS]) == [["h", b64(b"\x00\x01")], ["h", None]]
    assert m0.properties()[PROP_PRODUCER_ID] == str(pid)
    assert base64.b64decode(m1.partition_key()) == raw_key
    assert m1.properties()["kafka.value.null"] == "true"
    assert m2.data() == b""
    assert "kafka.value.null" not in m2.properties()


def test_non_idempotent_batches_are_published_without_sequence_checks(api, pulsar_reader_client):
    topic = uniq()
    plain = batch(topic, -1, 0, 2) | {"producerEpoch": -1, "baseSequence": -1, "lastSequence": -1}
    assert codes(produce(api, plain)) == [0]
    assert codes(produce(api, plain)) == [0]  # no dedup without a producer id
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=4)
    assert all(PROP_SEQUENCE not in m.properties() for m in msgs)


def test_per_batch_errors_do_not_disturb_other_batches(api, pulsar_reader_client):
    topic, pid = uniq(), new_pid(api)
    bad_shape = batch(topic, pid, 0, 2) | {"lastSequence": 5}
    results = produce(
        api,
        batch(topic, pid, 0, 2),
        bad_shape,
        batch(topic, pid, 0, 1, partition=7),
        batch("bad topic!", pid, 0, 1),
        {**batch(topic, pid, 2, 1), "records": [{"value": "%%%"}]},
    )
    assert codes(results) == [0, 87, 3, 17, 87]
    assert all(r["errorMessage"] for r in results[1:])
    read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=2)


def test_unknown_topic_without_auto_creation_is_unknown_topic(pulsar):
    with (
        ThreadSidecar(pulsar, auto_create_topics=False) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as api,
    ):
        results = produce(api, batch(uniq(), new_pid(api), 0, 1))
    assert codes(results) == [3]


def test_malformed_bodies_get_a_4xx_with_a_reason(api):
    r = api.post("/v1/produce", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["errorMessage"]
    r = api.post("/v1/produce", json={"batches": [{"topic": "t"}]})
    assert r.status_code == 422
    assert "producerId" in r.json()["errorMessage"]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda b: b.pop("producerEpoch"), "producerEpoch"),
        (lambda b: b.pop("lastSequence"), "lastSequence"),
        (lambda b: b["records"][0].pop("value"), "records.0.value"),
    ],
    ids=["no-producerEpoch", "no-lastSequence", "record-without-value"],
)
def test_a_batch_missing_a_required_field_is_a_422_naming_it_and_stores_nothing(
    api, pulsar_reader_client, mutate, path
):
    """Before: no producerEpoch was stored as epoch 0, no value as a null value, and no
    lastSequence was answered 87 about a -1 the client never sent."""
    topic, pid = uniq("missing"), new_pid(api)
    body = batch(topic, pid, 0, 1)
    mutate(body)
    r = api.post("/v1/produce", json={"batches": [body]})
    assert r.status_code == 422, r.text
    assert r.json()["errorCode"] == errors.InvalidRequest.errno
    assert f"body.batches.0.{path}: Field required" in r.json()["errorMessage"]
    assert not read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0")


def test_stats_and_metrics_count_outcomes(api):
    topic, pid = uniq(), new_pid(api)
    produce(api, batch(topic, pid, 0, 2))
    produce(api, batch(topic, pid, 0, 2))
    t = api.get(f"/v1/stats/topics/{topic}").json()
    assert t["sidecar"]["batches"]["accepted"] == 1
    assert t["sidecar"]["batches"]["duplicate"] == 1
    assert f"kop-{pid}-0" in t["broker"]["partitions"]["0"]["publishers"]
    p = api.get(f"/v1/stats/producers/{pid}").json()
    assert p["sidecar"]["records"]["duplicate"] == 2
    assert api.get("/v1/stats/producers/999999999999").status_code == 404
    totals = api.get("/v1/stats").json()
    assert totals["batches"]["duplicate"] >= 1
    metrics = api.get("/metrics").text
    assert f'kop_dedup_batches_total{{topic="{topic}",outcome="duplicate"}} 1' in metrics
    assert api.get("/readyz").json()["status"] == "ok"


def test_idle_producers_are_closed_and_state_comes_back_from_the_broker(pulsar):
    with (
        ThreadSidecar(pulsar, producer_idle_seconds=0.5) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as api,
    ):
        topic = uniq()
        pids = [new_pid(api) for _ in range(3)]
        for pid in pids:
            assert codes(produce(api, batch(topic, pid, 0, 1))) == [0]
        assert api.get("/v1/stats").json()["openProducers"] == 3
        wait_until(
            "the idle producers to close",
            lambda: api.get("/v1/stats").json()["openProducers"] == 0,
        )
        assert not sc.runtime.service.channels
        assert codes(produce(api, batch(topic, pids[0], 0, 1))) == [46]
        assert codes(produce(api, batch(topic, pids[0], 1, 1))) == [0]
        assert codes(produce(api, batch(topic, pids[1], 5, 1))) == [45]


def test_auth_tokens_guard_produce_but_not_health(pulsar, tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("# one per line\ns3cret-token\n")
    with (
        # a cluster of its own: a node of the default system namespace without
        # authentication would refuse it (nodes of a cluster authenticate alike)
        ThreadSidecar(pulsar, auth_tokens_file=token_file, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as api,
    ):
        assert api.get("/healthz").status_code == 200
        assert api.post("/v1/init-producer-id", json={}).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert api.post("/v1/init-producer-id", json={}, headers=wrong).status_code == 403
        assert api.get("/metrics", headers=wrong).status_code == 403
        good = {"Authorization": "Bearer s3cret-token"}
        r = api.post("/v1/init-producer-id", json={}, headers=good)
        assert r.status_code == 200
        assert r.json()["errorCode"] == 0
        body = {"batches": [batch(uniq("auth"), r.json()["producerId"], 0, 1)]}
        assert api.post("/v1/produce", json=body).status_code == 401
        assert api.post("/v1/produce", json=body, headers=wrong).status_code == 403
        r = api.post("/v1/produce", json=body, headers=good)
        assert r.status_code == 200
        assert r.json()["results"][0]["errorCode"] == 0


def test_requests_over_the_in_flight_byte_budget_wait_for_earlier_ones(pulsar):
    """KOP_DEDUP_MAX_INFLIGHT_BYTES: a request whose body does not fit next to those in
    flight waits (and is counted as waiting) until they are answered, then is served."""
    topic = uniq("budget")
    with (
        ThreadSidecar(pulsar, reorder_window_ms=5_000, max_inflight_bytes=1024) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as api,
    ):
        held_pid, other_pid = new_pid(api), new_pid(api)
        first = api.post("/v1/produce", json={"batches": [batch(topic, held_pid, 0, 1)]})
        assert first.json()["results"][0]["errorCode"] == 0
        # ahead of a gap: held for the reorder window, then 45
        held = json.dumps({"batches": [batch(topic, held_pid, 5, 12)]}).encode()
        other = json.dumps({"batches": [batch(topic, other_pid, 0, 12)]}).encode()
        assert max(len(held), len(other)) <= 1024 < len(held) + len(other)
        done: dict[str, tuple[float, int]] = {}

        def post(name: str, body: bytes) -> None:
            with httpx.Client(base_url=sc.url, timeout=30) as client:
                r = client.post(
                    "/v1/produce", content=body, headers={"content-type": "application/json"}
                )
            done[name] = (time.monotonic(), r.json()["results"][0]["errorCode"])

        threads = [threading.Thread(target=post, args=("held", held))]
        threads[0].start()
        wait_until("the held batch to wait for its gap", lambda: waiting_batches(api) == 1)
        threads.append(threading.Thread(target=post, args=("other", other)))
        threads[1].start()
        wait_until(
            "the second request to wait for memory",
            lambda: gauges(api)["kop_dedup_requests_waiting_for_memory"] == 1,
        )
        seen = gauges(api)
        for t in threads:
            t.join(timeout=30)
    assert seen["kop_dedup_inflight_request_bytes"] == len(held), seen
    assert (done["held"][1], done["other"][1]) == (45, 0), done
    assert done["other"][0] >= done["held"][0], (
        "the second request was served before the first let go"
    )
