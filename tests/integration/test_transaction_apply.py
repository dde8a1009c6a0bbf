"""The apply loop finishes what it starts, a replayed commit is a no-op, and a staging
that fails leaves no pending marker (real broker; faults injected at the coordinators'
boundaries: the group store's answers, the log writer's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from kop_dedup import errors
from kop_dedup.coordination.groups.store import StagedOffset
from kop_dedup.coordination.transactions.log import decode
from kop_dedup.coordination.transactions.requests import (
    EndTxn,
    InitProducerId,
    StageOffsets,
    TxnOffset,
)
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.protocol.transactions import TxnState
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from tests.helpers import batch, uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

FAST = {"coordinator_adopt_interval_ms": 300, "txn_sweep_interval_ms": 100}


def call(api: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = api.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def stable(api: httpx.Client, group: str) -> dict[tuple[str, int], dict[str, Any]]:
    r = api.get(f"/v1/groups/{group}/offsets", params={"requireStable": "true"})
    assert r.status_code == 200, r.text
    return {(o["topic"], o["partition"]): o for o in r.json()["offsets"]}


def begin_with_offsets(
    api: httpx.Client, tid: str, group: str, source: str, offset: int
) -> dict[str, Any]:
    """An open transaction of ``tid`` with one batch and ``offset`` staged; its ids."""
    body = call(api, "/v1/init-producer-id", {"transactionalId": tid})
    ids = {
        "transactionalId": tid,
        "producerId": body["producerId"],
        "producerEpoch": body["producerEpoch"],
    }
    one = batch(uniq("a"), body["producerId"], 0, 1, epoch=body["producerEpoch"])
    produced = call(api, "/v1/produce", {"transactionalId": tid, "batches": [one]})
    assert produced["results"][0]["errorCode"] == 0, produced
    stage = {
        **ids,
        "groupId": group,
        "offsets": [{"topic": source, "partition": 0, "offset": offset}],
    }
    assert call(api, "/v1/txn-offset-commit", stage)["errorCode"] == 0
    return ids


def fail_once(real: Callable[..., Awaitable[Any]], error: BaseException, seen: list[str]) -> Any:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not seen:
            seen.append(type(error).__name__)
            raise error
        return await real(*args, **kwargs)

    return wrapper


def test_offsets_that_meet_not_coordinator_are_committed_on_a_later_try(pulsar):
    """The group store answers NOT_COORDINATOR (its partition moved) while this sidecar
    still owns the transaction's log partition: the apply loop tries again instead of
    leaving the transaction PrepareCommit for good."""
    tid, group, source = uniq("tx"), uniq("g"), uniq("src")
    with ThreadSidecar(pulsar, **FAST) as sc, httpx.Client(base_url=sc.url, timeout=60) as api:
        store = sc.runtime.offsets
        seen: list[str] = []
        moved = errors.NotCoordinator("consumer-groups partition moved (injected)")
        for name in ("commit", "commit_transaction"):
            if hasattr(store, name):
                setattr(store, name, fail_once(getattr(store, name), moved, seen))
        ids = begin_with_offsets(api, tid, group, source, 7)
        assert call(api, "/v1/end-txn", {**ids, "commit": True})["errorCode"] == 0
        wait_until(
            "the commit to complete",
            lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
            30,
        )
        assert seen == ["NotCoordinator"]
        committed = stable(api, group)[(source, 0)]
        assert (committed["offset"], committed["errorCode"]) == (7, 0)


def test_a_decision_whose_write_failed_but_was_stored_is_applied(pulsar):
    """The PrepareCommit write reaches the log but its sender hears a failure: end-txn
    answers an error, the client gives up, and the decision must still be applied
    (data visible, offsets committed, CompleteCommit) with nobody asking again."""
    tid, group, source = uniq("tx"), uniq("g"), uniq("src")
    with ThreadSidecar(pulsar, **FAST) as sc, httpx.Client(base_url=sc.url, timeout=60) as api:
        ids = begin_with_offsets(api, tid, group, source, 3)
        coordinator = sc.runtime.transactions
        parts = getattr(coordinator, "parts", None) or coordinator.state.parts
        seen: list[str] = []
        for part in parts._parts:
            writer, real = part.writer, part.writer.send

            async def send(key: str, value: bytes, *, _real: Any = real, **kw: Any) -> None:
                await _real(key, value, **kw)
                if key == tid and not seen and decode(value).state is TxnState.PREPARE_COMMIT:
                    seen.append(key)
                    raise TimeoutError("stored, but the receipt was lost (injected)")

            writer.send = send
        answer = call(api, "/v1/end-txn", {**ids, "commit": True})
        assert seen == [tid]
        assert answer["errorCode"] != 0, answer  # the client hears a failure and gives up
        wait_until(
            "the stored decision to be applied",
            lambda: api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit",
            30,
        )
        assert stable(api, group)[(source, 0)]["offset"] == 3


# -- driving the coordinator in-process -------------------------------------------------


def settings(pulsar: Any, **extra: Any) -> Settings:
    return Settings(
        pulsar_service_url=pulsar.service_url, pulsar_admin_url=pulsar.admin_url, **extra
    )


async def fetch(runtime: Runtime, group: str, source: str) -> Any:
    answers = await runtime.offsets.fetch(group, require_stable=True)
    return next((a for a in answers if (a.topic, a.partition) == (source, 0)), None)


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_replaying_an_applied_commit_never_writes_its_older_offsets_over_newer_ones(pulsar):
    """A commit applied up to its offsets, then a plain commit of a newer offset, then
    the decision applied again (a crash before CompleteCommit, or a retried one): the
    replay must leave the newer offset."""
    tid, group, source, topic = uniq("tx"), uniq("g"), uniq("src"), uniq("a")

    async def scenario() -> int:
        runtime = Runtime(settings(pulsar, txn_apply_delay_ms=600_000))
        await runtime.start()
        await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        try:
            coordinator = runtime.transactions
            ids = await coordinator.init_producer_id(InitProducerId(tid))
            pid, epoch = ids.producer_id, ids.producer_epoch
            kb = KafkaBatch(topic, 0, pid, epoch, 0, 0, (rec(b"x"),))
            answers = await coordinator.produce(tid, [kb], time.monotonic() + 30)
            assert answers[0].error is None, answers
            offsets = (TxnOffset(source, 0, 10),)
            await coordinator.stage_offsets(StageOffsets(tid, pid, epoch, group, offsets))
            await coordinator.end(EndTxn(tid, pid, epoch, commit=True))
            prepared = await coordinator.describe(tid)
            assert prepared is not None
            assert prepared.state is TxnState.PREPARE_COMMIT
            # the first application got as far as the offsets
            await runtime.offsets.commit_transaction(
                group, tid, prepared.ordinal, [StagedOffset(source, 0, 10)]
            )
            # the consumer moved on meanwhile
            await runtime.offsets.commit(group, [StagedOffset(source, 0, 20)])
            await coordinator.applier.apply_once(prepared)
            done = await coordinator.describe(tid)
            assert done is not None
            assert done.state is TxnState.COMPLETE_COMMIT
            answer = await fetch(runtime, group, source)
            return int(answer.offset)
        finally:
            await runtime.close()

    assert asyncio.run(scenario()) == 20


def test_a_staging_that_fails_after_marking_leaves_no_pending_marker(pulsar):
    """An end-txn decides while a txn-offset-commit of the same transaction is between
    its pending marker and its change: the staging fails (51) or lands in the
    transaction; either way no marker is left behind (a stable fetch of the partition
    would answer 88 UNSTABLE_OFFSET_COMMIT for good)."""
    tid, group, source, topic = uniq("tx"), uniq("g"), uniq("src"), uniq("a")

    async def scenario() -> tuple[Any, Any]:
        runtime = Runtime(settings(pulsar))
        await runtime.start()
        await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        try:
            coordinator = runtime.transactions
            ids = await coordinator.init_producer_id(InitProducerId(tid))
            pid, epoch = ids.producer_id, ids.producer_epoch
            kb = KafkaBatch(topic, 0, pid, epoch, 0, 0, (rec(b"x"),))
            await coordinator.produce(tid, [kb], time.monotonic() + 30)
            store = runtime.offsets
            marked, go = asyncio.Event(), asyncio.Event()
            real = store.mark_pending

            async def held(*args: Any, **kwargs: Any) -> None:
                await real(*args, **kwargs)
                marked.set()
                await go.wait()

            store.mark_pending = held
            offsets = (TxnOffset(source, 0, 10),)
            staging = asyncio.ensure_future(
                coordinator.stage_offsets(StageOffsets(tid, pid, epoch, group, offsets))
            )
            await asyncio.wait_for(marked.wait(), 30)
            ending = asyncio.ensure_future(coordinator.end(EndTxn(tid, pid, epoch, commit=True)))
            await asyncio.wait([ending], timeout=2)  # decided by now unless it waits
            go.set()
            staged, ended = await asyncio.gather(staging, ending, return_exceptions=True)
            assert ended is None, ended

            async def complete() -> bool:
                txn = await coordinator.describe(tid)
                return txn is not None and txn.state is TxnState.COMPLETE_COMMIT

            await until("the commit to complete", complete)
            return staged, await fetch(runtime, group, source)
        finally:
            await runtime.close()

    staged, answer = asyncio.run(scenario())
    if staged is None:  # it landed in the transaction: committed with it
        assert answer is not None
        assert (answer.offset, answer.error) == (10, None), answer
    else:  # refused: nothing of it left
        assert isinstance(staged, errors.ConcurrentTransactions), staged
        assert answer is None or answer.error is None, answer


def test_a_marker_a_failed_staging_left_is_removed_once_its_transaction_cannot_stage_it(pulsar):
    """The rule a staging whose change failed after its marker applies: the marker
    stays while its transaction is open (a later staging may still record it), and
    goes once the transaction is decided without it; a marker of a partition the
    transaction did stage is left to its decision."""
    tid, group, source, topic = uniq("tx"), uniq("g"), uniq("src"), uniq("a")

    async def scenario() -> tuple[Any, Any, Any]:
        runtime = Runtime(settings(pulsar))
        await runtime.start()
        await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        try:
            c = runtime.transactions
            ids = await c.init_producer_id(InitProducerId(tid))
            pid, epoch = ids.producer_id, ids.producer_epoch
            kb = KafkaBatch(topic, 0, pid, epoch, 0, 0, (rec(b"x"),))
            await c.produce(tid, [kb], time.monotonic() + 30)
            staged = (TxnOffset(source, 1, 7),)
            await c.stage_offsets(StageOffsets(tid, pid, epoch, group, staged))
            leaked = [(source, 0), (source, 1)]
            await runtime.offsets.mark_pending(group, leaked, tid, 1)
            await c._staging._unmark(tid, group, leaked, [1])
            while_open = await fetch(runtime, group, source)
            await c.end(EndTxn(tid, pid, epoch, commit=True))

            async def complete() -> bool:
                txn = await c.describe(tid)
                return txn is not None and txn.state is TxnState.COMPLETE_COMMIT

            await until("the commit to complete", complete)
            await c._staging._unmark(tid, group, leaked, [1])
            answers = await runtime.offsets.fetch(group, require_stable=True)
            by_partition = {a.partition: a for a in answers if a.topic == source}
            return while_open, by_partition.get(0), by_partition.get(1)
        finally:
            await runtime.close()

    while_open, zero, one = asyncio.run(scenario())
    assert isinstance(while_open.error, errors.UnstableOffsetCommit)  # kept while open
    assert zero is None or zero.error is None, zero  # removed once decided without it
    assert one is not None
    assert (one.offset, one.error) == (7, None)  # staged: its decision applied it
