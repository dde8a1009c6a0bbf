"""Late requests never decide the next transaction (``transactionToken``: KIP-890's
protection over HTTP), and transactional offsets are fenced like a member's commit
(KIP-447: ``memberId`` and ``generation``). Real broker; the late requests through a
second sidecar of the cluster (one that coordinates neither: it forwards them) that was
paused while it held them."""

from __future__ import annotations

import http.client
import json
import os
import signal
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from kop_dedup.cluster.placement import GROUP_LOG, TRANSACTION_LOG
from kop_dedup.coordination.partitions import partition_of
from kop_dedup_tools.topics import create_topic
from tests.helpers import batch, newcomer_owning_none, read_all, uniq, wait_until
from tests.sidecar import ProcessSidecar, ThreadSidecar

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"
FAST = {"txn_sweep_interval_ms": 100}
LOUD = {**FAST, "log_level": "INFO"}


def call(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def init(url: str, tid: str) -> tuple[int, int]:
    body = call(url, "/v1/init-producer-id", {"transactionalId": tid})
    assert body["errorCode"] == 0, body
    return body["producerId"], body["producerEpoch"]


def produce(url: str, tid: str, token: str, *batches: dict[str, Any]) -> list[int]:
    body = {"transactionalId": tid, "transactionToken": token, "batches": list(batches)}
    return [r["errorCode"] for r in call(url, "/v1/produce", body)["results"]]


def described(url: str, tid: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/transactions/{tid}", timeout=30).json()


def stable_offsets(url: str, group: str) -> dict[tuple[str, int], dict[str, Any]]:
    r = httpx.get(f"{url}/v1/groups/{group}/offsets", params={"requireStable": "true"}, timeout=30)
    assert r.status_code == 200, r.text
    return {(o["topic"], o["partition"]): o for o in r.json()["offsets"]}


def _forwarding(b: ThreadSidecar, tid: str, group: str | None = None) -> int:
    """A node id for the sidecar that holds the late requests: one of b's cluster that
    coordinates neither the transactional id nor the group (it forwards them to b; a
    frozen coordinator would hold b's own requests until the broker dropped it)."""
    s = b.settings
    things = [(TRANSACTION_LOG, s.txn_log_partitions, partition_of(tid, s.txn_log_partitions))]
    if group is not None:
        things.append((GROUP_LOG, s.offsets_partitions, partition_of(group, s.offsets_partitions)))
    return newcomer_owning_none(b.runtime.cluster.me.node_id, things)


class Late:
    """A request handed to a sidecar (its bytes in the sidecar's socket) whose answer is
    read later: what a client that timed out leaves behind."""

    def __init__(self, url: str, path: str, body: dict[str, Any]) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
        self.conn.request(
            "POST", path, json.dumps(body), headers={"content-type": "application/json"}
        )

    def answer(self) -> dict[str, Any]:
        try:
            r = self.conn.getresponse()
            assert r.status == 200, r.read()
            return dict(json.loads(r.read()))
        finally:
            self.conn.close()


def test_a_late_end_txn_never_decides_the_next_transaction(pulsar, tmp_path, pulsar_reader_client):
    """Transaction 1's end-txn is held by a paused sidecar; the client retries it through
    another (committed), then begins transaction 2. The paused sidecar resumes and
    serves the late commit and a late abort of transaction 1: they are answered from
    transaction 1's decision (0, then 48) and transaction 2 stays open."""
    tid, topic = uniq("tx"), uniq("a")
    with ThreadSidecar(pulsar, **FAST) as b:
        a = ProcessSidecar(pulsar, tmp_path, node_id=_forwarding(b, tid), **LOUD).start()
        try:
            pid, epoch = init(b.url, tid)
            ids = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch}
            assert produce(a.url, tid, "n1", batch(topic, pid, 0, 2, epoch=epoch)) == [0]
            os.kill(a.pid, signal.SIGSTOP)
            try:
                late = [
                    Late(a.url, "/v1/end-txn", {**ids, "commit": c, "transactionToken": "n1"})
                    for c in (True, False)
                ]
                retried = {**ids, "commit": True, "transactionToken": "n1"}
                assert call(b.url, "/v1/end-txn", retried)["errorCode"] == 0
                wait_until(
                    "transaction 1 to commit",
                    lambda: described(b.url, tid)["state"] == "CompleteCommit",
                    60,
                )
                assert produce(b.url, tid, "n2", batch(topic, pid, 2, 2, epoch=epoch)) == [0]
            finally:
                os.kill(a.pid, signal.SIGCONT)
            commit, abort = (x.answer() for x in late)
            assert commit["errorCode"] == 0, commit  # transaction 1's decision, repeated
            assert abort["errorCode"] == 48, abort  # not transaction 1's decision
            now = described(b.url, tid)
            assert (now["ordinal"], now["state"]) == (2, "Ongoing"), now
            assert {(p["topic"], p["partition"]) for p in now["partitions"]} == {(topic, 0)}
            end2 = {**ids, "commit": False, "transactionToken": "n2"}
            assert call(b.url, "/v1/end-txn", end2)["errorCode"] == 0
            wait_until(
                "transaction 2 to abort",
                lambda: described(b.url, tid)["state"] == "CompleteAbort",
                60,
            )
        finally:
            a.stop()
    values = [
        m.data().decode() for m in read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0")
    ]
    assert values == [f"{pid}:{epoch}:0", f"{pid}:{epoch}:1"]


def test_a_late_txn_offset_commit_never_stages_into_the_next_transaction(pulsar, tmp_path):
    """Transaction 1 stages offset 10 through a paused sidecar; the client retries through
    another and commits; transaction 2 stages 20. The late staging of 10 is refused (48:
    its transaction is complete) and transaction 2 commits 20, not 10."""
    tid, topic, group, source = uniq("tx"), uniq("a"), uniq("g"), uniq("src")
    with ThreadSidecar(pulsar, **FAST) as b:
        a = ProcessSidecar(pulsar, tmp_path, node_id=_forwarding(b, tid, group), **LOUD).start()
        try:
            pid, epoch = init(b.url, tid)
            ids = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch}

            def stage(offset: int, token: str) -> dict[str, Any]:
                return {
                    **ids,
                    "groupId": group,
                    "offsets": [{"topic": source, "partition": 0, "offset": offset}],
                    "transactionToken": token,
                }

            assert produce(b.url, tid, "n1", batch(topic, pid, 0, 1, epoch=epoch)) == [0]
            os.kill(a.pid, signal.SIGSTOP)
            try:
                late = Late(a.url, "/v1/txn-offset-commit", stage(10, "n1"))
                assert call(b.url, "/v1/txn-offset-commit", stage(10, "n1"))["errorCode"] == 0
                end1 = {**ids, "commit": True, "transactionToken": "n1"}
                assert call(b.url, "/v1/end-txn", end1)["errorCode"] == 0
                wait_until(
                    "transaction 1 to commit",
                    lambda: described(b.url, tid)["state"] == "CompleteCommit",
                    60,
                )
                assert stable_offsets(b.url, group)[(source, 0)]["offset"] == 10
                assert produce(b.url, tid, "n2", batch(topic, pid, 1, 1, epoch=epoch)) == [0]
                assert call(b.url, "/v1/txn-offset-commit", stage(20, "n2"))["errorCode"] == 0
            finally:
                os.kill(a.pid, signal.SIGCONT)
            refused = late.answer()
            assert refused["errorCode"] == 48, refused
            now = described(b.url, tid)
            assert now["ordinal"] == 2, now
            assert [o["offset"] for o in now["offsets"]] == [20], now
            end2 = {**ids, "commit": True, "transactionToken": "n2"}
            assert call(b.url, "/v1/end-txn", end2)["errorCode"] == 0
            wait_until(
                "transaction 2 to commit",
                lambda: described(b.url, tid)["state"] == "CompleteCommit",
                60,
            )
            assert stable_offsets(b.url, group)[(source, 0)]["offset"] == 20
        finally:
            a.stop()


def test_a_token_names_its_transaction_and_refuses_what_belongs_to_no_open_one(pulsar):
    """One sidecar, the rules on their own: the first request binds the token; another
    token never joins, stages into or ends the open transaction (48); requests without
    a token behave as before."""
    tid, topic, group = uniq("tx"), uniq("a"), uniq("g")
    with ThreadSidecar(pulsar, **FAST) as sc:
        pid, epoch = init(sc.url, tid)
        ids = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch}
        offsets = {"groupId": group, "offsets": [{"topic": "src", "partition": 0, "offset": 1}]}
        assert produce(sc.url, tid, "t1", batch(topic, pid, 0, 1, epoch=epoch)) == [0]
        assert produce(sc.url, tid, "t1", batch(topic, pid, 1, 1, epoch=epoch)) == [0]
        assert produce(sc.url, tid, "other", batch(topic, pid, 2, 1, epoch=epoch)) == [48]
        stage = {**ids, **offsets, "transactionToken": "other"}
        assert call(sc.url, "/v1/txn-offset-commit", stage)["errorCode"] == 48
        end = {**ids, "commit": True}
        assert call(sc.url, "/v1/end-txn", {**end, "transactionToken": "other"})["errorCode"] == 48
        assert described(sc.url, tid)["state"] == "Ongoing"
        assert call(sc.url, "/v1/end-txn", {**end, "transactionToken": "t1"})["errorCode"] == 0
        wait_until("the commit", lambda: described(sc.url, tid)["state"] == "CompleteCommit", 60)
        # the same decision again: 0; an end-txn naming no transaction: 48
        assert call(sc.url, "/v1/end-txn", {**end, "transactionToken": "t1"})["errorCode"] == 0
        assert call(sc.url, "/v1/end-txn", {**end, "transactionToken": "t9"})["errorCode"] == 48
        # a produce naming a complete transaction never begins another
        assert produce(sc.url, tid, "t1", batch(topic, pid, 2, 1, epoch=epoch)) == [48]
        assert described(sc.url, tid)["ordinal"] == 1
        # without a token: as before
        body = {"transactionalId": tid, "batches": [batch(topic, pid, 2, 1, epoch=epoch)]}
        assert [r["errorCode"] for r in call(sc.url, "/v1/produce", body)["results"]] == [0]
        assert call(sc.url, "/v1/end-txn", end)["errorCode"] == 0


def test_txn_offset_commit_with_a_member_is_fenced_like_the_members_commit(pulsar):
    """KIP-447: a stale generation answers 22 ILLEGAL_GENERATION, an unknown member 25
    UNKNOWN_MEMBER_ID, and nothing is staged; the current member and generation stage."""
    tid, topic, group, source = uniq("tx"), uniq("a"), uniq("g"), uniq("src")
    create_topic(pulsar.admin_url, source, partitions=1)  # a join creates no topic
    with ThreadSidecar(pulsar, **FAST) as sc, httpx.Client(base_url=sc.url, timeout=60) as api:
        first = api.post(f"/v1/groups/{group}/members", json={"topics": [source]}).json()
        joined = api.post(f"/v1/groups/{group}/members", json={"topics": [source]}).json()
        member, generation = first["memberId"], joined["generation"]
        assert generation > first["generation"]
        pid, epoch = init(sc.url, tid)
        assert produce(sc.url, tid, "t", batch(topic, pid, 0, 1, epoch=epoch)) == [0]
        base = {
            "transactionalId": tid,
            "producerId": pid,
            "producerEpoch": epoch,
            "groupId": group,
            "offsets": [{"topic": source, "partition": 0, "offset": 5}],
        }
        stale = {**base, "memberId": member, "generation": generation - 1}
        assert call(sc.url, "/v1/txn-offset-commit", stale)["errorCode"] == 22
        unknown = {**base, "memberId": uniq("nobody"), "generation": generation}
        assert call(sc.url, "/v1/txn-offset-commit", unknown)["errorCode"] == 25
        assert described(sc.url, tid)["offsets"] == []
        assert (source, 0) not in stable_offsets(sc.url, group)  # no pending marker either
        current = {**base, "memberId": member, "generation": generation}
        assert call(sc.url, "/v1/txn-offset-commit", current)["errorCode"] == 0
        assert [o["offset"] for o in described(sc.url, tid)["offsets"]] == [5]
        assert stable_offsets(sc.url, group)[(source, 0)]["errorCode"] == 88


def test_a_zombie_members_offsets_are_refused_when_the_group_moves_on_before_the_marker(pulsar):
    """KIP-447's check and the pending-offset marker in one step. A member of generation
    g stages offsets; the group moves to g+1 (another member joins) after the member was
    checked and before the marker is written, and g+1 fetches the committed offset (3,
    stable: no marker yet). The zombie's offsets were staged all the same (0) and its
    commit moved the group to 5 while g+1 processed from 3 too: both processed the same
    input. The marker's change checks the member itself now: 22, nothing staged."""
    from kop_dedup.coordination.groups.store import StagedOffset

    tid, topic, group, source = uniq("tx"), uniq("a"), uniq("g"), uniq("src")
    create_topic(pulsar.admin_url, source, partitions=1)  # a join creates no topic
    with ThreadSidecar(pulsar, **FAST) as sc:
        zombie = call(sc.url, f"/v1/groups/{group}/members", {"topics": [source]})
        store, groups = sc.runtime.offsets, sc.runtime.groups
        sc.call(store.commit(group, [StagedOffset(source, 0, 3, "", None)]))
        pid, epoch = init(sc.url, tid)
        assert produce(sc.url, tid, "t", batch(topic, pid, 0, 1, epoch=epoch)) == [0]
        marking = store.mark_pending
        seen: list[tuple[int, list[Any]]] = []

        async def after_a_rebalance(*args: Any, **kwargs: Any) -> Any:
            """The group moves on between the member check and the marker's write."""
            if not seen:
                joined = await groups.join(group, None, [source])
                fetched = await store.fetch(group, require_stable=True)
                seen.append((joined.generation, [(o.offset, o.error) for o in fetched]))
            return await marking(*args, **kwargs)

        store.mark_pending = after_a_rebalance
        try:
            body = {
                "transactionalId": tid,
                "producerId": pid,
                "producerEpoch": epoch,
                "transactionToken": "t",
                "groupId": group,
                "offsets": [{"topic": source, "partition": 0, "offset": 5}],
                "memberId": zombie["memberId"],
                "generation": zombie["generation"],
            }
            answer = call(sc.url, "/v1/txn-offset-commit", body)
        finally:
            del store.mark_pending
        assert seen == [(zombie["generation"] + 1, [(3, None)])], seen
        assert answer["errorCode"] == 22, f"the zombie's offsets were staged: {answer}"
        assert described(sc.url, tid)["offsets"] == []
        assert stable_offsets(sc.url, group)[(source, 0)]["errorCode"] == 0  # no marker
        end = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch}
        assert call(sc.url, "/v1/end-txn", {**end, "commit": True})["errorCode"] == 0
        assert stable_offsets(sc.url, group)[(source, 0)]["offset"] == 3
