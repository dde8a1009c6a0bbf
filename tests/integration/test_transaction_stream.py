"""A stream of transactions with random aborts through two sidecars, while a sidecar
and then the broker are SIGKILLed mid-stream, audited by Spark: every committed
transaction wholly visible once, every aborted one invisible, no duplicates.

The client plays a Kafka transactional producer behind a load balancer: each call goes
to either sidecar, a retriable answer or a dropped connection is retried (through
either) with the same producer id, epoch and sequences, and a transaction whose fate a
call could not learn is left to the coordinator (the next ``init-producer-id`` of its
id fences and aborts it unless its commit was already decided). Its outcome is then
whatever the coordinator decided: all of it or none of it must be visible.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from kop_dedup import errors
from tests.helpers import batch, read_all, uniq, wait_until
from tests.sidecar import SESSION_SYSTEM_NAMESPACE, ProcessSidecar

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.spark,
    # PySpark 3.5's collect() leaves its result socket to the garbage collector (see
    # test_audit.py): only that leak is let through
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

NS = "persistent://public/kafka"
FAST = {"coordinator_adopt_interval_ms": 300, "txn_sweep_interval_ms": 100, "log_level": "INFO"}
TRANSACTIONS = 36
CALL_DEADLINE_S = 120.0


class Unsure(Exception):
    """A call ended in an answer that leaves the transaction's fate to the coordinator."""


class Client:
    """Calls through either sidecar; retriable answers and dropped connections retried."""

    def __init__(self, urls: list[str], rng: random.Random) -> None:
        self.urls = urls
        self.rng = rng
        self.retries = 0

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + CALL_DEADLINE_S
        while True:
            url = self.rng.choice(self.urls)
            try:
                r = httpx.post(f"{url}{path}", json=body, timeout=30)
                answer = r.json()
            except (httpx.HTTPError, ValueError):
                answer = None  # that sidecar is down, or the connection dropped
            else:
                assert r.status_code in {200, 503}, (path, r.status_code, r.text)
                code = answer.get("errorCode", 0)
                if r.status_code == 200 and not _retriable(code):
                    return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} found no sidecar able to answer: {answer}")
            self.retries += 1
            time.sleep(0.2)

    def init(self, tid: str) -> tuple[int, int]:
        body = self.post(
            "/v1/init-producer-id", {"transactionalId": tid, "transactionTimeoutMs": 60_000}
        )
        assert body["errorCode"] == 0, body
        return body["producerId"], body["producerEpoch"]

    def produce(self, tid: str, batches: list[dict[str, Any]]) -> None:
        """Every batch journaled (0, or 46 for a retry of one already journaled)."""
        left = batches
        while left:
            answer = self.post("/v1/produce", {"transactionalId": tid, "batches": left})
            again = []
            for b, result in zip(left, answer["results"], strict=True):
                code = result["errorCode"]
                if _retriable(code):
                    again.append(b)
                elif code not in {0, errors.DuplicateSequenceNumber.errno}:
                    raise Unsure(f"produce answered {result}")
            if again:
                self.retries += 1
                time.sleep(0.2)
            left = again

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> None:
        body = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch}
        answer = self.post("/v1/end-txn", {**body, "commit": commit})
        if answer["errorCode"] != 0:
            raise Unsure(f"end-txn answered {answer}")


def _retriable(code: int) -> bool:
    return code != 0 and errors.error_for_code(code).retriable


def _kills(sidecar: ProcessSidecar, broker: Any, progress: list[int], log: list[str]) -> None:
    """SIGKILL the first sidecar a third of the way in (restarted at once), then the
    broker two thirds of the way in (restarted after 2 s)."""
    while progress[0] < TRANSACTIONS // 3:
        time.sleep(0.01)
    sidecar.kill()
    log.append(f"sidecar killed at transaction {progress[0]}")
    sidecar.start()
    while progress[0] < 2 * TRANSACTIONS // 3:
        time.sleep(0.01)
    broker.kill()
    log.append(f"broker killed at transaction {progress[0]}")
    time.sleep(2)
    broker.start()
    log.append(f"broker back at transaction {progress[0]}")


def _stream(
    client: Client, tids: list[str], topics: list[str], rng: random.Random, progress: list[int]
) -> tuple[dict[str, str], dict[str, int]]:
    """The transactions, round robin over ``tids``: per transaction tag, its outcome as
    the client learned it (committed, aborted or unsure) and how many records it wrote."""
    outcome: dict[str, str] = {}
    expected: dict[str, int] = {}
    producers = {tid: client.init(tid) for tid in tids}
    sequences: Counter[tuple[str, str, int]] = Counter()
    for n in range(TRANSACTIONS):
        tid = tids[n % len(tids)]
        pid, epoch = producers[tid]
        tag = f"{tid}#{n}|"
        batches = []
        for topic, partition in rng.sample([(t, p) for t in topics for p in (0, 1)], 3):
            count = rng.randint(1, 4)
            seq = sequences[(tid, topic, partition)]
            batches.append(batch(topic, pid, seq, count, epoch=epoch, partition=partition, tag=tag))
            sequences[(tid, topic, partition)] = seq + count
        expected[tag] = sum(len(b["records"]) for b in batches)
        commit = rng.random() < 0.7
        try:
            client.produce(tid, batches)
            client.end(tid, pid, epoch, commit)
            outcome[tag] = "committed" if commit else "aborted"
        except Unsure:
            outcome[tag] = "unsure"
            producers[tid] = client.init(tid)  # fences the open transaction, if any
            for k in [k for k in sequences if k[0] == tid]:
                del sequences[k]  # a new epoch starts its sequences at 0
        progress[0] = n + 1
    return outcome, expected


def _read(client: Any, topics: list[str]) -> tuple[Counter[str], list[str]]:
    """Records per transaction tag, and the records read more than once (a value names
    its sequence, so it is unique within its partition)."""
    seen: Counter[str] = Counter()
    duplicated = []
    for t in topics:
        for p in (0, 1):
            values = Counter(m.data().decode() for m in read_all(client, f"{NS}/{t}-partition-{p}"))
            duplicated += [f"{t}-{p}: {v} x{n}" for v, n in values.items() if n > 1]
            for value, n in values.items():
                seen[value.split("|", 1)[0] + "|"] += n
    return seen, duplicated


def test_a_stream_of_transactions_with_random_aborts_through_both_kinds_of_kill_is_exact(
    spark, pulsar_control, tmp_path, pulsar_reader_client
):
    from kop_dedup.spark.audit import audit
    from kop_dedup_tools.topics import create_topic

    rng = random.Random(11)
    first = ProcessSidecar(pulsar_control, tmp_path, **FAST).start()  # makes the namespace
    second = ProcessSidecar(pulsar_control, tmp_path, **FAST).start()
    topics = [uniq("ts"), uniq("ts")]
    for t in topics:
        create_topic(pulsar_control.admin_url, t, partitions=2)
    tids = [uniq("tid") for _ in range(3)]
    client = Client([first.url, second.url], rng)
    progress, log = [0], []
    killer = threading.Thread(
        target=_kills, args=(first, pulsar_control, progress, log), daemon=True
    )
    try:
        killer.start()
        outcome, expected = _stream(client, tids, topics, rng, progress)
        killer.join(timeout=180)
        assert not killer.is_alive(), log
        for tid in tids:
            wait_until(
                f"{tid}'s last transaction to complete",
                lambda tid=tid: (
                    httpx.get(f"{second.url}/v1/transactions/{tid}", timeout=30).json().get("state")
                    in {"CompleteCommit", "CompleteAbort", "Empty"}
                ),
                timeout=120,
            )
    finally:
        first.stop()
        second.stop()

    seen, duplicated = _read(pulsar_reader_client, topics)
    assert duplicated == [], duplicated
    for tag, state in outcome.items():
        want = {"committed": {expected[tag]}, "aborted": {0}}.get(state, {0, expected[tag]})
        assert seen[tag] in want, (tag, state, seen[tag], log)
    committed = sum(1 for s in outcome.values() if s == "committed")
    aborted = sum(1 for s in outcome.values() if s == "aborted")
    print(
        f"\n{TRANSACTIONS} transactions: {committed} committed, {aborted} aborted, "
        f"{len(outcome) - committed - aborted} unsure; {client.retries} retries; {log}"
    )
    assert committed >= TRANSACTIONS // 3  # the stream went on through both kills
    assert aborted >= 1

    report = audit(
        spark,
        topics,
        service_url=pulsar_control.service_url,
        admin_url=pulsar_control.admin_url,
        system_namespace=SESSION_SYSTEM_NAMESPACE,  # the sidecars' decisions
        progress=False,
    )
    print(report.render())
    assert (report.duplicates, report.missing) == (0, 0)
    assert report.txn_incomplete == 0
    assert report.txn_aborted_visible == 0
    assert report.txn_undecided_visible == 0
    assert report.txn_committed >= committed
    assert report.records == sum(seen[t] for t, s in outcome.items() if s != "aborted")
    assert report.ok
