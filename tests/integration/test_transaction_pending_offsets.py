"""Offsets of two transactions pending on one group partition, against the real broker
through two sidecars: each transaction keeps its own marker, so the abort of one never
drops the offsets another committed, and a stable fetch answers 88 while either is
pending."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import init_txn, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

Pair = tuple[httpx.Client, httpx.Client, ThreadSidecar, ThreadSidecar]


@pytest.fixture(scope="module")
def pair(pulsar: Any) -> Iterator[Pair]:
    """Clients of sidecar A, which applies decisions 3 s late, and sidecar B (at once), two
    nodes of one cluster of their own."""
    with (
        ThreadSidecar(pulsar, txn_apply_delay_ms=3000, system_namespace=uniq("sys")) as a,
        ThreadSidecar(pulsar, cluster_of=a) as b,
        httpx.Client(base_url=a.url, timeout=60) as api_a,
        httpx.Client(base_url=b.url, timeout=60) as api_b,
    ):
        wait_until("A and B to list each other", lambda: len(a.runtime.cluster.members) == 2)
        yield api_a, api_b, a, b


def ids_coordinated_by(first: ThreadSidecar, second: ThreadSidecar) -> tuple[str, str]:
    """Two fresh transactional ids, the first coordinated by ``first``, the second by
    ``second`` (so each decision is applied where the test expects it)."""
    cluster = first.runtime.cluster

    def by(node: ThreadSidecar) -> str:
        me = node.runtime.cluster.me.node_id
        return next(
            t for t in (uniq("tx") for _ in range(1000)) if cluster.txn_coordinator(t).node_id == me
        )

    return by(first), by(second)


def stage(api: httpx.Client, tid: str, pid: int, epoch: int, group: str, tp: Any, at: int) -> None:
    body = {
        "transactionalId": tid,
        "producerId": pid,
        "producerEpoch": epoch,
        "groupId": group,
        "offsets": [{"topic": tp[0], "partition": tp[1], "offset": at}],
    }
    r = api.post("/v1/txn-offset-commit", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["errorCode"] == 0, r.text


def end(api: httpx.Client, tid: str, pid: int, epoch: int, *, commit: bool) -> None:
    body = {"transactionalId": tid, "producerId": pid, "producerEpoch": epoch, "commit": commit}
    r = api.post("/v1/end-txn", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["errorCode"] == 0, r.text


def state(api: httpx.Client, tid: str) -> str:
    r = api.get(f"/v1/transactions/{tid}")
    assert r.status_code == 200, r.text
    return str(r.json()["state"])


def fetched(api: httpx.Client, group: str, tp: Any) -> tuple[int, int]:
    """(offset, error code) of a stable fetch of one partition."""
    r = api.get(f"/v1/groups/{group}/offsets", params={"requireStable": "true"})
    assert r.status_code == 200, r.text
    found = {(o["topic"], o["partition"]): o for o in r.json()["offsets"]}
    return int(found[tp]["offset"]), int(found[tp]["errorCode"])


@pytest.mark.parametrize(("first_commits", "kept"), [(True, 100), (False, 50)])
def test_the_end_of_one_transaction_never_undoes_another_s_offsets(pair, first_commits, kept):
    """T1 stages (G, p) = 100 and ends (coordinated by sidecar A, which applies it late);
    T2 stages (G, p) = 50 and ends the other way (coordinated by sidecar B, applied at
    once). The partition stays unstable (88) until T1's decision is applied too, then
    holds what the committed one staged: T1's 100 (T2 aborted), or T2's 50 (T1
    aborted)."""
    api_a, api_b, a, b = pair
    tid1, tid2 = ids_coordinated_by(a, b)
    group, tp = uniq("g"), (uniq("src"), 0)
    r = api_a.post(
        f"/v1/groups/{group}/offsets",
        json={"offsets": [{"topic": tp[0], "partition": tp[1], "offset": 10}]},
    )
    assert r.json()["errorCode"] == 0, r.text
    pid1, epoch1 = init_txn(api_a, tid1)
    pid2, epoch2 = init_txn(api_b, tid2)
    stage(api_a, tid1, pid1, epoch1, group, tp, 100)
    end(api_a, tid1, pid1, epoch1, commit=first_commits)
    stage(api_b, tid2, pid2, epoch2, group, tp, 50)
    assert fetched(api_b, group, tp) == (-1, 88)
    end(api_b, tid2, pid2, epoch2, commit=not first_commits)
    expected = "CompleteAbort" if first_commits else "CompleteCommit"
    wait_until("T2 applied", lambda: state(api_b, tid2) == expected)
    assert state(api_a, tid1) in {"PrepareCommit", "PrepareAbort"}, "T1 applied too early"
    for api in (api_a, api_b):
        assert fetched(api, group, tp) == (-1, 88), "T1's offsets are pending"
    wait_until("T1 applied", lambda: state(api_a, tid1).startswith("Complete"))
    for api in (api_a, api_b):
        assert fetched(api, group, tp) == (kept, 0)


def test_offset_delete_drops_the_pending_offsets_of_every_transaction(pair):
    """OffsetDelete of a partition two transactions staged removes both markers (the
    partition is stable and listed no more), and the commit of either one afterwards
    leaves the partition alone (Kafka's tombstone drops pending offsets too)."""
    _, api, _, sc = pair
    tid1, tid2 = ids_coordinated_by(sc, sc)
    cluster = sc.runtime.cluster  # the deletion runs on sc: the group's coordinator
    group = next(
        g for g in (uniq("g") for _ in range(1000)) if cluster.is_me(cluster.group_coordinator(g))
    )
    tp = (uniq("src"), 0)
    pid1, epoch1 = init_txn(api, tid1)
    pid2, epoch2 = init_txn(api, tid2)
    stage(api, tid1, pid1, epoch1, group, tp, 100)
    stage(api, tid2, pid2, epoch2, group, tp, 50)
    assert fetched(api, group, tp) == (-1, 88)
    deleted = sc.call(sc.runtime.group_deletion.delete_offsets(group, [(tp[0], [tp[1]])]))
    assert deleted == [(tp[0], [(tp[1], None)])]
    r = api.get(f"/v1/groups/{group}/offsets", params={"requireStable": "true"})
    assert r.json()["offsets"] == [], r.text
    end(api, tid1, pid1, epoch1, commit=True)
    wait_until("T1 applied", lambda: state(api, tid1) == "CompleteCommit")
    r = api.get(f"/v1/groups/{group}/offsets", params={"requireStable": "true"})
    assert r.json()["offsets"] == [], r.text


def test_a_zombie_members_offsets_are_refused_by_the_groups_coordinator_on_another_node(
    pulsar, pair
):
    """KIP-447 across nodes: the transaction is coordinated by A, the group by B, so the
    pending marker is written by B on A's call. The group moves to generation g+1 on B
    after A checked the member of g and before B writes the marker (g+1 fetches the
    committed offset meanwhile): B checks the member in the marker's change and A
    answers 22; nothing is staged, no marker is left."""
    from kop_dedup_tools.topics import create_topic

    api_a, _, a, b = pair
    tid, _ = ids_coordinated_by(a, b)
    cluster = b.runtime.cluster
    group = next(
        g for g in (uniq("g") for _ in range(1000)) if cluster.is_me(cluster.group_coordinator(g))
    )
    source = uniq("src")
    create_topic(pulsar.admin_url, source, partitions=1)  # a join creates no topic
    r = api_a.post(f"/v1/groups/{group}/members", json={"topics": [source]})
    assert r.status_code == 200, r.text
    zombie = r.json()
    pid, epoch = init_txn(api_a, tid)
    store, groups = b.runtime.offsets, b.runtime.groups
    marking = store.mark_pending
    generations: list[int] = []

    async def after_a_rebalance(*args: Any, **kwargs: Any) -> Any:
        """On B, the group's coordinator: the group moves on before the marker."""
        if not generations:
            generations.append((await groups.join(group, None, [source])).generation)
            await store.fetch(group, require_stable=True)
        return await marking(*args, **kwargs)

    store.mark_pending = after_a_rebalance
    try:
        body = {
            "transactionalId": tid,
            "producerId": pid,
            "producerEpoch": epoch,
            "groupId": group,
            "offsets": [{"topic": source, "partition": 0, "offset": 5}],
            "memberId": zombie["memberId"],
            "generation": zombie["generation"],
        }
        r = api_a.post("/v1/txn-offset-commit", json=body)
    finally:
        del store.mark_pending
    assert generations == [zombie["generation"] + 1], generations
    assert r.status_code == 200, r.text
    assert r.json()["errorCode"] == 22, f"the zombie's offsets were staged: {r.text}"
    assert api_a.get(f"/v1/transactions/{tid}").json()["offsets"] == []
    r = api_a.get(f"/v1/groups/{group}/offsets", params={"requireStable": "true"})
    assert all(o["errorCode"] == 0 for o in r.json()["offsets"]), r.text
