"""The transaction state machine of one transactional id, as pure data (Kafka's
``TransactionMetadata``): every transition the coordinator may make, and the Kafka
error for each one it may not.

The coordinator (``kop_dedup.coordination.transactions``) loads a
:class:`Transaction` from the transaction log, asks a function here for the next
one, writes that durably, and only then acts on it. Nothing here does I/O or reads a
clock; times are milliseconds passed in.

States (KIP-98)::

    Empty --produce/offsets--> Ongoing --end(commit)--> PrepareCommit --copy--> CompleteCommit
                                  |     --end(abort)---> PrepareAbort ---------> CompleteAbort
                                  |     --init/timeout-> PrepareEpochFence ----> CompleteAbort
    Complete* --produce/offsets--> Ongoing (the next transaction: ordinal + 1)

``ordinal`` counts the transactions of a transactional id; with the id it names one
transaction for good, and every journaled batch and copied record carries it.

>>> t = Transaction("app", producer_id=7, producer_epoch=0, timeout_ms=60_000)
>>> t = join(t, 7, 0, Partition("orders", 0, "start"), now_ms=10)
>>> (t.state, t.ordinal, [p.key for p in t.partitions])
(<TxnState.ONGOING: 'Ongoing'>, 1, [('orders', 0)])
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import replace

from kop_dedup import errors
from kop_dedup.protocol.records import MAX_EPOCH
from kop_dedup.protocol.transaction_state import (
    HISTORY,
    SHARED,
    Completed,
    Offset,
    Partition,
    PartitionEnd,
    Transaction,
    TxnState,
)

__all__ = [
    "SHARED",
    "Completed",
    "EndCheck",
    "Offset",
    "Partition",
    "PartitionEnd",
    "Transaction",
    "TxnState",
    "asked",
    "begin",
    "check_end",
    "check_token",
    "complete",
    "doubt",
    "exhausted",
    "fence",
    "init",
    "join",
    "known",
    "needs_new_producer_id",
    "prepare",
    "producer_problem",
    "share",
    "stage_offsets",
    "timed_out",
    "unresolved",
]


def producer_problem(
    txn: Transaction,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    *,
    on_produce: bool,
) -> errors.KafkaError | None:
    """Kafka: another producer id (a non-idempotent batch's -1 too) -> 49; an older
    epoch -> 47 on produce, 90 on the transaction calls; a newer one than the
    coordinator knows is refused too (only the coordinator bumps a transactional
    producer's epoch). An unknown id is :func:`known`'s 49, checked first."""
    if producer_id != txn.producer_id:
        return errors.InvalidProducerIdMapping(
            f"transactional id {transactional_id!r} maps to producer {txn.producer_id}, "
            f"not {producer_id}; call init-producer-id"
        )
    fenced = errors.InvalidProducerEpoch if on_produce else errors.ProducerFenced
    if epoch < txn.producer_epoch:
        return fenced(
            f"producer {producer_id} epoch {epoch} is fenced: transactional id "
            f"{transactional_id!r} is at epoch {txn.producer_epoch}"
        )
    if epoch > txn.producer_epoch:
        return fenced(
            f"epoch {epoch} was never handed out for {transactional_id!r} (it is at "
            f"{txn.producer_epoch}): transactional producers get epochs from init-producer-id"
        )
    return None


def _check_producer(txn: Transaction, producer_id: int, epoch: int, *, on_produce: bool) -> None:
    problem = producer_problem(txn, txn.transactional_id, producer_id, epoch, on_produce=on_produce)
    if problem is not None:
        raise problem


def known(txn: Transaction | None, transactional_id: str) -> Transaction:
    """The id's state; 49 INVALID_PRODUCER_ID_MAPPING for an id never initialised."""
    if txn is None:
        raise errors.InvalidProducerIdMapping(
            f"transactional id {transactional_id!r} is unknown: call init-producer-id with it"
        )
    return txn


def _busy(txn: Transaction) -> errors.ConcurrentTransactions:
    return errors.ConcurrentTransactions(
        f"transaction {txn.ordinal} of {txn.transactional_id!r} is {txn.state.value}: "
        "retry once it is complete"
    )


def init(
    txn: Transaction | None,
    transactional_id: str,
    *,
    timeout_ms: int,
    check_back_url: str | None,
    now_ms: int,
    new_producer_id: int | None,
    expected: tuple[int, int] | None = None,
) -> Transaction:
    """InitProducerId (Kafka's ``prepareInitProducerIdTransit``): the next epoch, or a
    new producer id once the epoch is exhausted (:func:`needs_new_producer_id`), or for
    a new transactional id.

    ``expected`` (KIP-360): the caller's current (producer id, epoch). It must name the
    id's producer id (or the one a rotation replaced, at an exhausted epoch), else
    PRODUCER_FENCED; the current epoch is bumped, the epoch the last bump replaced is
    answered again as it stands (a retry whose answer was lost), any other is fenced.

    Raises ConcurrentTransactions while a decision is applied; an Ongoing transaction
    must be fenced first (:func:`fence`)."""
    if txn is not None and (txn.state.preparing or txn.state is TxnState.ONGOING):
        raise _busy(txn)  # Ongoing: the caller fences it first (and answers 51 itself)
    if txn is None:
        if new_producer_id is None:
            raise ValueError("a new producer id is needed")
        return Transaction(
            transactional_id,
            new_producer_id,
            0,
            timeout_ms,
            check_back_url=check_back_url,
            updated_ms=now_ms,
        )
    if expected is not None and not _names_producer(txn, expected):
        raise errors.ProducerFenced(
            f"producer {expected[0]} epoch {expected[1]} is fenced: transactional id "
            f"{transactional_id!r} is producer {txn.producer_id} at epoch {txn.producer_epoch}"
        )
    pid, epoch, last_epoch = txn.producer_id, txn.producer_epoch + 1, -1
    if needs_new_producer_id(txn, expected):
        if new_producer_id is None:
            raise ValueError("a new producer id is needed")
        pid, epoch = new_producer_id, 0
        last_epoch = txn.producer_epoch if expected is not None else -1
    elif expected is not None and expected[1] == txn.producer_epoch:
        last_epoch = txn.producer_epoch
    elif expected is not None and expected[1] == txn.last_producer_epoch:
        pid, epoch, last_epoch = txn.producer_id, txn.producer_epoch, txn.last_producer_epoch
    elif expected is not None:
        raise _not_current(txn, expected)
    return replace(
        txn,
        producer_id=pid,
        producer_epoch=epoch,
        last_producer_id=txn.producer_id,
        last_producer_epoch=last_epoch,
        timeout_ms=timeout_ms,
        check_back_url=check_back_url,
        check_backs=0,
        updated_ms=now_ms,
    )


def _not_current(txn: Transaction, expected: tuple[int, int]) -> errors.ProducerFenced:
    """An init naming an epoch of the id's producer that is neither its current nor its
    last one: older (fenced) or never handed out (ahead)."""
    pid, epoch = expected
    if epoch > txn.producer_epoch:
        return errors.ProducerFenced(
            f"producer {pid} epoch {epoch} is ahead of transactional id "
            f"{txn.transactional_id!r}'s epoch {txn.producer_epoch}: it was never handed "
            "out; call init-producer-id without producerId and producerEpoch"
        )
    return errors.ProducerFenced(
        f"producer {pid} epoch {epoch} is fenced: transactional id "
        f"{txn.transactional_id!r} is at epoch {txn.producer_epoch}"
    )


def exhausted(epoch: int) -> bool:
    """No epoch after this one may be handed out to a producer (Kafka's
    ``isEpochExhausted``: Short.MaxValue - 1). Epoch 32767 is never handed out, so the
    coordinator can always fence the producer of the last one (:func:`fence`)."""
    return epoch >= MAX_EPOCH - 1


def _names_producer(txn: Transaction, expected: tuple[int, int]) -> bool:
    pid, epoch = expected
    return pid == txn.producer_id or (pid == txn.last_producer_id and exhausted(epoch))


def needs_new_producer_id(txn: Transaction | None, expected: tuple[int, int] | None = None) -> bool:
    """Whether :func:`init` needs a new producer id: a new transactional id, or an
    exhausted epoch that the caller (when it names one) still holds."""
    if txn is None:
        return True
    return exhausted(txn.producer_epoch) and (expected is None or expected[1] == txn.producer_epoch)


def _begin(txn: Transaction, now_ms: int, token: str | None = None) -> Transaction:
    """Start the next transaction if none is open (protocol v2: no separate begin
    call), bound to ``token``; the last one's token goes to the history."""
    if txn.state is TxnState.ONGOING:
        return txn
    history = txn.history
    if txn.token is not None and txn.state.complete:
        history = (*history, Completed(txn.token, txn.ordinal, txn.state.commits))[-HISTORY:]
    return replace(
        txn,
        state=TxnState.ONGOING,
        ordinal=txn.ordinal + 1,
        partitions=(),
        offsets=(),
        started_ms=now_ms,
        check_backs=0,
        in_doubt=False,
        token=token,
        history=history,
        unresolved=None,
    )


def check_token(txn: Transaction, token: str | None, commit: bool | None = None) -> EndCheck:
    """Whether a request naming transaction ``token`` may act on the id's state
    (``commit``: an end-txn's decision; None: a produce or a staging of offsets).

    No token: PROCEED (as before tokens). The token of the open transaction (Ongoing,
    or decided and being applied): PROCEED. A token naming a complete transaction: an
    end-txn of the same decision is DONE (answer 0), anything else 48. Any other token:
    48 while a transaction is open (it never joins, stages into or ends it), and for an
    end-txn (it names no transaction); a produce or a staging PROCEEDs (it begins the
    next transaction, once the one being applied is complete)."""
    if token is None:
        return EndCheck.PROCEED
    if txn.token == token and (txn.state is TxnState.ONGOING or txn.state.preparing):
        return EndCheck.PROCEED
    named = _named(txn, token)
    tid = txn.transactional_id
    if named is not None:
        outcome = "committed" if named.committed else "aborted"
        if commit is not None and named.committed == commit:
            return EndCheck.DONE
        raise errors.InvalidTxnState(
            f"transaction {named.ordinal} of {tid!r} (token {token!r}) is complete and was "
            f"{outcome}" + ("" if commit is not None else ": nothing joins it any more")
        )
    if txn.state is TxnState.ONGOING:
        raise errors.InvalidTxnState(
            f"token {token!r} is not that of transaction {txn.ordinal} of {tid!r}, which is "
            "open: a request of another transaction never acts on it"
        )
    if commit is not None:
        raise errors.InvalidTxnState(f"token {token!r} names no transaction of {tid!r}")
    return EndCheck.PROCEED


def _named(txn: Transaction, token: str) -> Completed | None:
    """The complete transaction ``token`` names, if the id remembers one."""
    if txn.token == token and txn.state.complete:
        return Completed(token, txn.ordinal, txn.state.commits)
    return next((c for c in reversed(txn.history) if c.token == token), None)


def begin(txn: Transaction, producer_id: int, epoch: int, *, now_ms: int) -> Transaction:
    """AddOffsetsToTxn (and any first call of a transaction): begin a transaction if
    none is open. Errors as Kafka's transaction calls answer them."""
    _check_producer(txn, producer_id, epoch, on_produce=False)
    if txn.state.preparing:
        raise _busy(txn)
    return _begin(txn, now_ms)


def join(
    txn: Transaction,
    producer_id: int,
    epoch: int,
    partition: Partition,
    *,
    now_ms: int,
    token: str | None = None,
) -> Transaction:
    """A transactional batch for ``partition``: start the transaction if none is open,
    and add the partition if it is new. Errors as Kafka's produce path answers them
    (and 48 for a token of another transaction: :func:`check_token`)."""
    _check_producer(txn, producer_id, epoch, on_produce=True)
    check_token(txn, token)
    if txn.state.preparing:
        raise _busy(txn)
    txn = _begin(txn, now_ms, token)
    if txn.partition(partition.topic, partition.partition) is not None:
        return txn
    return replace(txn, partitions=(*txn.partitions, partition), updated_ms=now_ms)


def share(txn: Transaction, topic: str, partition: int) -> Transaction:
    """Another sidecar journals a batch for a joined partition: no local copy holds all
    of the partition's batches any more (the copy reads the journal)."""
    part = txn.partition(topic, partition)
    if part is None or part.journaler == SHARED:
        return txn
    shared = tuple(replace(p, journaler=SHARED) if p is part else p for p in txn.partitions)
    return replace(txn, partitions=shared)


def stage_offsets(
    txn: Transaction,
    producer_id: int,
    epoch: int,
    offsets: Iterable[Offset],
    *,
    now_ms: int,
    token: str | None = None,
) -> Transaction:
    """TxnOffsetCommit: stage offsets in the transaction (the latest per partition wins;
    48 for a token of another transaction)."""
    _check_producer(txn, producer_id, epoch, on_produce=False)
    check_token(txn, token)
    if txn.state.preparing:
        raise _busy(txn)
    txn = _begin(txn, now_ms, token)
    staged = {o.key: o for o in txn.offsets}
    staged.update({o.key: o for o in offsets})
    return replace(txn, offsets=tuple(staged.values()), updated_ms=now_ms)


class EndCheck(enum.Enum):
    PROCEED = "proceed"
    """Ongoing: gather the journal ends, then :func:`prepare`."""
    DONE = "done"
    """The same decision completed already: answer 0."""


def check_end(
    txn: Transaction, producer_id: int, epoch: int, commit: bool, token: str | None = None
) -> EndCheck:
    """EndTxn, before any I/O: may the decision be taken, or was it taken already?"""
    _check_producer(txn, producer_id, epoch, on_produce=False)
    if check_token(txn, token, commit) is EndCheck.DONE:
        return EndCheck.DONE
    want = "commit" if commit else "abort"
    if txn.state is TxnState.ONGOING:
        return EndCheck.PROCEED
    if txn.state.complete and txn.state.commits == commit:
        return EndCheck.DONE
    if txn.state.preparing and txn.state.commits == commit:
        raise _busy(txn)
    raise errors.InvalidTxnState(
        f"cannot {want}: transaction {txn.ordinal} of {txn.transactional_id!r} is {txn.state.value}"
    )


def prepare(
    txn: Transaction,
    commit: bool,
    ends: dict[tuple[str, int], PartitionEnd],
    *,
    now_ms: int,
) -> Transaction:
    """The decision: PrepareCommit or PrepareAbort, naming what each partition's copy
    must be (``ends``: (topic, partition) -> its journal end, data start and batch
    count; a partition missing from it records none: an abort copies nothing)."""
    if txn.state is not TxnState.ONGOING and txn.state is not TxnState.PREPARE_EPOCH_FENCE:
        raise errors.InvalidTxnState(f"cannot prepare from {txn.state.value}")
    partitions = []
    for p in txn.partitions:
        end = ends.get(p.key, _NO_END)
        partitions.append(
            replace(
                p,
                journal_end=end.journal_end,
                data_start=end.data_start,
                batches=end.batches,
            )
        )
    state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    if txn.state is TxnState.PREPARE_EPOCH_FENCE:
        state = TxnState.PREPARE_EPOCH_FENCE
    return replace(txn, state=state, partitions=tuple(partitions), updated_ms=now_ms)


_NO_END = PartitionEnd(None, None, None)


def fence(txn: Transaction, *, now_ms: int) -> Transaction:
    """Fence the producer of an Ongoing transaction (a new init, or its timeout): bump
    the epoch; the transaction will be aborted. Handed-out epochs stop at 32766
    (:func:`exhausted`), so the bump is always possible (an id a release before this
    one took to 32767 keeps it: such a producer is then fenced by the abort only), and
    the next init moves to a new producer id."""
    if txn.state is not TxnState.ONGOING:
        raise errors.InvalidTxnState(f"cannot fence a transaction that is {txn.state.value}")
    epoch = min(txn.producer_epoch + 1, MAX_EPOCH)
    return replace(
        txn,
        producer_epoch=epoch,
        last_producer_epoch=-1,
        state=TxnState.PREPARE_EPOCH_FENCE,
        updated_ms=now_ms,
    )


def doubt(txn: Transaction, *, now_ms: int) -> Transaction:
    """A timed-out transaction whose producer registered a check-back URL: fence the
    producer (epoch + 1; its batches and calls are refused from now on) and keep the
    transaction open while the application is asked (:func:`asked`)."""
    if txn.state is not TxnState.ONGOING:
        raise errors.InvalidTxnState(f"cannot check back on a {txn.state.value} transaction")
    epoch = min(txn.producer_epoch + 1, MAX_EPOCH)
    return replace(
        txn,
        producer_epoch=epoch,
        last_producer_epoch=-1,
        in_doubt=True,
        check_backs=0,
        updated_ms=now_ms,
    )


def asked(txn: Transaction, *, now_ms: int) -> Transaction:
    """One more check-back answered UNKNOWN (or not at all)."""
    return replace(txn, check_backs=txn.check_backs + 1, updated_ms=now_ms)


def complete(txn: Transaction, *, now_ms: int) -> Transaction:
    """The decision is applied (copied and offsets written, or nothing for an abort)."""
    if not txn.state.preparing:
        raise errors.InvalidTxnState(f"cannot complete a transaction that is {txn.state.value}")
    commit = txn.state is TxnState.PREPARE_COMMIT
    state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    return replace(txn, state=state, updated_ms=now_ms, unresolved=None)


def unresolved(
    txn: Transaction, reason: str, partitions: tuple[tuple[str, int], ...] = ()
) -> Transaction:
    """The decision's copy cannot complete for ``reason`` in ``partitions`` (kept for
    operators to read; the decision is retried, never completed in part). ``updated_ms``
    is kept: it orders a recovery's decisions."""
    if not txn.state.preparing:
        raise errors.InvalidTxnState(f"a {txn.state.value} transaction has nothing to copy")
    parts = tuple(replace(p, unresolved=p.key in partitions) for p in txn.partitions)
    return replace(txn, unresolved=reason, partitions=parts)


def timed_out(txn: Transaction, now_ms: int) -> bool:
    """Ongoing (and not already in doubt) for longer than its timeout."""
    return (
        txn.state is TxnState.ONGOING
        and not txn.in_doubt
        and now_ms - txn.started_ms >= txn.timeout_ms
    )
