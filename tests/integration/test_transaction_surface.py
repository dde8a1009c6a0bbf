"""The transaction coordinator's surface as the Kafka listener calls it (typed requests
and answers, Kafka errors out), against the real broker: AddPartitionsToTxn,
AddOffsetsToTxn, InitProducerId with the caller's ids (KIP-360)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from kop_dedup import errors
from kop_dedup.coordination.transactions.requests import (
    EndTxn,
    InitProducerId,
    ProducerIdAndEpoch,
    StageOffsets,
    TxnOffset,
)
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.protocol.transactions import TxnState
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from tests.helpers import read_all, uniq

pytestmark = pytest.mark.integration

NS = "persistent://public/kafka"


def run(pulsar: Any, scenario: Callable[[Runtime], Awaitable[Any]], **settings: Any) -> Any:
    """``scenario`` against a started in-process runtime."""

    async def main() -> Any:
        runtime = Runtime(
            Settings(
                pulsar_service_url=pulsar.service_url,
                pulsar_admin_url=pulsar.admin_url,
                **settings,
            )
        )
        await runtime.start()
        await runtime.join_cluster(None)  # a node of its cluster: it owns partitions
        try:
            return await scenario(runtime)
        finally:
            await runtime.close()

    return asyncio.run(main())


async def until_state(runtime: Runtime, tid: str, state: TxnState) -> None:
    deadline = time.monotonic() + 30
    while (txn := await runtime.transactions.describe(tid)) is None or txn.state is not state:
        assert time.monotonic() < deadline, f"{tid} stayed {txn}"
        await asyncio.sleep(0.02)


def test_add_partitions_then_abort_without_producing_answers_zero(pulsar):
    """A Kafka client may call AddPartitionsToTxn and then EndTxn(abort) with nothing
    produced: its transaction is Ongoing, and the abort answers 0, as from Kafka."""
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> None:
        c = runtime.transactions
        ids = await c.init_producer_id(InitProducerId(tid))
        pid, epoch = ids.producer_id, ids.producer_epoch
        added = await c.add_partitions(tid, pid, epoch, [(topic, 0), (topic, 0)])
        assert added == {(topic, 0): None}
        txn = await c.describe(tid)
        assert txn is not None
        assert (txn.state, [p.key for p in txn.partitions]) == (TxnState.ONGOING, [(topic, 0)])
        await c.end(EndTxn(tid, pid, epoch, commit=False))
        await until_state(runtime, tid, TxnState.COMPLETE_ABORT)

    run(pulsar, scenario)


def test_partitions_added_then_produced_commit_through_the_surface(pulsar, pulsar_reader_client):
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[int, int]:
        c = runtime.transactions
        ids = await c.init_producer_id(InitProducerId(tid, timeout_ms=30_000))
        pid, epoch = ids.producer_id, ids.producer_epoch
        assert await c.add_partitions(tid, pid, epoch, [(topic, 0)]) == {(topic, 0): None}
        batch = KafkaBatch(topic, 0, pid, epoch, 0, 1, (rec(b"a"), rec(b"b")))
        [answer] = await c.produce(tid, [batch], time.monotonic() + 30)
        assert (answer.error, answer.counted) == (None, True)
        await c.end(EndTxn(tid, pid, epoch, commit=True))
        await until_state(runtime, tid, TxnState.COMPLETE_COMMIT)
        return pid, epoch

    run(pulsar, scenario)
    msgs = read_all(pulsar_reader_client, f"{NS}/{topic}-partition-0")
    assert [m.data() for m in msgs] == [b"a", b"b"]


def test_add_partitions_answers_each_partition_with_the_calls_error(pulsar):
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> None:
        c = runtime.transactions
        unknown = await c.add_partitions(uniq("nobody"), 1, 0, [(topic, 0), (topic, 1)])
        assert {k: type(e) for k, e in unknown.items()} == {
            (topic, 0): errors.InvalidProducerIdMapping,
            (topic, 1): errors.InvalidProducerIdMapping,
        }
        ids = await c.init_producer_id(InitProducerId(tid))
        await c.init_producer_id(InitProducerId(tid))  # fences the first epoch
        stale = await c.add_partitions(tid, ids.producer_id, ids.producer_epoch, [(topic, 0)])
        assert isinstance(stale[(topic, 0)], errors.ProducerFenced)
        txn = await c.describe(tid)
        assert txn is not None
        assert txn.state is TxnState.EMPTY

    run(pulsar, scenario)


def test_add_offsets_begins_the_transaction_and_its_offsets_commit_with_it(pulsar):
    tid, group, source = uniq("tx"), uniq("g"), uniq("src")

    async def scenario(runtime: Runtime) -> int:
        c = runtime.transactions
        ids = await c.init_producer_id(InitProducerId(tid))
        pid, epoch = ids.producer_id, ids.producer_epoch
        await c.add_offsets(tid, pid, epoch, group)
        txn = await c.describe(tid)
        assert txn is not None
        assert (txn.state, txn.ordinal) == (TxnState.ONGOING, 1)
        offsets = (TxnOffset(source, 0, 42, "m"),)
        await c.stage_offsets(StageOffsets(tid, pid, epoch, group, offsets))
        await c.end(EndTxn(tid, pid, epoch, commit=True))
        await until_state(runtime, tid, TxnState.COMPLETE_COMMIT)
        with pytest.raises(errors.ProducerFenced):
            await c.add_offsets(tid, pid, epoch - 1 if epoch else epoch + 1, group)
        [committed] = await runtime.offsets.fetch(group, require_stable=True)
        return committed.offset

    assert run(pulsar, scenario) == 42


def test_init_naming_the_current_epoch_bumps_it_and_a_stale_one_is_fenced(pulsar):
    """KIP-360: the caller's current producer id and epoch bump the epoch; a retry of
    that bump (its answer lost) gets the same answer; any other epoch is fenced."""
    tid = uniq("tx")

    async def scenario(runtime: Runtime) -> None:
        c = runtime.transactions
        first = await c.init_producer_id(InitProducerId(tid))
        pid = first.producer_id
        named = InitProducerId(tid, producer_id=pid, producer_epoch=first.producer_epoch)
        bumped = await c.init_producer_id(named)
        assert bumped == ProducerIdAndEpoch(pid, first.producer_epoch + 1)
        assert await c.init_producer_id(named) == bumped  # the same call again: no bump
        for stale in ((pid, first.producer_epoch + 5), (pid + 1, bumped.producer_epoch)):
            with pytest.raises(errors.ProducerFenced):
                await c.init_producer_id(
                    InitProducerId(tid, producer_id=stale[0], producer_epoch=stale[1])
                )
        assert await c.init_producer_id(InitProducerId(tid)) == ProducerIdAndEpoch(
            pid, bumped.producer_epoch + 1
        )

    run(pulsar, scenario)


def test_an_exhausted_epoch_moves_the_id_to_a_new_producer_id(pulsar):
    """At epoch 32766 (Kafka: Short.MaxValue - 1) the next init hands out a new producer
    id at epoch 0; the previous caller's retry of that init (KIP-360, its answer lost)
    gets the same new id; the old producer id is fenced."""
    tid = uniq("tx")

    async def scenario(runtime: Runtime) -> None:
        c = runtime.transactions
        first = await c.init_producer_id(InitProducerId(tid))
        pid = first.producer_id

        async def near_the_end(current: Any) -> Any:
            return replace(current, producer_epoch=32_765)

        await c.state.change(tid, near_the_end)
        last = await c.init_producer_id(InitProducerId(tid))
        assert last == ProducerIdAndEpoch(pid, 32_766)
        named = InitProducerId(tid, producer_id=pid, producer_epoch=32_766)
        moved = await c.init_producer_id(named)
        assert moved.producer_id != pid
        assert moved.producer_epoch == 0
        assert await c.init_producer_id(named) == moved  # the retry of the rotation
        batch = KafkaBatch(uniq("a"), 0, pid, 32_766, 0, 0, (rec(b"x"),))
        [answer] = await c.produce(tid, [batch], time.monotonic() + 30)
        assert isinstance(answer.error, errors.InvalidProducerIdMapping)

    run(pulsar, scenario)


def test_pending_is_live_while_its_transaction_may_stage_and_not_once_it_ended(pulsar):
    """What the group store's leak sweep asks about a pending-offset marker."""
    tid = uniq("tx")

    async def scenario(runtime: Runtime) -> None:
        c = runtime.transactions
        now = int(time.time() * 1000)
        assert not await c.pending_is_live(uniq("nobody"), 1, now)
        ids = await c.init_producer_id(InitProducerId(tid))
        pid, epoch = ids.producer_id, ids.producer_epoch
        # not begun yet: a staging may be between its marker and its change
        assert await c.pending_is_live(tid, 1, now)
        assert not await c.pending_is_live(tid, 1, now - c.settings.max_timeout_ms - 1)
        await c.add_offsets(tid, pid, epoch, "g")
        assert await c.pending_is_live(tid, 1, now)
        await c.end(EndTxn(tid, pid, epoch, commit=False))
        await until_state(runtime, tid, TxnState.COMPLETE_ABORT)
        assert not await c.pending_is_live(tid, 1, now)
        await c.add_offsets(tid, pid, epoch, "g")
        assert not await c.pending_is_live(tid, 1, now)  # superseded by transaction 2
        assert await c.pending_is_live(tid, 2, now)

    run(pulsar, scenario)


@pytest.mark.parametrize("busy_wait_ms", [250, 0])
def test_the_next_transactions_add_partitions_waits_for_the_commit_being_applied(
    pulsar, busy_wait_ms
):
    """EndTxn answers once the decision is durable and the copy follows; a client's next
    AddPartitionsToTxn comes a few milliseconds later, while it is applied. It waits
    for the apply here (``txn_busy_wait_ms``) and joins, instead of 51
    CONCURRENT_TRANSACTIONS, after which librdkafka backs off about 20 ms: a
    transaction of 100 records spent most of its time there. With the wait off it is
    answered 51, as a Kafka broker answers."""
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> errors.KafkaError | None:
        c = runtime.transactions
        ids = await c.init_producer_id(InitProducerId(tid, timeout_ms=30_000))
        pid, epoch = ids.producer_id, ids.producer_epoch
        assert await c.add_partitions(tid, pid, epoch, [(topic, 0)]) == {(topic, 0): None}
        batch = KafkaBatch(topic, 0, pid, epoch, 0, 1, (rec(b"a"), rec(b"b")))
        [answer] = await c.produce(tid, [batch], time.monotonic() + 30)
        assert answer.error is None
        first = await c.describe(tid)
        assert first is not None
        await c.end(EndTxn(tid, pid, epoch, commit=True))
        added = await c.add_partitions(tid, pid, epoch, [(topic, 0)])
        txn = await c.describe(tid)
        assert txn is not None
        if added[topic, 0] is None:  # the first one completed; this one is the next
            assert (txn.state, txn.ordinal) == (TxnState.ONGOING, first.ordinal + 1)
        return added[topic, 0]

    error = run(pulsar, scenario, txn_busy_wait_ms=busy_wait_ms)
    if busy_wait_ms:
        assert error is None
    else:
        assert isinstance(error, errors.ConcurrentTransactions)


def test_a_transactional_produce_whose_join_fails_in_pulsar_answers_a_retriable_code(
    pulsar, monkeypatch
):
    """The transaction-log write that adds a partition times out (the broker paused or
    killed: Pulsar's own exception): each batch is answered a retriable Kafka code, as
    KafkaStorage/timeout errors are, instead of the exception escaping the produce path
    (the HTTP route answered 500 in test_transaction_stream's broker kill)."""
    import _pulsar
    from pulsar.asyncio import PulsarException

    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> None:
        c = runtime.transactions
        ids = await c.init_producer_id(InitProducerId(tid))
        batch = KafkaBatch(topic, 0, ids.producer_id, ids.producer_epoch, 0, 0, (rec(b"v"),))

        async def timed_out(*_: Any, **__: Any) -> None:
            raise PulsarException(_pulsar.Result.Timeout)

        monkeypatch.setattr(c.state.parts, "write", timed_out)
        [answer] = await c.produce(tid, [batch], time.monotonic() + 30)
        assert answer.error is not None
        assert answer.error.retriable, answer.error
        monkeypatch.undo()
        [again] = await c.produce(tid, [batch], time.monotonic() + 30)  # the client's retry
        assert again.error is None, again.error

    run(pulsar, scenario)
