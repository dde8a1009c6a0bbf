"""The local copy of journaled batches and the order of copies into one partition."""

from __future__ import annotations

import asyncio

from kop_dedup.coordination.transactions.local_copy import LocalCopy
from kop_dedup.coordination.transactions.log import decode, encode
from kop_dedup.coordination.transactions.ordering import CopyOrder
from kop_dedup.protocol import transactions as tx
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.protocol.transactions import SHARED, Completed, Partition, Transaction

P = ("orders", 0)


def kb(base: int, n: int = 1, *, size: int = 10) -> KafkaBatch:
    return KafkaBatch(
        "orders", 0, 7, 0, base, base + n - 1, tuple(rec(b"x" * size) for _ in range(n))
    )


def test_batches_are_kept_only_for_a_partition_opened_here():
    local = LocalCopy(1 << 20)
    local.add("app", 1, kb(0), (5, 0))
    assert local.batches("app", 1, P) is None  # never joined here: read the journal
    local.open("app", 1, P)
    local.add("app", 1, kb(1), (5, 1))
    assert [b.base_sequence for _, b in local.batches("app", 1, P) or []] == [1]


def test_batches_come_back_in_journal_order_whatever_order_receipts_came_in():
    local = LocalCopy(1 << 20)
    local.open("app", 1, P)
    local.add("app", 1, kb(2), (6, 0))
    local.add("app", 1, kb(0), (5, 3))
    local.add("app", 1, kb(1), (5, 9))
    assert [p for p, _ in local.batches("app", 1, P) or []] == [(5, 3), (5, 9), (6, 0)]


def test_an_open_partition_with_no_batch_is_known_to_hold_none():
    local = LocalCopy(1 << 20)
    local.open("app", 1, P)
    assert local.batches("app", 1, P) == []


def test_a_spoiled_partition_reads_the_journal_and_takes_no_more_batches():
    local = LocalCopy(1 << 20)
    local.open("app", 1, P)
    local.add("app", 1, kb(0), (5, 0))
    local.spoil("app", 1, P)
    local.add("app", 1, kb(1), (5, 1))
    assert local.batches("app", 1, P) is None
    assert local.bytes == 0


def test_a_duplicate_of_a_kept_batch_is_held_and_of_another_is_not():
    local = LocalCopy(1 << 20)
    local.open("app", 1, P)
    local.add("app", 1, kb(0, 3), (5, 0))
    assert local.holds("app", 1, kb(0, 3))
    assert not local.holds("app", 1, kb(3, 3))


def test_past_the_bound_the_oldest_transactions_are_evicted_whole():
    one = kb(0, 10, size=100)
    local = LocalCopy(3 * 2000)
    for ordinal in (1, 2, 3, 4):
        local.open("app", ordinal, P)
        local.add("app", ordinal, one, (ordinal, 0))
    assert local.bytes <= local.max_bytes
    assert local.evicted >= 1
    assert local.batches("app", 1, P) is None  # evicted: read the journal
    assert local.batches("app", 4, P) is not None
    local.add("app", 1, kb(10), (9, 9))  # a batch of an evicted transaction is not kept
    assert local.batches("app", 1, P) is None


def test_a_bound_of_zero_keeps_nothing():
    local = LocalCopy(0)
    local.open("app", 1, P)
    local.add("app", 1, kb(0), (5, 0))
    assert local.batches("app", 1, P) is None
    assert local.bytes == 0


def test_dropping_a_transaction_frees_its_bytes():
    local = LocalCopy(1 << 20)
    local.open("app", 1, P)
    local.add("app", 1, kb(0, 5), (5, 0))
    assert local.bytes > 0
    local.drop("app", 1)
    assert local.bytes == 0
    assert local.batches("app", 1, P) is None


def test_a_partition_journaled_by_a_second_sidecar_is_shared():
    txn = tx.join(
        Transaction("app", 7, 0, 60_000),
        7,
        0,
        Partition("orders", 0, None, journaler="me"),
        now_ms=1,
    )
    shared = tx.share(txn, "orders", 0)
    assert shared.partitions[0].journaler == SHARED
    assert tx.share(shared, "orders", 0) == shared
    assert tx.share(txn, "other", 0) == txn


def test_the_journaler_survives_the_log():
    txn = Transaction(
        "app", 7, 0, 60_000, partitions=(Partition("orders", 0, "1:2", journaler="abc"),)
    )
    assert decode(encode(txn)).partitions[0].journaler == "abc"
    old = encode(txn).replace(b',"journaler":"abc"', b"")
    assert decode(old).partitions[0].journaler is None  # a record from before the field


def test_tokens_and_the_replaced_producer_survive_the_log():
    txn = Transaction(
        "app",
        8,
        0,
        60_000,
        last_producer_id=7,
        last_producer_epoch=32_766,
        token="t2",
        history=(Completed("t1", 1, True),),
    )
    assert decode(encode(txn)) == txn
    old = encode(Transaction("app", 8, 0, 60_000))
    for field in (b',"token":null', b',"history":[]', b',"lastProducerId":-1'):
        old = old.replace(field, b"")
    assert decode(old) == Transaction("app", 8, 0, 60_000)  # a record from before them


def test_copies_into_one_partition_follow_the_decision_order():
    async def scenario() -> list[str]:
        order, done = CopyOrder(), []
        first = order.ticket([("a", 0), ("b", 0)])
        second = order.ticket([("a", 0)])
        third = order.ticket([("b", 0)])

        async def copy(ticket, name: str, part: tuple[str, int], delay: float) -> None:
            await ticket.wait(part)
            await asyncio.sleep(delay)
            done.append(f"{name}{part[0]}")
            ticket.done(part)

        await asyncio.gather(
            copy(second, "2", ("a", 0), 0),
            copy(third, "3", ("b", 0), 0),
            copy(first, "1", ("a", 0), 0.02),
            copy(first, "1", ("b", 0), 0.01),
        )
        return done

    done = asyncio.run(scenario())
    assert done.index("1a") < done.index("2a")
    assert done.index("1b") < done.index("3b")


def test_a_released_ticket_passes_its_turn_only_after_the_one_before():
    async def scenario() -> list[str]:
        order, done = CopyOrder(), []
        first, second, third = (order.ticket([("a", 0)]) for _ in range(3))
        second.release()  # gave up without copying

        async def copy(ticket, name: str, delay: float) -> None:
            await ticket.wait(("a", 0))
            await asyncio.sleep(delay)
            done.append(name)
            ticket.done(("a", 0))

        await asyncio.gather(copy(third, "third", 0), copy(first, "first", 0.02))
        return done

    assert asyncio.run(scenario()) == ["first", "third"]
    assert len(CopyOrder()) == 0
