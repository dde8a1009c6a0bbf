"""The Kafka cells of ``kop-dedup bench --kafka --groups``: a group of confluent-kafka
consumers draining a seeded topic, and the consume-transform-produce loop; the same code
against the sidecar's listener and against a real Kafka (only the bootstrap differs).

Both **join first**: each member (one thread, one consumer) subscribes in a fresh group
and pauses every partition it is given, until the group is stable (every partition owned,
every member owning some); then all resume at once and the clock starts. The rebalances
of a group forming (seconds with the eager protocol: each join makes every member rejoin)
are a cost paid once per group, not per record: the join time is kept beside the rate
(``join_s``), and the direct side's subscriptions are timed as they always were
(:func:`kop_dedup_tools.bench.groups_cells.direct_cell`).

- **consume** (:func:`consume_cell`): each member loops ``consume(--pull-records)`` and,
  after a batch that gave records, an asynchronous commit when the last is
  :data:`COMMIT_INTERVAL_S` old, until every record of the topic has been read; then a
  synchronous commit. The rate is the records over the time
  from the start to the last member's final commit. Checked: every partition's offsets
  came once each in order (:class:`~kop_dedup_tools.bench.groups_cells.OffsetCheck`), and
  the group's committed offsets read back are each partition's end.
- **ctp** (:func:`ctp_cell`): each member is a copier, a ``read_committed`` consumer and
  a transactional producer: begin, consume up to ``txn_records`` records, produce each
  (value reversed) to the same partition of an output topic,
  ``send_offsets_to_transaction(positions, consumer.consumer_group_metadata())``,
  commit; again until ``seconds`` have passed or the input is drained. The rate is the
  committed records over the time to the last commit. Checked: the group's committed
  offsets add up to the records copied.

>>> cell = consume_cell("listener", sc.kafka_bootstrap, topic, 8, 100, 25_000, 1, sc)
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, NoReturn

from kop_dedup_tools.bench.cells import Cell, Workload, extras
from kop_dedup_tools.bench.groups_cells import PARTITIONS, OffsetCheck, group_cell
from kop_dedup_tools.bench.kafka_clients import PRODUCER_CONFIG, create
from kop_dedup_tools.bench.support import cpu_seconds
from kop_dedup_tools.measure import percentile_ms
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = [
    "COMMIT_INTERVAL_S",
    "CONSUMER_CONFIG",
    "DRAIN_S",
    "JOIN_S",
    "consume_cell",
    "ctp_cell",
]

CONSUMER_CONFIG: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    # a group forms in a few heartbeats: the default 3 s interval made 8 members take 20 s
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 500,
}
"""What every consumer of the mode is given besides its bootstrap and group."""

COMMIT_INTERVAL_S = 0.1
"""A consumer commits (asynchronously) after a batch at most this often: as often as
the Pulsar client sends the direct side's grouped acknowledgements (its default
``ackGroupingTime``, 100 ms). A commit after every 100-record batch queued commits behind
each other on the listener (p99 11 s at 3,000 records/s), and the final synchronous
commit waited for all of them."""
JOIN_S = 120.0
"""How long a group may take to become stable."""
DRAIN_S = 600.0
"""How long a consume cell may take to read everything (it fails past that)."""


class _Member:
    """One consumer on its own thread: joins paused (see the module docstring), waits
    for the group's ``go``, then runs ``work(consumer)``; keeps the consumer open until
    the group's ``close``, so that no member's leave rebalances the others while they
    still read."""

    def __init__(self, group: _Group, work: Callable[[Any], None], conf: dict[str, Any]) -> None:
        self.group, self.work, self.conf = group, work, conf
        self.assigned: frozenset[int] = frozenset()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from confluent_kafka import Consumer  # noqa: PLC0415 - the bench's own dependency

        go, close = self.group.go, self.group.close
        try:
            consumer = Consumer(self.conf)
            try:
                consumer.subscribe(
                    [self.group.topic], on_assign=self._assign, on_revoke=self._revoke
                )
                while not go.is_set():
                    consumer.poll(0.05)  # serves the rebalance callbacks; paused: no records
                if not close.is_set():  # set already: the group failed to form
                    consumer.resume(consumer.assignment())
                    self.work(consumer)
                    self.group.ended.append(time.monotonic())
                close.wait()
            finally:
                consumer.close()
        except BaseException as exc:  # raised again in the caller's thread
            self.failure = exc
            go.set()

    def _assign(self, consumer: Any, partitions: list[Any]) -> None:
        consumer.assign(partitions)
        if not self.group.go.is_set():
            consumer.pause(partitions)
        self.assigned = frozenset(tp.partition for tp in partitions)

    def _revoke(self, _consumer: Any, _partitions: list[Any]) -> None:
        self.assigned = frozenset()


class _Group:
    """A fresh group of members on ``topic``: :meth:`join` (not timed), :meth:`go`, then
    :meth:`wait` for every member's work, then :meth:`finish` (every consumer closed)."""

    def __init__(self, bootstrap: str, topic: str, stem: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.id = f"{stem}-{uuid.uuid4().hex[:8]}"
        self.go, self.close = threading.Event(), threading.Event()
        self.members: list[_Member] = []
        self.ended: list[float] = []
        """When each member's work returned."""

    def add(self, work: Callable[[Any], None], **conf: Any) -> None:
        base = {"bootstrap.servers": self.bootstrap, "group.id": self.id, **CONSUMER_CONFIG}
        self.members.append(_Member(self, work, {**base, **conf}))

    def _stable(self) -> bool:
        owned = [m.assigned for m in self.members]
        every = frozenset().union(*owned)
        return all(owned) and sum(map(len, owned)) == PARTITIONS == len(every)

    def join(self) -> float:
        """Start the members and wait for a stable group; its seconds."""
        t0 = time.monotonic()
        for m in self.members:
            m.thread.start()
        while not self._stable():
            if time.monotonic() - t0 > JOIN_S or self._failure():
                self.close.set()
                self.go.set()
                self._raise(TimeoutError(f"no stable group within {JOIN_S:.0f} s"))
            time.sleep(0.05)
        return time.monotonic() - t0

    def wait(self, stop: Callable[[], None]) -> float:
        """Until every member's work has returned; the last one's time. On a member's
        failure, ``stop`` the others' work, close and raise it."""
        while len(self.ended) < len(self.members):
            if self._failure():
                stop()
                self.close.set()
                self._raise(RuntimeError("a member stopped"))
            time.sleep(0.02)
        return max(self.ended)

    def finish(self) -> None:
        """Close every consumer; drop the members (and the producers their work holds),
        so that no client outlives the cell and reconnects to a stopped sidecar."""
        self.close.set()
        for m in self.members:
            m.thread.join(timeout=60)
        failure = self._failure()
        self.members.clear()
        if failure is not None:
            raise RuntimeError(f"a member of group {self.id} failed: {failure!r}") from failure

    def _failure(self) -> BaseException | None:
        return next((m.failure for m in self.members if m.failure is not None), None)

    def _raise(self, otherwise: BaseException) -> NoReturn:
        failure = self._failure()
        if failure is None:
            raise otherwise
        raise RuntimeError(f"a member of group {self.id} failed: {failure!r}") from failure


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=60)}
    finally:
        consumer.close()


def _per_record(cpu: float, records: int) -> float | None:
    return round(cpu / records * 1e6, 2) if records else None


class _Commits:
    """Asynchronous commits' latencies (answers come back in the order they were sent)
    and the first failure."""

    def __init__(self) -> None:
        self.sent: deque[float] = deque()
        self.latencies: list[float] = []
        self.failure: Any = None

    def __call__(self, err: Any, _partitions: Any) -> None:
        if self.sent:
            self.latencies.append(time.monotonic() - self.sent.popleft())
        if err is not None and err.code() != _no_offset():
            self.failure = self.failure or err


def _no_offset() -> int:
    from confluent_kafka import KafkaError  # noqa: PLC0415

    return int(KafkaError._NO_OFFSET)  # librdkafka's "nothing to commit"


class _Drain:
    """What the members of one consume cell share: the offsets seen, the counts, the
    latencies; ``done`` when every partition has been read to its end."""

    def __init__(self, side: str, pull_records: int, per_partition: int) -> None:
        self.side, self.pull_records, self.per_partition = side, pull_records, per_partition
        self.check, self.lock, self.records = OffsetCheck(), threading.Lock(), 0
        self.pulls: list[float] = []
        self.cycles: list[float] = []
        self.commits, self.done = _Commits(), threading.Event()
        self.started = 0.0

    def drained(self) -> bool:
        return all(self.check.next.get(p, 0) >= self.per_partition for p in range(PARTITIONS))

    def read(self, consumer: Any) -> None:
        """One member's loop: consume, commit now and then, until the topic is read."""
        mine_p, mine_c = [], []
        last_commit = 0.0
        while not self.done.is_set():
            t0 = time.monotonic()
            msgs = consumer.consume(self.pull_records, 0.1)
            t1 = time.monotonic()
            if t1 - self.started > DRAIN_S:
                raise TimeoutError(f"{self.side}: not everything read within {DRAIN_S:.0f} s")
            if not msgs:
                continue
            due = t1 - last_commit >= COMMIT_INTERVAL_S
            self._seen(msgs, due)
            if due:
                consumer.commit(asynchronous=True)
                last_commit = t1
            mine_p.append(t1 - t0)
            mine_c.append(time.monotonic() - t0)
        _commit_last(consumer)
        with self.lock:
            self.pulls.extend(mine_p)
            self.cycles.extend(mine_c)

    def _seen(self, msgs: list[Any], commit: bool) -> None:
        with self.lock:
            for m in msgs:
                if m.error() is not None:
                    raise RuntimeError(f"a consume failed: {m.error()}")
                self.check.see(m.partition(), m.offset())
            self.records += len(msgs)
            if self.drained():
                self.done.set()
            if commit:
                self.commits.sent.append(time.monotonic())


def consume_cell(
    side: str,
    bootstrap: str,
    topic: str,
    members: int,
    pull_records: int,
    per_partition: int,
    rep: int,
    sidecar: SidecarProcess | None = None,
) -> Cell:
    """A fresh group of ``members`` consumers reads the whole topic (see the module
    docstring)."""
    group = _Group(bootstrap, topic, "bench-kg")
    drain = _Drain(side, pull_records, per_partition)
    for _ in range(members):
        group.add(drain.read, on_commit=drain.commits)
    join_s = group.join()
    cpu0, sc0, drain.started = time.process_time(), cpu_seconds(sidecar), time.monotonic()
    group.go.set()
    elapsed = group.wait(drain.done.set) - drain.started
    sc_cpu, cpu = cpu_seconds(sidecar) - sc0, time.process_time() - cpu0
    rss = sidecar.rss_mb() if sidecar is not None else None
    group.finish()
    if drain.commits.failure is not None:
        raise RuntimeError(f"{side}: a commit failed: {drain.commits.failure}")
    committed = _committed(bootstrap, group.id, topic)
    return group_cell(
        Workload("consume", members, pull_records),
        side,
        rep,
        drain.records,
        elapsed,
        (drain.cycles, drain.pulls, drain.commits.latencies),
        sidecar_cpu_s=sc_cpu if sidecar is not None else None,
        rss_mb=None if rss is None else round(rss, 1),
        drained=drain.drained(),
        gaps=drain.check.gaps,
        committed_ok=all(committed.get(p) == per_partition for p in range(PARTITIONS)),
        join_s=round(join_s, 2),
        client_cpu_us_per_record=_per_record(cpu, drain.records),
    )


def _commit_last(consumer: Any) -> None:
    """The final synchronous commit (nothing new to commit is fine)."""
    from confluent_kafka import KafkaException  # noqa: PLC0415

    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != _no_offset():
            raise


class _Copy:
    """What the copiers of one ctp cell share: the window, the counts, the latencies."""

    def __init__(self, out_topic: str, txn_records: int, total: int) -> None:
        self.out_topic, self.txn_records, self.total = out_topic, txn_records, total
        self.stop_at = 0.0
        self.drained = threading.Event()
        self.lock = threading.Lock()
        self.read = self.committed = self.transactions = 0
        self.latencies: list[float] = []

    def running(self) -> bool:
        return not self.drained.is_set() and time.monotonic() < self.stop_at

    def copier(self, producer: Any) -> Callable[[Any], None]:
        """One copier's loop: transactions until the window ends or the input is read,
        and at least one (a window shorter than the first fetch would measure nothing)."""

        def loop(consumer: Any) -> None:
            mine: list[float] = []
            while self.running() or not mine:
                n, began = self._transaction(consumer, producer, first=not mine)
                if not n:
                    continue  # the window ended before a record came
                mine.append(time.monotonic() - began)
                with self.lock:
                    self.committed += n
                    self.transactions += 1
            with self.lock:
                self.latencies.extend(mine)

        return loop

    def _transaction(self, consumer: Any, producer: Any, *, first: bool) -> tuple[int, float]:
        """Up to ``txn_records`` records copied in one transaction, begun at the first
        record (the first transaction waits for one however long the window), committed
        with the consumer's positions; how many, and when it began."""
        n, began = 0, 0.0
        while n < self.txn_records and (self.running() or (first and not n)):
            msgs = consumer.consume(self.txn_records - n, 0.1)
            if msgs and not n:
                began = time.monotonic()
                producer.begin_transaction()
            elif not n and time.monotonic() > self.stop_at + DRAIN_S:
                raise TimeoutError(f"no record to copy within {DRAIN_S:.0f} s")
            for m in msgs:
                if m.error() is not None:
                    raise RuntimeError(f"a consume failed: {m.error()}")
                _send(producer, self.out_topic, m)
            n += len(msgs)
            with self.lock:
                self.read += len(msgs)
                if self.read >= self.total:
                    self.drained.set()
        if n:
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(
                [tp for tp in positions if tp.offset >= 0],
                consumer.consumer_group_metadata(),
                60,
            )
            producer.commit_transaction(60)
        return n, began


def ctp_cell(
    side: str,
    bootstrap: str,
    topic: str,
    copiers: int,
    txn_records: int,
    seconds: float,
    per_partition: int,
    rep: int,
    sidecar: SidecarProcess | None = None,
) -> Cell:
    """``copiers`` consume-transform-produce loops in a fresh group (see the module
    docstring), for ``seconds`` or until the input is drained."""
    from confluent_kafka import Producer  # noqa: PLC0415

    group = _Group(bootstrap, topic, "bench-kctp")
    copy = _Copy(f"{group.id}-out", txn_records, per_partition * PARTITIONS)
    create(bootstrap, copy.out_topic, PARTITIONS)
    for i in range(copiers):
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                **PRODUCER_CONFIG,
                "transactional.id": f"{group.id}-{i}",
            }
        )
        producer.init_transactions(60)
        group.add(copy.copier(producer), **{"isolation.level": "read_committed"})
    join_s = group.join()
    cpu0, sc0, started = time.process_time(), cpu_seconds(sidecar), time.monotonic()
    copy.stop_at = started + seconds
    group.go.set()
    elapsed = group.wait(copy.drained.set) - started
    sc_cpu, cpu = cpu_seconds(sidecar) - sc0, time.process_time() - cpu0
    group.finish()
    committed = _committed(bootstrap, group.id, topic)
    return Cell(
        Workload("ctp", copiers, txn_records),
        side,
        rep,
        copy.committed,
        elapsed,
        percentile_ms(copy.latencies, 50),
        percentile_ms(copy.latencies, 99),
        sc_cpu if sidecar is not None else None,
        extra=extras(
            transactions=copy.transactions,
            drained=copy.drained.is_set(),
            committed_ok=sum(o for o in committed.values() if o >= 0) == copy.committed,
            join_s=round(join_s, 2),
            client_cpu_us_per_record=_per_record(cpu, copy.committed),
        ),
    )


def _send(producer: Any, topic: str, msg: Any) -> None:
    """The transform (the value reversed) into the same partition of ``topic``."""
    value = msg.value()
    while True:
        try:
            producer.produce(topic, value[::-1], msg.key(), partition=msg.partition())
        except BufferError:
            producer.poll(0.001)
        else:
            return
