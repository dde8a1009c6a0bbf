"""The produce core against the real broker: fencing at write time, refusals that change
nothing, whole batches, and loud lost dedup state."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from kop_dedup.pulsar.wire import PROP_SEQUENCE
from tests.helpers import b64, batch, new_pid, read_all, topic_led_by, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


def produce(api: httpx.Client, *batches: dict[str, Any]) -> list[dict[str, Any]]:
    r = api.post("/v1/produce", json={"batches": list(batches)})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def codes(results: list[dict[str, Any]]) -> list[int]:
    return [r["errorCode"] for r in results]


def in_background(call: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``call`` in a thread; the returned function joins it and gives its result."""
    box: dict[str, Any] = {}

    def run() -> None:
        box["result"] = call()

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> Any:
        thread.join(timeout=60)
        return box["result"]

    return join


@pytest.fixture
def other(pulsar: Any, sidecar: ThreadSidecar) -> Iterator[ThreadSidecar]:
    """A second node of the session sidecar's cluster (clients behind a load balancer),
    for one test: the others count what the session sidecar does alone."""
    with ThreadSidecar(pulsar, reorder_window_ms=1500, cluster_of=sidecar) as sc:
        yield sc


def init(url: str, transactional_id: str) -> tuple[int, int]:
    body = httpx.post(
        f"{url}/v1/init-producer-id", json={"transactionalId": transactional_id}, timeout=30
    ).json()
    assert body["errorCode"] == 0, body
    return body["producerId"], body["producerEpoch"]


def sequences(client: Any, topic: str) -> list[str]:
    return [m.properties()[PROP_SEQUENCE] for m in read_all(client, f"{NS}/{topic}-partition-0")]


def test_a_batch_fenced_while_it_waited_behind_a_gap_is_refused_and_never_written(
    sidecar, other, api, pulsar_reader_client
):
    """Kafka checks the epoch under the partition lock at append. A batch of epoch e held
    behind a gap, while epoch e + 1 is recorded through another sidecar, is refused 47
    when its turn comes (it used to be judged on arrival only, and answered 45). The topic
    is one the session sidecar leads: the batch waits there."""
    wait_until("both nodes listed", lambda: len(sidecar.runtime.cluster.members) == 2)
    topic, txn = topic_led_by(sidecar), uniq("txn")
    pid, epoch = init(sidecar.url, txn)
    assert codes(produce(api, batch(topic, pid, 0, 1, epoch=epoch))) == [0]
    service = sidecar.runtime.service
    held = in_background(lambda: produce(api, batch(topic, pid, 2, 1, epoch=epoch)))
    wait_until("the batch to wait behind the gap", lambda: service.waiting_batches() >= 1)
    assert init(other.url, txn) == (pid, epoch + 1)  # fences epoch e everywhere
    filler = produce(api, batch(topic, pid, 1, 1, epoch=epoch))
    answer = held()
    assert codes(filler) == [47], filler
    assert codes(answer) == [47], answer
    assert "fenced" in answer[0]["errorMessage"]
    assert sequences(pulsar_reader_client, topic) == ["0"]


@pytest.mark.parametrize("new_epoch", [1, 32767])
def test_a_refused_batch_of_a_new_epoch_fences_nothing(new_epoch, api, pulsar_reader_client):
    """A batch of a new epoch that breaks a rule (here: a new epoch must start at 0)
    changes no state; it used to raise the producer id's epoch first, for good."""
    topic, pid = uniq(), new_pid(api)
    assert codes(produce(api, batch(topic, pid, 0, 3))) == [0]
    refused = produce(api, batch(topic, pid, 5, 1, epoch=new_epoch))
    assert codes(refused) == [45], refused
    assert codes(produce(api, batch(topic, pid, 3, 1))) == [0]
    assert sequences(pulsar_reader_client, topic) == ["0", "1", "2", "3"]


def test_a_new_epoch_is_recorded_once_its_first_batch_passes_and_then_fences(api):
    topic, pid = uniq(), new_pid(api)
    assert codes(produce(api, batch(topic, pid, 0, 1))) == [0]
    assert codes(produce(api, batch(topic, pid, 0, 1, epoch=1))) == [0]
    assert codes(produce(api, batch(topic, pid, 1, 1))) == [47]
    r = api.get(f"/v1/stats/producers/{pid}").json()
    assert r["highestEpoch"] == 1


def test_pipelined_batches_of_a_new_epoch_all_follow_its_first(api, pulsar_reader_client):
    """After an epoch bump (librdkafka bumps after a leader change), the batches of the new
    epoch come pipelined: 0.. while it is still being recorded, then 2... The later ones
    used to be refused 45 at once ("a new epoch must start at sequence 0"): their channel
    had no state yet, and librdkafka took that 45 for a fatal desynchronization."""
    topic, pid = uniq(), new_pid(api)
    assert codes(produce(api, batch(topic, pid, 0, 3))) == [0]
    answers = produce(
        api,
        batch(topic, pid, 0, 2, epoch=1),
        batch(topic, pid, 2, 1, epoch=1),
        batch(topic, pid, 3, 2, epoch=1),
    )
    assert codes(answers) == [0, 0, 0], answers
    assert sequences(pulsar_reader_client, topic) == ["0", "1", "2", "0", "1", "2", "3", "4"]


def test_a_batch_behind_one_refused_while_the_old_owner_held_the_name_is_answered_at_once(
    pulsar, pulsar_reader_client
):
    """After a hand-over the new owner answers 6 while the old one still holds the
    producer name; the batch pipelined behind the refused one used to wait out the whole
    reorder window for it (librdkafka resends it only after hearing about the later
    one) and then got 45, which made librdkafka bump its epoch. One open channel at a
    time, so that a second topic closes the first one's producer and frees the name."""
    import pulsar as pulsar_client

    topic, other = uniq(), uniq()
    with (
        ThreadSidecar(pulsar, reorder_window_ms=20_000, max_open_producers=1) as sc,
        httpx.Client(base_url=sc.url, timeout=60) as api,
    ):
        pid = new_pid(api)
        assert codes(produce(api, batch(topic, pid, 0, 3))) == [0]
        assert codes(produce(api, batch(other, new_pid(api), 0, 1))) == [0]  # closes topic's
        client = pulsar_client.Client(pulsar.service_url)
        try:
            holder = wait_until(  # the old owner, still holding the name
                "the sidecar to let go of the name",
                lambda: _hold(client, f"{NS}/{topic}-partition-0", f"kop-{pid}-0"),
            )
            assert codes(produce(api, batch(topic, pid, 3, 1))) == [6]
            holder.close()
            started = time.monotonic()
            answer = produce(api, batch(topic, pid, 4, 1))
            took = time.monotonic() - started
        finally:
            client.close()
        assert codes(answer) == [6], answer
        assert "follows sequence 3" in answer[0]["errorMessage"]
        assert took < 10, took  # not the 20 s reorder window
        assert codes(produce(api, batch(topic, pid, 3, 1), batch(topic, pid, 4, 1))) == [0, 0]
    assert sequences(pulsar_reader_client, topic) == ["0", "1", "2", "3", "4"]


def _hold(client: Any, ptopic: str, name: str) -> Any:
    """A Pulsar producer holding ``name`` on ``ptopic``, or None while another holds it."""
    try:
        return client.create_producer(ptopic, producer_name=name, send_timeout_millis=5000)
    except Exception:
        return None


@pytest.fixture(scope="module")
def small(pulsar: Any) -> Iterator[ThreadSidecar]:
    """A sidecar with a small client queue (2 batches of 50 records) and a small broker
    message limit, so the bounds show with few records."""
    with ThreadSidecar(
        pulsar,
        system_namespace=uniq("sys"),  # a cluster of its own: it outlives this module's tests
        max_batch_records=50,
        max_inflight_batches=2,
        max_batch_bytes=64 * 1024,
        pulsar_max_message_bytes=128 * 1024,
    ) as sc:
        yield sc


def test_pipelined_batches_beyond_the_in_flight_bound_wait_and_are_stored_whole(
    small, pulsar_reader_client
):
    topic = uniq()
    with httpx.Client(base_url=small.url, timeout=60) as api:
        pid = new_pid(api)
        answers = produce(api, *(batch(topic, pid, 50 * i, 50) for i in range(6)))
    assert codes(answers) == [0] * 6
    messages = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0", expect=300)
    entries: dict[tuple[int, int], list[int]] = {}
    for m in messages:
        mid = m.message_id()
        entries.setdefault((mid.ledger_id(), mid.entry_id()), []).append(
            int(m.properties()[PROP_SEQUENCE])
        )
    # one Pulsar entry per Kafka batch, in order, each whole
    assert list(entries.values()) == [list(range(50 * i, 50 * i + 50)) for i in range(6)]


def test_a_batch_whose_entry_could_exceed_the_brokers_limit_is_refused_whole(
    small, pulsar_reader_client
):
    topic = uniq()
    with httpx.Client(base_url=small.url, timeout=60) as api:
        pid = new_pid(api)
        big = batch(topic, pid, 0, 50)
        for record in big["records"]:  # 60 KB by Kafka's count; its entry could pass 128 KiB
            record["value"] = b64(b"x" * 1000)
            record["headers"] = [{"key": "h" * 200, "value": None}]
        answer = produce(api, big)
        assert codes(answer) == [10], answer
        assert "split it" in answer[0]["errorMessage"]
        assert codes(produce(api, batch(topic, pid, 0, 5))) == [0]
    assert sequences(pulsar_reader_client, topic) == ["0", "1", "2", "3", "4"]


def set_topic_dedup(pulsar: Any, topic: str, enabled: bool | None) -> None:
    url = f"{pulsar.admin_url}/admin/v2/persistent/public/kafka/{topic}/deduplicationEnabled"
    r = httpx.delete(url) if enabled is None else httpx.post(url, json=enabled)
    assert r.status_code in {200, 204}, r.text
    expected = "" if enabled is None else str(enabled).lower()
    wait_until(
        f"topic dedup {expected or 'unset'}", lambda: httpx.get(url).text.strip() == expected
    )


def forget_dedup_state(pulsar: Any, topic: str) -> None:
    """Turning a topic's dedup off and on again drops the broker's state for every name."""
    set_topic_dedup(pulsar, topic, enabled=False)
    set_topic_dedup(pulsar, topic, enabled=True)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def test_a_retry_the_broker_stores_again_is_answered_but_loud(
    pulsar, sidecar, api, pulsar_reader_client, caplog
):
    """The broker lost its dedup state for the name (here: dedup switched off and on):
    a retry of a batch older than the last five is stored again. The answer stays 0,
    but it is logged at ERROR and counted (by the partition's leader: the session
    sidecar, which leads the topic chosen)."""
    topic, pid = topic_led_by(sidecar), new_pid(api)
    assert codes(produce(api, *(batch(topic, pid, i, 1) for i in range(6)))) == [0] * 6
    before = metric(sidecar.url, "kop_dedup_dedup_state_lost_total")
    forget_dedup_state(pulsar, topic)
    with caplog.at_level(logging.ERROR, logger="kop_dedup"):
        retry = produce(api, batch(topic, pid, 0, 1))
    assert codes(retry) == [0], retry
    assert any("lost the deduplication state" in r.getMessage() for r in caplog.records)
    assert metric(sidecar.url, "kop_dedup_dedup_state_lost_total") == before + 1
    assert sequences(pulsar_reader_client, topic) == ["0", "1", "2", "3", "4", "5", "0"]


def test_a_reopened_name_the_broker_forgot_is_answered_from_the_sidecars_memory(
    pulsar, pulsar_reader_client, caplog
):
    topic = uniq()
    with (
        ThreadSidecar(pulsar, producer_idle_seconds=0.5) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as api,
    ):
        pid = new_pid(api)
        assert codes(produce(api, *(batch(topic, pid, i, 1) for i in range(6)))) == [0] * 6
        service = sc.runtime.service
        wait_until("the idle producer to close", lambda: service.open_producers() == 0)
        forget_dedup_state(pulsar, topic)
        with caplog.at_level(logging.ERROR, logger="kop_dedup"):
            retry = produce(api, batch(topic, pid, 0, 1))
            assert codes(retry) == [46], retry
            assert codes(produce(api, batch(topic, pid, 6, 1))) == [0]
        assert any("lost the deduplication state" in r.getMessage() for r in caplog.records)
    assert sequences(pulsar_reader_client, topic) == [str(i) for i in range(7)]


def test_a_topic_whose_dedup_is_turned_off_is_refused_when_a_producer_opens(pulsar, api):
    topic, pid = uniq(), new_pid(api)
    assert codes(produce(api, batch(topic, -1, -1, 1))) == [0]  # creates the topic
    set_topic_dedup(pulsar, topic, enabled=False)
    refused = produce(api, batch(topic, pid, 0, 1))
    assert codes(refused) == [56], refused
    assert "deduplication is off" in refused[0]["errorMessage"]
    set_topic_dedup(pulsar, topic, enabled=None)
    wait_until(
        "the retry to be stored", lambda: codes(produce(api, batch(topic, pid, 0, 1))) == [0]
    )


@pytest.mark.parametrize("lease_ms", [60_000, 0])
def test_batches_on_a_fresh_epochs_view_do_not_each_catch_up(pulsar, lease_ms):
    """Every idempotent batch used to await a catch-up read of the producer epochs (a
    broker round trip before its send). Within the fencing lease the view is fresh and
    batches go at once; a raise waits out the lease instead (the fencing tests above
    and in test_produce_api show it stays exact across sidecars). Lease 0: a catch-up
    per batch, as before."""
    with (
        ThreadSidecar(pulsar, fencing_lease_ms=lease_ms, system_namespace=uniq("sys")) as sc,
        httpx.Client(base_url=sc.url, timeout=30) as api,
    ):
        topic, pid = uniq(), new_pid(api)
        assert codes(produce(api, batch(topic, pid, 0, 1))) == [0]
        epochs = sc.runtime.registry.epochs
        before = epochs.catch_ups
        for seq in range(1, 21):
            assert codes(produce(api, batch(topic, pid, seq, 1))) == [0]
        caught_up = epochs.catch_ups - before
    if lease_ms:
        assert caught_up <= 1, caught_up  # at most the background refresh's
    else:
        assert caught_up >= 20, caught_up
