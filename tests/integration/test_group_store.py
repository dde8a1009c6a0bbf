"""The group store against the real broker: writes travel while the next change runs
(not under the partition's lock), and a write that failed is never taken for stored.

The stores here stand for the nodes of a cluster: :func:`take` is the cluster naming one
of them the partition's owner (with no hand-off wait: a takeover from a live owner, as
when two nodes' views of the members differ for a moment)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pulsar as pulsar_client
import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup import errors
from kop_dedup.coordination.groups.store import GroupStore, StagedOffset, key
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming
from kop_dedup_tools.registry_startup import delete_namespace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def namespace(pulsar: Any) -> Iterator[str]:
    ns = f"public/kop-dedup-group-store-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        r = admin.put(f"/admin/v2/namespaces/{ns}")
        assert r.status_code == 204, r.text
    yield ns
    with httpx.Client(base_url=pulsar.admin_url, timeout=30) as admin:
        deadline = time.monotonic() + 30  # a topic whose last client just left may refuse
        while (topics := admin.get(f"/admin/v2/persistent/{ns}/partitioned").json()) and (
            time.monotonic() < deadline
        ):
            for topic in topics:
                path = topic.removeprefix("persistent://")
                admin.delete(f"/admin/v2/persistent/{path}/partitions", params={"force": "true"})
    asyncio.run(delete_namespace(pulsar.admin_url, ns))


async def _stores(pulsar: Any, topic: str, n: int) -> list[tuple[Any, PulsarAdmin, GroupStore]]:
    out = []
    for _ in range(n):
        client = pulsar_async.Client(
            pulsar.service_url, logger=pulsar_client.ConsoleLogger(pulsar_client.LoggerLevel.Error)
        )
        admin = PulsarAdmin(pulsar.admin_url, Naming("public", "kafka", "kop"))
        store = GroupStore(client, admin, topic, 1, handoff_wait_s=0)
        if not out:  # creates the topic
            await store.start()
        out.append((client, admin, store))
    return out


async def take(store: GroupStore) -> None:
    """The cluster names ``store``'s node the owner of partition 0 (after a view in which
    it was not: the node lets go of whatever it held): it loads it, fencing a previous
    owner at once, and this returns once it has."""
    store.parts.assign(set())
    store.parts.assign({0})
    assert await store.parts.loaded(30), "the partition did not load"


async def _close(stores: list[tuple[Any, PulsarAdmin, GroupStore]]) -> None:
    for client, admin, store in stores:
        await store.close()
        await admin.close()
        await client.close()


@pytest.mark.parametrize("failed_before_the_change_ends", [False, True])
def test_writes_fenced_after_the_view_had_them_are_read_again_from_the_log(
    pulsar, namespace, failed_before_the_change_ends
):
    """Sidecar A's change writes a key twice after sidecar B took the partition (and wrote
    the key once): A's writes fail (while the change runs, or after), the change answers
    NOT_COORDINATOR, and once A owns the partition again it sees B's record, not its own
    versions that were never stored (they are newer than B's, so catching up alone
    would keep them)."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"
    k = key("o", "g", "t", 0)

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 3)
        (_, _, a), (_, _, b), (_, _, c) = stores
        try:
            await take(a)
            await a.owned("g", lambda p: a.write(p, k, {"by": "a"}))
            runs = []

            async def change(p: int) -> Any:
                runs.append(a.view_doc(p, k))
                await take(b)
                await b.owned("g", lambda q: b.write(q, k, {"by": "b"}))
                await a.write(p, k, {"by": "a-not-stored-1"})
                await a.write(p, k, {"by": "a-not-stored-2"})
                deadline = asyncio.get_running_loop().time() + 30
                while failed_before_the_change_ends and a.parts.owned(p):
                    assert asyncio.get_running_loop().time() < deadline, "never fenced"
                    await asyncio.sleep(0.01)
                return a.view_doc(p, k)

            with pytest.raises(errors.NotCoordinator):
                await asyncio.wait_for(a.owned("g", change), 60)
            assert runs == [{"by": "a", "v": 1}]
            await take(a)  # the cluster names A again: it decides on what is stored

            async def look(p: int) -> Any:
                return a.view_doc(p, k)

            seen = await a.owned("g", look)
            assert seen == {"by": "b", "v": 2}, "A decided on writes never stored"
            await c.read("g")
            assert c.doc("g", "o", "t", 0) == {"by": "b", "v": 2}
            await a.owned("g", lambda p: a.write(p, k, {"by": "a-again"}))
            await c.read("g")
            assert c.doc("g", "o", "t", 0) == {"by": "a-again", "v": 3}
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_changes_of_one_partition_answer_once_their_writes_are_stored(pulsar, namespace):
    """Many concurrent changes (the members of one group): every one answered is stored,
    read back by another sidecar, with one version per write."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, _, b) = stores
        try:
            await take(a)

            async def bump(m: int, i: int) -> None:
                await a.owned("g", lambda p: a.write(p, key("d", "g", f"m{m}", "t", 0), {"i": i}))

            for i in range(5):
                await asyncio.gather(*(bump(m, i) for m in range(8)))
            await b.read("g")
            for m in range(8):
                assert b.doc("g", "d", f"m{m}", "t", 0) == {"i": 4, "v": 5}
        finally:
            await _close(stores)

    asyncio.run(scenario())


async def _committed(store: GroupStore, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(offset, error code) per partition, as a stable fetch answers."""
    answers = await store.fetch(group, require_stable=True)
    return {(a.topic, a.partition): (a.offset, a.error.errno if a.error else 0) for a in answers}


def test_replaying_a_committed_transaction_never_writes_its_offsets_again(pulsar, namespace):
    """A commit applied twice (a crash between the offsets and CompleteCommit, or a
    retried CompleteCommit) is a no-op the second time, also after a newer transaction
    of the same id moved the offset on, and read through another sidecar."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"
    t1 = StagedOffset("in", 0, 10, "first")
    t2 = StagedOffset("in", 0, 20, "second")

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, _, b) = stores
        try:
            await take(a)
            await a.mark_pending("g", [("in", 0)], "tx", 1)
            assert await a.commit_transaction("g", "tx", 1, [t1]) == [t1]
            assert await a.commit_transaction("g", "tx", 1, [t1]) == []  # replayed at once
            assert await _committed(a, "g") == {("in", 0): (10, 0)}
            await take(b)  # the next transaction, on the group's next coordinator
            await b.mark_pending("g", [("in", 0)], "tx", 2)
            assert await b.commit_transaction("g", "tx", 2, [t2]) == [t2]
            await take(a)
            assert await a.commit_transaction("g", "tx", 1, [t1]) == []  # a late replay
            for store in (a, b):
                assert await _committed(store, "g") == {("in", 0): (20, 0)}
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_a_plain_commit_keeps_a_pending_transaction_marker_and_wins_over_it(pulsar, namespace):
    """A plain commit between a transaction's TxnOffsetCommit and its commit: the
    partition stays unstable (88) until the transaction ends, and the later plain commit
    is what stays committed (Kafka's completePendingTxnOffsetCommit); a partition with
    no plain commit since the mark gets the transaction's offset."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 1)
        ((_, _, a),) = stores
        try:
            await take(a)
            await a.commit("g", [StagedOffset("in", 0, 1)])
            await a.mark_pending("g", [("in", 0), ("in", 1)], "tx", 1)
            await a.commit("g", [StagedOffset("in", 0, 5)])
            assert (await _committed(a, "g"))[("in", 0)][1] == 88
            applied = await a.commit_transaction(
                "g", "tx", 1, [StagedOffset("in", 0, 3), StagedOffset("in", 1, 7)]
            )
            assert applied == [StagedOffset("in", 1, 7)]
            assert await _committed(a, "g") == {("in", 0): (5, 0), ("in", 1): (7, 0)}
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_ending_a_transaction_removes_only_its_own_markers(pulsar, namespace):
    """An abort (or a commit) of one transaction leaves the markers another transaction
    (or a later one of the same id) wrote on the same group's partitions."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 1)
        ((_, _, a),) = stores
        try:
            await take(a)
            await a.mark_pending("g", [("in", 0)], "tx-a", 1)
            await a.mark_pending("g", [("in", 1)], "tx-b", 4)
            await a.mark_pending("g", [("in", 2)], "tx-a", 2)
            keys = [("in", 0), ("in", 1), ("in", 2)]
            await a.abort_transaction("g", keys, "tx-a", 1)
            assert await _committed(a, "g") == {
                ("in", 1): (-1, 88),
                ("in", 2): (-1, 88),
            }
            staged = [StagedOffset("in", p, 9) for p in range(3)]
            assert await a.commit_transaction("g", "tx-b", 4, staged) == [staged[1]]
            assert await _committed(a, "g") == {("in", 1): (9, 0), ("in", 2): (-1, 88)}
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_the_abort_of_one_transaction_keeps_the_offsets_another_staged(pulsar, namespace):
    """Two transactional ids stage the same partition: each keeps its own marker, so
    the second one's abort leaves the first one pending (88) and its commit applies
    (one marker per partition named only the last: the abort removed it and the first
    one's commit found nothing of its own, keeping the old offset)."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, _, b) = stores
        try:
            await take(a)
            await a.commit("g", [StagedOffset("in", 0, 10)])
            await a.mark_pending("g", [("in", 0)], "t1", 1)
            await take(b)  # the group's coordinator moved
            await b.mark_pending("g", [("in", 0)], "t2", 7)
            await b.abort_transaction("g", [("in", 0)], "t2", 7)
            assert await _committed(a, "g") == {("in", 0): (-1, 88)}
            await take(a)
            assert await a.commit_transaction("g", "t1", 1, [StagedOffset("in", 0, 100)])
            for store in (a, b):
                assert await _committed(store, "g") == {("in", 0): (100, 0)}
        finally:
            await _close(stores)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("ends", "kept"),
    [
        (["t1", "t2"], 2),
        (["t2", "t1"], 2),
        (["t1", "plain", "t2"], 99),
        (["plain", "t1", "t2"], 99),
    ],
    ids=["in-staging-order", "in-reverse-order", "plain-commit-between", "plain-commit-first"],
)
def test_of_transactions_staging_one_partition_the_last_written_commit_stays(
    pulsar, namespace, ends, kept
):
    """t1 stages offset 1, then t2 stages offset 2, both commit in either order: t2's
    stays (Kafka: the commit written last to the offsets log wins, a transaction's
    counting from its TxnOffsetCommit). A plain commit (99) made after both staged
    stays, whichever commits after it."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"
    staged = {"t1": StagedOffset("in", 0, 1), "t2": StagedOffset("in", 0, 2)}

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 1)
        ((_, _, a),) = stores
        try:
            await take(a)
            await a.mark_pending("g", [("in", 0)], "t1", 1)
            await a.mark_pending("g", [("in", 0)], "t2", 1)
            for end in ends:
                if end == "plain":
                    await a.commit("g", [StagedOffset("in", 0, 99)])
                else:
                    await a.commit_transaction("g", end, 1, [staged[end]])
            assert await _committed(a, "g") == {("in", 0): (kept, 0)}
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_markers_an_earlier_version_wrote_are_read_applied_and_swept(pulsar, namespace):
    """Markers in the layout of earlier versions (one per partition, naming the last
    transaction that staged it): the partition is unstable while one is there, its
    transaction commits (or aborts) it as its own, a transaction marking the partition
    since does not take its place, and the sweep removes one whose transaction ended."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"

    def old_marker(tid: str, ordinal: int, after: int) -> dict[str, Any]:
        return {"transactionalId": tid, "ordinal": ordinal, "markedMs": 1, "after": after}

    async def is_live(tid: str, ordinal: int, marked_ms: int) -> bool:
        return tid != "ended"

    async def write_old(store: GroupStore, partition: int, doc: dict[str, Any]) -> None:
        await store.owned("g", lambda p: store.write(p, key("p", "g", "in", partition), doc))

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, _, b) = stores
        a.pending.pending_is_live = is_live
        try:
            await take(a)
            await write_old(a, 0, old_marker("old", 3, 0))
            await write_old(a, 1, old_marker("aborted", 2, 0))
            await write_old(a, 2, old_marker("ended", 5, 0))
            assert await _committed(b, "g") == {("in", i): (-1, 88) for i in range(3)}
            await take(b)
            await b.mark_pending("g", [("in", 0)], "new", 1)  # staged after "old"
            assert await b.commit_transaction("g", "old", 3, [StagedOffset("in", 0, 30)])
            assert (await _committed(a, "g"))[("in", 0)] == (-1, 88)  # "new" is pending
            await take(a)
            assert await a.commit_transaction("g", "new", 1, [StagedOffset("in", 0, 40)])
            await a.abort_transaction("g", [("in", 1)], "aborted", 2)
            assert await a.sweep() is None
            for store in (a, b):
                assert await _committed(store, "g") == {("in", 0): (40, 0)}
                assert [k for k, _ in store.docs("g") if k[0] == "p"] == []
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_markers_whose_transaction_ended_are_swept_and_live_ones_stay(pulsar, namespace):
    """The owner's sweep asks the transaction coordinator about each marker (with when
    it was marked) and removes those of transactions no longer live."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"
    asked: list[tuple[str, int, int]] = []

    async def is_live(tid: str, ordinal: int, marked_ms: int) -> bool:
        asked.append((tid, ordinal, marked_ms))
        return tid == "live"

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, _, b) = stores
        a.pending.pending_is_live = is_live
        try:
            await take(a)
            before = int(time.time() * 1000)
            await a.mark_pending("g", [("in", 0)], "live", 1)
            await a.mark_pending("g", [("in", 1)], "leaked", 3)
            await a.sweep()
            assert {(t, o) for t, o, _ in asked} == {("live", 1), ("leaked", 3)}
            assert all(before <= ms <= int(time.time() * 1000) for _, _, ms in asked)
            await b.read("g")
            assert b.doc("g", "p", "in", 1) is None
            assert b.doc("g", "p", "in", 0) is not None
            assert (await _committed(b, "g")) == {("in", 0): (-1, 88)}
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_a_read_after_a_fenced_write_answers_the_log_and_takes_nothing(pulsar, namespace):
    """Sidecar A's write failed because sidecar B took the partition: a read through A (a
    Kafka member's OffsetFetch, ListGroups, a lag report) took the partition back to read
    it again as its owner, fencing B, and members of one group on both sidecars
    ping-ponged it. A now reads the partition again from the log as a reader: it answers
    B's record (never its own unstored one) and stays a reader; B's next change is B's.
    (A stale writer's send itself costs B its producer at the broker, Pulsar's fencing:
    B's next change takes the partition again, as after any takeover.)"""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"
    k = key("o", "g", "t", 0)

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, admin, b) = stores
        try:
            await take(a)
            await a.owned("g", lambda p: a.write(p, k, {"offset": 1}))
            await take(b)
            await b.owned("g", lambda p: b.write(p, k, {"offset": 2}))
            with pytest.raises(errors.NotCoordinator):  # A has not read B's takeover yet
                await a.owned(
                    "g", lambda p: a.write(p, k, {"offset": 99}), caught_up=True, take=False
                )
            await a.read("g")
            assert a.doc("g", "o", "t", 0) == {"offset": 2, "v": 2}
            assert not a.parts.owned(0), "a read took the partition"
            await b.owned("g", lambda p: b.write(p, k, {"offset": 3}))
            assert b.parts.owned(0)
            await a.read("g")
            assert a.doc("g", "o", "t", 0) == {"offset": 3, "v": 3}
            assert not a.parts.owned(0)
            writers = (await admin.partition_writers(topic)).get(0)
            assert writers == [b.parts._parts[0].writer.name]
        finally:
            await _close(stores)

    asyncio.run(scenario())


def test_a_read_meeting_a_fenced_write_in_flight_answers_the_log(pulsar, namespace):
    """A write of sidecar A is still travelling when a read through A (OffsetFetch) waits
    for A's writes to be stored, and it fails: sidecar B had taken the partition. The read
    answered NOT_COORDINATOR (librdkafka's committed() saw 16 in a takeover between two
    sidecars), though it needs no ownership; it now reads the partition again as a reader
    and answers what the log holds: B's record, never A's unstored one."""
    topic = f"persistent://{namespace}/groups-{uuid.uuid4().hex[:8]}"
    k = key("o", "g", "t", 0)

    async def scenario() -> None:
        stores = await _stores(pulsar, topic, 2)
        (_, _, a), (_, _, b) = stores
        try:
            await take(a)
            await a.owned("g", lambda p: a.write(p, k, {"offset": 1}))
            await take(b)
            await b.owned("g", lambda p: b.write(p, k, {"offset": 2}))
            async with a.parts.lock(0):  # A has not noticed: its writer still thinks it owns
                await a.write(0, k, {"offset": 99})  # sent, not yet answered
            await a.read("g")
            assert a.doc("g", "o", "t", 0) == {"offset": 2, "v": 2}
            assert not a.parts.owned(0), "a read took the partition"
            assert b.parts.owned(0)
        finally:
            await _close(stores)

    asyncio.run(scenario())
