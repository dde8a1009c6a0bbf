"""The copy of a committed transaction against the real broker: one producer name and
one sequence id per copied batch, whoever copies it; complete when every batch the
decision counted has a receipt; never completed in part.

Each scenario runs a sidecar's runtime in-process with its own applier held back
(``txn_apply_delay_ms``): the test decides who copies, and when. A second
:class:`Copier` with its own instance name plays the sidecar that takes over (it has
no local copy: it reads the journal)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from kop_dedup import errors
from kop_dedup.coordination.transactions.copy_source import CopyUnresolved
from kop_dedup.coordination.transactions.journal import PROP_TXN_ID, PROP_TXN_ORDINAL
from kop_dedup.coordination.transactions.requests import EndTxn, InitProducerId
from kop_dedup.protocol.records import KafkaBatch, rec
from kop_dedup.protocol.transactions import Partition, Transaction, TxnState
from kop_dedup.pulsar.message_ids import decode_entry_position
from kop_dedup.runtime import Runtime
from kop_dedup.settings import Settings
from tests.copy_scenarios import (
    another,
    batches_of,
    decide,
    decide_without_local_copy,
    run,
    stored,
    values,
)
from tests.helpers import delete_namespace, uniq

pytestmark = pytest.mark.integration


@pytest.fixture
def system(pulsar: Any) -> Iterator[str]:
    """A system namespace of the test's own: the decisions it leaves undone (on purpose)
    are never recovered by another test's sidecar."""
    namespace = uniq("kop-dedup-copy")
    yield namespace
    delete_namespace(pulsar.admin_url, f"public/{namespace}")


@pytest.fixture
def held_back(pulsar: Any, system: str) -> Settings:
    """A sidecar whose applier never applies on its own: the test copies."""
    return Settings(
        pulsar_service_url=pulsar.service_url,
        pulsar_admin_url=pulsar.admin_url,
        system_namespace=system,
        txn_apply_delay_ms=600_000,
        log_level="WARNING",
    )


@pytest.fixture
def lookups_answer(request: pytest.FixtureRequest) -> Callable[[Runtime, str], None]:
    """Make the broker's last-entry lookup for a topic answer what ``request.param``
    names ("none", "entry -1" of its ledger, "next ledger"): what a broker answers
    for a ledger still empty, or when it cannot say."""

    def install(runtime: Runtime, ptopic: str) -> None:
        admin = runtime.admin
        real = admin.last_position

        async def last_position(topic: str) -> Any:
            position = await real(topic)
            if topic != ptopic or position is None:
                return position
            return {
                "none": None,
                "entry -1": (position[0], -1),
                "next ledger": (position[0] + 1, -1),
            }[request.param]

        admin.last_position = last_position  # type: ignore[method-assign]

    return install


@pytest.mark.parametrize(
    "lookups_answer", ["none", "entry -1", "next ledger"], indirect=True, ids=lambda p: p
)
def test_a_fresh_copier_copying_batches_already_stored_stores_none_again(
    held_back, pulsar_reader_client, lookups_answer
):
    """A copy finished, then a second copier (a takeover, a recovery) copies the same
    transaction while the broker's last-entry lookups of the data partition answer
    nothing useful. The batches are refused as duplicates under their one name: the
    partition holds each batch once (it held each twice when a read decided that the
    first copy was missing and a second name copied them again)."""
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[int, int]:
        txn, part = await decide(runtime, tid, lambda p, e: batches_of(topic, p, e, [2, 2, 2]))
        mine = runtime.transactions._copier
        assert await mine.copy(txn, part, await mine.batches(txn, part)) == 6
        lookups_answer(runtime, runtime.naming.partition_topic(topic, 0))
        other = another(runtime)
        try:
            assert await other.copy(txn, part, await other.batches(txn, part)) == 6
        finally:
            await other.close()
        return txn.producer_id, txn.producer_epoch

    pid, epoch = run(held_back, scenario)
    got = stored(pulsar_reader_client, topic)
    assert [v for v, _ in got] == values(pid, epoch, 6)
    assert [i for _, i in got if i is not None] == ["0", "1", "2"]


@pytest.mark.parametrize("lookups_answer", ["entry -1"], indirect=True, ids=lambda p: p)
def test_a_copy_that_used_to_livelock_on_its_repair_name_finishes(
    held_back, pulsar_reader_client, lookups_answer
):
    """The issue's livelock: an earlier repair round left the repair name's mark at the
    third batch; a later round, its look at the data partition cut short, found the
    first batches missing and sent them under the repair name, below its mark: refused
    as duplicates, still missing, forever. With one name per batch there is no repair
    round: the copy finishes, each batch once."""
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[int, int]:
        txn, part = await decide(runtime, tid, lambda p, e: batches_of(topic, p, e, [1, 1, 1]))
        mine = runtime.transactions._copier
        await mine.copy(txn, part, await mine.batches(txn, part))
        # the mark an earlier repair round of the third batch left (sequence 3)
        pid, epoch = txn.producer_id, txn.producer_epoch
        prefix = runtime.settings.producer_name_prefix
        repair = await runtime.publisher.create(
            runtime.naming.partition_topic(topic, 0),
            f"{prefix}-txn-{pid}-{epoch}-r{txn.ordinal}",
        )
        # (a record of another producer, not the transaction's, under sequence id 3)
        unrelated = KafkaBatch(topic, 0, 1, 0, 0, 0, (rec(b"unrelated"),))
        assert not (await repair.send_batch(unrelated, 3)).duplicate
        await repair.close()
        lookups_answer(runtime, runtime.naming.partition_topic(topic, 0))
        other = another(runtime)
        try:
            await asyncio.wait_for(other.copy(txn, part, await other.batches(txn, part)), 60)
        finally:
            await other.close()
        return pid, epoch

    pid, epoch = run(held_back, scenario)
    got = [v for v, _ in stored(pulsar_reader_client, topic) if v != "unrelated"]
    assert got == values(pid, epoch, 3)


def test_a_batch_the_journal_holds_twice_is_counted_and_copied_once(
    held_back, pulsar_reader_client
):
    """The broker journaled a batch twice (a retry stored again after it lost its
    deduplication state: here, the same batch written under another producer name).
    The decision counts it once, and a copier reading the journal copies it once."""
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[int, int, int, int]:
        journal = runtime.transactions._copier._journal
        injected: list[int] = []

        async def journal_the_first_again(pid: int, epoch: int) -> None:
            if injected:
                return
            first = batches_of(topic, pid, epoch, [2])[0]
            ptopic = journal.partition_topic(topic, 0)
            twice = await runtime.publisher.create(ptopic, uniq("journal-retry"))
            try:
                txn = await runtime.transactions.describe(tid)
                assert txn is not None
                extra = {PROP_TXN_ID: tid, PROP_TXN_ORDINAL: str(txn.ordinal)}
                receipt = await twice.send_whole(first, 1, extra)
                assert not receipt.duplicate
                injected.append(1)
            finally:
                await twice.close()

        txn, part = await decide(
            runtime,
            tid,
            lambda p, e: batches_of(topic, p, e, [2, 2, 2]),
            between=journal_the_first_again,
        )
        assert part.batches == 3  # counted from the local copy's receipts
        other = another(runtime)
        try:
            end, counted = await other.decision_end(txn, part)  # a barrier and a read
            found = await other.batches(txn, part)  # the journal, to the decision's end
            copied = await other.copy(txn, part, found)
        finally:
            await other.close()
        assert end is not None
        return txn.producer_id, txn.producer_epoch, counted, copied

    pid, epoch, counted, copied = run(held_back, scenario)
    assert (counted, copied) == (3, 6)
    assert [v for v, _ in stored(pulsar_reader_client, topic)] == values(pid, epoch, 6)


@pytest.mark.parametrize("lookups_answer", ["entry -1"], indirect=True, ids=lambda p: p)
def test_a_journal_whose_end_lookup_names_an_empty_ledger_commits_the_whole_transaction(
    held_back, pulsar_reader_client, lookups_answer
):
    """The decider holds no local copy (another sidecar journaled), the journal's
    ledger is rolled (a real unload) and the broker's lookup of its end names an
    empty ledger ("entry -1"). A decision that took that answer as its end copied
    nothing and completed. The decision's end is a barrier's receipt instead, and the
    copy completes only with every batch."""
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[int, int, int]:
        journal = runtime.transactions._copier._journal
        ptopic = journal.partition_topic(topic, 0)
        txn_now = await decide_without_local_copy(
            runtime, tid, topic, ptopic, lambda: lookups_answer(runtime, ptopic)
        )
        txn = await runtime.transactions.describe(tid)
        assert txn is not None
        assert txn == txn_now
        part = txn.partitions[0]
        assert part.batches == 3
        assert part.journal_end is not None
        assert decode_entry_position(part.journal_end)[1] >= 0
        await runtime.admin.unload(ptopic)
        applier = runtime.transactions.applier
        await applier.apply_once(txn)
        done = await runtime.transactions.describe(tid)
        assert done is not None
        assert done.state is TxnState.COMPLETE_COMMIT
        return txn.producer_id, txn.producer_epoch, applier.unresolved()

    pid, epoch, unresolved = run(held_back, scenario)
    assert unresolved == 0
    assert [v for v, _ in stored(pulsar_reader_client, topic)] == values(pid, epoch, 5)


def test_a_decision_written_before_the_count_is_copied_whole_to_a_barrier(
    held_back, pulsar_reader_client
):
    """A PrepareCommit of an older version: no count, and a journal end its decider
    asked the broker for (here one naming an empty ledger, which no read reaches). Its
    copy reads the journal up to a barrier written then, picking the transaction's
    batches by producer id and ordinal."""
    tid, topic = uniq("tx"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[int, int, int]:
        txn, part = await decide(runtime, tid, lambda p, e: batches_of(topic, p, e, [1, 2, 2]))
        ledger = decode_entry_position(part.journal_end or "0:0")[0]
        old = replace(part, batches=None, journal_end=f"{ledger + 1}:-1", journaler=None)
        other = another(runtime)
        try:
            copied = await other.copy(txn, old, await other.batches(txn, old))
        finally:
            await other.close()
        return txn.producer_id, txn.producer_epoch, copied

    pid, epoch, copied = run(held_back, scenario)
    assert copied == 5
    assert [v for v, _ in stored(pulsar_reader_client, topic)] == values(pid, epoch, 5)


def test_a_copy_cut_by_a_takeover_mid_way_lands_each_batch_once_in_order(
    held_back, pulsar_reader_client
):
    """The copying sidecar loses the transaction's log partition while its copy is in
    flight: its copy producer is closed under the copy (everything pending fails) and
    another sidecar copies the transaction from the journal. The first copy stored a
    prefix; the second sends every batch again under the same ids: the prefix comes
    back -1/-1 and the rest lands after it, each batch once, in order."""
    tid, topic, n = uniq("tx"), uniq("a"), 400

    async def cut(runtime: Runtime) -> tuple[int, int, int, int]:
        coordinator = runtime.transactions
        ids = await coordinator.init_producer_id(InitProducerId(tid))
        pid, epoch = ids.producer_id, ids.producer_epoch
        batches = batches_of(topic, pid, epoch, [1] * n)
        answers = await coordinator.produce(tid, batches, time.monotonic() + 120)
        assert [a.error for a in answers] == [None] * n
        await coordinator.end(EndTxn(tid, pid, epoch, commit=True))
        txn = await coordinator.describe(tid)
        assert txn is not None
        assert txn.state is TxnState.PREPARE_COMMIT
        part = txn.partitions[0]
        assert part.batches == n
        mine = coordinator._copier
        owner = coordinator.state.partition_of(tid)
        found = await mine.batches(txn, part)
        copying = asyncio.create_task(mine.copy(txn, part, found, owner=owner))
        name = f"{runtime.settings.producer_name_prefix}-txn-{pid}-{epoch}"
        key = (runtime.naming.partition_topic(topic, 0), name)
        # 0: the producer is open and counting what the partition holds (its name is new)
        while (pooled := mine._pool.get(key)) is None or pooled.producer.outstanding in (0, n):
            assert not copying.done(), "the copy ended before any receipt was seen"
            await asyncio.sleep(0.001)
        first_stored = n - pooled.producer.outstanding
        await mine.release(owner)  # the log partition moved: its copy producers close
        with pytest.raises(errors.KafkaError):
            await copying
        other = another(runtime)
        try:
            copied = await other.copy(txn, part, await other.batches(txn, part))
        finally:
            await other.close()
        return pid, epoch, first_stored, copied

    pid, epoch, first_stored, copied = run(held_back, cut)
    assert 0 < first_stored < n
    assert copied == n
    got = stored(pulsar_reader_client, topic)
    assert [v for v, _ in got] == values(pid, epoch, n)
    assert [i for _, i in got] == [str(i) for i in range(n)]


def test_a_copy_whose_name_the_broker_forgot_completes_only_when_every_batch_is_there(
    held_back, pulsar_reader_client
):
    """A recovery long after the decision (past the broker's 360 minutes) finds the
    copy's producer name unknown to the broker (here: another prefix, a name it never
    saw; a name it knows is copied as usual). It counts the transaction's batches in the data partition after the
    decision's data start instead of copying blindly: all there, the copy is complete
    and nothing is stored again; only some, the alarm is raised and nothing is copied."""
    whole, part_of = uniq("a"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[list[Any], list[Any], str]:
        mine = runtime.transactions._copier
        lost_whole: list[Any] = []
        txn, part = await decide(runtime, uniq("tx"), lambda p, e: batches_of(whole, p, e, [1] * 3))
        await mine.copy(txn, part, await mine.batches(txn, part))
        # an old decision under a name the broker still knows: copied as usual (-1/-1)
        known = another(runtime, lost=lost_whole, forget_after_ms=0)
        try:
            assert await known.copy(txn, part, await known.batches(txn, part)) == 3
        finally:
            await known.close()
        assert lost_whole == []
        forgot = another(runtime, lost=lost_whole, prefix="forgotten", forget_after_ms=0)
        try:
            assert await forgot.copy(txn, part, await forgot.batches(txn, part)) == 3
        finally:
            await forgot.close()

        lost_part: list[Any] = []
        txn, part = await decide(
            runtime, uniq("tx"), lambda p, e: batches_of(part_of, p, e, [1] * 3)
        )
        await mine.copy(txn, part, (await mine.batches(txn, part))[:2])
        forgot = another(runtime, lost=lost_part, prefix="forgotten", forget_after_ms=0)
        try:
            with pytest.raises(CopyUnresolved) as raised:
                await forgot.copy(txn, part, await forgot.batches(txn, part))
        finally:
            await forgot.close()
        return lost_whole, lost_part, raised.value.message

    lost_whole, lost_part, message = run(held_back, scenario)
    assert [a[2:] for a in lost_whole] == [(3, 3)]
    assert [a[2:] for a in lost_part] == [(2, 3)]
    assert "left undone" in message
    assert len(stored(pulsar_reader_client, whole)) == 3  # nothing copied again
    assert len(stored(pulsar_reader_client, part_of)) == 2  # nor in part


def test_a_fresh_copy_whose_name_the_broker_forgot_on_a_reload_is_counted_not_stored_again(
    held_back, pulsar_reader_client
):
    """Issue 35 item 6: the broker keeps at most ``brokerDeduplicationMaxNumberOfProducers``
    names per topic in a dedup snapshot, so on a topic reload a name past the cap is
    forgotten at once, for a decision minutes old (here: a name the broker never saw,
    another prefix, with the default 360-minute limit). On the build before, a copy
    resent under such a name was stored again (6 of 3 batches); now the copier counts
    what the partition holds whenever the broker does not know the name: all of it, the
    copy is complete (the alarm raised); some of it, left undone; none of it, a name
    never used, copied as usual."""
    whole, part_of, fresh = uniq("a"), uniq("a"), uniq("a")

    async def scenario(runtime: Runtime) -> tuple[list[Any], list[Any], list[Any], str]:
        mine = runtime.transactions._copier
        lost_whole: list[Any] = []
        txn, part = await decide(runtime, uniq("tx"), lambda p, e: batches_of(whole, p, e, [1] * 3))
        await mine.copy(txn, part, await mine.batches(txn, part))
        forgot = another(runtime, lost=lost_whole, prefix="reloaded")
        try:
            assert await forgot.copy(txn, part, await forgot.batches(txn, part)) == 3
        finally:
            await forgot.close()

        lost_part: list[Any] = []
        txn, part = await decide(
            runtime, uniq("tx"), lambda p, e: batches_of(part_of, p, e, [1] * 3)
        )
        await mine.copy(txn, part, (await mine.batches(txn, part))[:2])
        forgot = another(runtime, lost=lost_part, prefix="reloaded")
        try:
            with pytest.raises(CopyUnresolved) as raised:
                await forgot.copy(txn, part, await forgot.batches(txn, part))
        finally:
            await forgot.close()

        lost_none: list[Any] = []
        txn, part = await decide(runtime, uniq("tx"), lambda p, e: batches_of(fresh, p, e, [1] * 3))
        never = another(runtime, lost=lost_none, prefix="reloaded")
        try:
            assert await never.copy(txn, part, await never.batches(txn, part)) == 3
        finally:
            await never.close()
        return lost_whole, lost_part, lost_none, raised.value.message

    lost_whole, lost_part, lost_none, message = run(held_back, scenario)
    assert len(stored(pulsar_reader_client, whole)) == 3  # nothing stored again
    assert [a[2:] for a in lost_whole] == [(3, 3)]
    assert len(stored(pulsar_reader_client, part_of)) == 2  # nor in part
    assert [a[2:] for a in lost_part] == [(2, 3)]
    assert "left undone" in message
    assert len(stored(pulsar_reader_client, fresh)) == 3  # a name never used: copied
    assert lost_none == []


def test_a_decision_whose_batches_cannot_be_found_as_counted_is_reported_never_completed(
    pulsar, system, pulsar_reader_client
):
    """The journal no longer holds what the decision counted (here the decision counts
    one batch more than was journaled, as a journal trimmed by its retention would
    look): nothing is copied, CompleteCommit is never written, and the transaction
    says why (``unresolved``), with the gauge and a count of the attempts."""
    tid, topic = uniq("tx"), uniq("a")
    settings = Settings(
        pulsar_service_url=pulsar.service_url,
        pulsar_admin_url=pulsar.admin_url,
        system_namespace=system,
        log_level="WARNING",
    )

    async def scenario(runtime: Runtime) -> tuple[Transaction, int, dict[str, Any]]:
        copier = runtime.transactions._copier
        counted = copier.decision_end

        async def one_too_many(txn: Transaction, part: Partition) -> tuple[str | None, int]:
            end, n = await counted(txn, part)
            return end, n + 1

        copier.decision_end = one_too_many  # type: ignore[method-assign]
        ids = await runtime.transactions.init_producer_id(InitProducerId(tid))
        pid, epoch = ids.producer_id, ids.producer_epoch
        answers = await runtime.transactions.produce(
            tid, batches_of(topic, pid, epoch, [2, 2]), time.monotonic() + 30
        )
        assert [a.error for a in answers] == [None, None]
        await runtime.transactions.end(EndTxn(tid, pid, epoch, commit=True))
        deadline = time.monotonic() + 30
        while True:
            txn = await runtime.transactions.describe(tid)
            assert txn is not None
            if txn.unresolved is not None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        return txn, runtime.transactions.applier.unresolved(), runtime.transactions.stats.to_dict()

    txn, gauge, stats = run(settings, scenario)
    assert txn.state is TxnState.PREPARE_COMMIT
    assert txn.unresolved is not None
    assert "holds 2 of its batches" in txn.unresolved
    assert gauge == 1
    assert stats["copyUnresolvedAttempts"] >= 1
    assert stored(pulsar_reader_client, topic) == []
