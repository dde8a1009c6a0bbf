"""The soak's librdkafka copier: consume-transform-produce exactly once, as a process.

``python -m kop_dedup_tools.soak_copier --bootstrap A,B --group G --transactional-id T
--input IN --output OUT`` runs what Kafka's exactly-once system test runs with the Java
copier, with confluent-kafka (librdkafka): a read_committed consumer subscribed in a
group, a transactional producer, and per poll one transaction that copies each record
to the same partition of the output and commits the consumer's positions with its group
metadata (``send_offsets_to_transaction``). A seeded share of the transactions is
aborted on purpose (``--abort-rate``), after which the consumer goes back to the
group's committed offsets. It runs until SIGTERM or SIGINT (the soak decides when the
work is done); an error the client says is fatal (fenced, a broken sequence) ends it
with status 2, and the soak starts it again, as a deployment would.

Every copy carries the header ``soak.attempt`` naming its transaction attempt
(``<transactional id>/<incarnation>/<n>``), and stdout gets one JSON line per step,
written before the step is taken::

    {"e": "begin", "a": "t-0/0/7", "n": 50}      # records in the attempt
    {"e": "commit", "a": "t-0/0/7"}              # about to ask to commit
    {"e": "committed", "a": "t-0/0/7", "n": 50}  # the commit was answered
    {"e": "abort", "a": "t-0/0/7", "why": "random"}
    {"e": "error", "where": "commit", "error": "...", "fatal": false}
    {"e": "idle"}                                # nothing to copy for 10 s

So an attempt with a ``begin`` and no ``commit`` line was never asked to commit: its
records must never be read (the soak's ``aborted`` check). One with ``commit`` and no
``committed`` (killed while committing) may have committed: it is not judged.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from kop_dedup_tools.soak_check import ATTEMPT_HEADER

__all__ = ["main"]

_RETRY_FOR_S = 60.0
_IDLE_EVERY_S = 10.0
T = TypeVar("T")


class _Fatal(Exception):
    pass


class _Abort(Exception):
    pass


def _emit(**event: Any) -> None:
    event["t"] = round(time.time(), 3)
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _call(where: str, fn: Callable[[], T]) -> T:
    """``fn()``, again while librdkafka says the error is retriable (up to a minute);
    :class:`_Abort` when the transaction must be aborted, :class:`_Fatal` otherwise."""
    deadline = time.monotonic() + _RETRY_FOR_S
    while True:
        try:
            return fn()
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            fatal = err.fatal() or not (err.retriable() or err.txn_requires_abort())
            _emit(e="error", where=where, error=str(err), fatal=fatal)
            if err.txn_requires_abort():
                raise _Abort(str(err)) from exc
            if fatal or time.monotonic() > deadline:
                raise _Fatal(f"{where}: {err}") from exc
            time.sleep(0.2)


def _rewind(consumer: Consumer) -> None:
    """Back to the group's committed offsets (after an abort), as Kafka's copier does."""
    assigned = consumer.assignment()
    if not assigned:
        return
    committed = _call("committed", lambda: consumer.committed(assigned, timeout=30))
    for tp in committed:
        offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
        _call(
            "seek", functools.partial(consumer.seek, TopicPartition(tp.topic, tp.partition, offset))
        )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kop_dedup_tools.soak_copier")
    add = p.add_argument
    add("--bootstrap", required=True)
    add("--group", required=True)
    add("--transactional-id", required=True)
    add("--input", required=True)
    add("--output", required=True)
    add("--incarnation", type=int, default=0, help="how often the soak started this id")
    add("--transaction-size", type=int, default=50, help="records per poll and transaction")
    add("--batch-records", type=int, default=10, help="librdkafka batch.num.messages")
    add("--abort-rate", type=float, default=0.1, help="share of transactions aborted")
    add("--seed", type=int, default=0)
    add("--transaction-timeout-ms", type=int, default=60_000)
    add("--session-timeout-ms", type=int, default=10_000)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": args.session_timeout_ms,
            "max.poll.interval.ms": 180_000,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.transactional_id,
            "transaction.timeout.ms": args.transaction_timeout_ms,
            "linger.ms": 5,
            "batch.num.messages": args.batch_records,
            "debug": "eos",  # the transaction's steps on stderr: what a hang waited for
        }
    )
    status = 0
    try:
        _call("init", lambda: producer.init_transactions(60))
        consumer.subscribe([args.input])
        _emit(e="start", id=args.transactional_id, incarnation=args.incarnation)
        _loop(args, consumer, producer, stop)
    except (_Fatal, _Abort) as exc:
        _emit(e="fatal", error=str(exc))
        status = 2
    finally:
        _emit(e="stop", status=status)
        consumer.close()
    return status


def _loop(
    args: argparse.Namespace, consumer: Consumer, producer: Producer, stop: threading.Event
) -> None:
    """One transaction per poll until ``stop`` (see the module docstring)."""
    prefix = f"{args.transactional_id}/{args.incarnation}"
    rng = random.Random(f"{args.seed}/{prefix}")  # noqa: S311 - a replayable choice, no secret
    n = 0
    quiet_since = time.monotonic()
    while not stop.is_set():
        messages = [m for m in consumer.consume(args.transaction_size, 1.0) if not m.error()]
        if not messages:
            if time.monotonic() - quiet_since >= _IDLE_EVERY_S:  # alive, nothing to do
                _emit(e="idle")
                quiet_since = time.monotonic()
            continue
        quiet_since = time.monotonic()
        attempt = f"{prefix}/{n}"
        n += 1
        _emit(e="begin", a=attempt, n=len(messages))
        why = None
        try:
            _copy(producer, consumer, messages, args.output, attempt)
            if rng.random() < args.abort_rate:
                why = "random"
            else:
                _emit(e="commit", a=attempt)
                _call("commit", lambda: producer.commit_transaction(60))
                _emit(e="committed", a=attempt, n=len(messages))
        except _Abort as exc:
            why = str(exc)
        if why is not None:
            _emit(e="abort", a=attempt, why=why)
            _call("abort", lambda: producer.abort_transaction(60))
            _rewind(consumer)


def _copy(
    producer: Producer, consumer: Consumer, messages: list[Any], output: str, attempt: str
) -> None:
    _call("begin", producer.begin_transaction)
    headers: list[tuple[str, str | bytes | None]] = [(ATTEMPT_HEADER, attempt.encode())]
    for m in messages:
        while True:
            try:
                producer.produce(
                    output, m.value(), m.key(), partition=m.partition(), headers=headers
                )
                break
            except BufferError:
                producer.poll(0.1)
    positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
    metadata = consumer.consumer_group_metadata()
    _call("send-offsets", lambda: producer.send_offsets_to_transaction(positions, metadata, 30))


if __name__ == "__main__":
    raise SystemExit(main())
