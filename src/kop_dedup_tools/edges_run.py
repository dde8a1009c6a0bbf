"""``kop-dedup edges``: a seeded schedule (:mod:`.edges_plan`) run against real sidecars
with real Kafka clients (confluent-kafka: librdkafka), judged after every step by the
model (:mod:`.edges_model`).

After each step a read_committed consumer per live topic (assigned every partition from
offset 0, kept across steps, re-assigned when a topic grows) reads until it has seen
every committed value and reached each partition's end; the model then judges what it
read: nothing committed lost or read twice, nothing aborted, a transaction of unknown
outcome all or nothing, order kept. A reader that cannot get there within its bound
(``read_s`` plus a second per 2 MiB written since) is a violation: read_committed stuck
while the LSO could move. Every client call has a bound too (``answer_s`` plus a second
per MiB): an InitProducerId, a commit, a flush or an admin call over it is a violation
(a transactional id wedged, a partition refused for minutes).

>>> report = run_edges(EdgesConfig(seed=7, steps=10), service_url, admin_url)
>>> report.ok, report.text()
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewPartitions,
    NewTopic,
)

from kop_dedup_tools.edges_model import Model
from kop_dedup_tools.edges_plan import Profile, Step, describe, plan
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["EdgesConfig", "EdgesReport", "run_edges"]

_PER_MIB_S = 1.0


@dataclass(frozen=True, slots=True)
class EdgesConfig:
    seed: int
    steps: int = 12
    profile: Profile = field(default_factory=Profile)
    answer_s: float = 60.0
    """A client call's bound (plus a second per MiB it carries)."""
    read_s: float = 30.0
    """A check's bound (plus a second per 2 MiB written since the last check)."""
    workdir: Path | None = None
    sidecar_settings: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class EdgesReport:
    seed: int
    profile: Profile
    schedule: list[str]
    done: int = 0
    violations: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations and self.done == len(self.schedule)

    def text(self) -> str:
        lines = [
            (
                f"edges seed {self.seed}: {'PASSED' if self.ok else 'FAILED'} "
                f"({self.done} of {len(self.schedule)} steps, nodes {self.profile.nodes}, "
                f"max transaction {self.profile.max_txn_bytes / 2**20:.1f} MiB)"
            ),
            *(f"  VIOLATION {v}" for v in self.violations),
            "  counts: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())),
            "  figures: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.figures.items())),
        ]
        if not self.ok:
            lines.append(f"  replay: kop-dedup edges --seed {self.seed} (same options):")
            lines.extend(f"    {s}" for s in self.schedule)
        return "\n".join(lines)


def _value(step: Step, i: int) -> bytes:
    return f"s{step.index}-{i}|".encode().ljust(step.value_bytes, b".")


def _name(value: bytes | None) -> str:
    return (value or b"").split(b"|", 1)[0].decode()


class _Reader:
    """A read_committed consumer of one topic, from offset 0, kept across steps."""

    def __init__(self, bootstrap: str, topic: str, count: int) -> None:
        self.topic = topic
        self.got: dict[int, list[str]] = {}
        self.next: dict[int, int] = {}
        """The offset after the last record read, per partition."""
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"edges-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.count = 0
        self.grow(count)

    def grow(self, count: int) -> None:
        if count > self.count:
            self._consumer.incremental_assign(
                [TopicPartition(self.topic, p, 0) for p in range(self.count, count)]
            )
            for p in range(self.count, count):
                self.got[p] = []
            self.count = count

    def read(self, done: Callable[[dict[int, list[str]]], bool], limit_s: float) -> bool:
        """Read until ``done(got)`` and every partition's position is its high
        watermark (the end: an aborted transaction never reaches a data partition here);
        False past the limit."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                if done(self.got) and self._at_end():
                    return True
                continue
            partition, offset = msg.partition() or 0, msg.offset() or 0
            self.got[partition].append(_name(msg.value()))
            self.next[partition] = offset + 1
        return False

    def _at_end(self) -> bool:
        for p in range(self.count):
            try:
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=10, cached=False
                )
            except KafkaException:  # a partition just added, not in its metadata yet
                return False
            if self.next.get(p, 0) < high:
                return False
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._consumer.close()


class _Run:
    def __init__(self, cfg: EdgesConfig, service_url: str, admin_url: str, say: Any) -> None:
        self.cfg, self.say = cfg, say
        self.steps = plan(cfg.seed, cfg.steps, cfg.profile)
        self.report = EdgesReport(cfg.seed, cfg.profile, [describe(s) for s in self.steps])
        self.workdir = cfg.workdir or Path(f"edges-{cfg.seed}-{os.getpid()}")
        tag = f"{cfg.seed}-{uuid.uuid4().hex[:6]}"
        self.tag = tag
        self.nodes = [
            SidecarProcess(
                service_url,
                admin_url,
                log_dir=self.workdir,
                node_id=i + 1,
                system_namespace=f"edges-{tag}",
                cluster_refresh_ms=1000,
                **cfg.sidecar_settings,
            )
            for i in range(cfg.profile.nodes)
        ]
        self.model = Model()
        self.slots: list[str] = []
        self.readers: dict[str, _Reader] = {}
        self.written = 0
        self._peak_rss = 0.0
        self._sampling = threading.Event()

    # -- the cluster ----------------------------------------------------------------------

    def bootstrap(self, without: int | None = None) -> str:
        return ",".join(n.kafka_bootstrap for i, n in enumerate(self.nodes) if i != without)

    def start(self) -> None:
        threads = [threading.Thread(target=n.start, args=(120.0,)) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        want = list(range(1, len(self.nodes) + 1))
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=10) as http:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError, KeyError):
                    views = [http.get(f"{n.url}/v1/cluster").json() for n in self.nodes]
                    if all([m["nodeId"] for m in v["nodes"]] == want for v in views):
                        break
                time.sleep(0.2)
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._sampling.wait(0.25):
            for n in self.nodes:
                with contextlib.suppress(Exception):
                    self._peak_rss = max(self._peak_rss, n.rss_mb())

    def stop(self) -> None:
        self._sampling.set()
        for r in self.readers.values():
            r.close()
        for n in self.nodes:
            with contextlib.suppress(Exception):
                os.kill(n.pid, signal.SIGCONT)
            n.stop()

    # -- steps ------------------------------------------------------------------------------

    def violation(self, step: Step, text: str) -> None:
        line = f"{describe(step)}: {text}"
        self.report.violations.append(line)
        self.say(f"edges: VIOLATION {line}")

    def create_topic(self, count: int) -> str:
        name = f"edges-{self.tag}-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap()})
        for future in admin.create_topics([NewTopic(name, count, 1)]).values():
            future.result(timeout=self.cfg.answer_s)
        self.model.topic(name, count)
        self.readers[name] = _Reader(self.bootstrap(), name, count)
        return name

    def setup(self) -> None:
        rng = random.Random(self.cfg.seed)  # noqa: S311 - a schedule to replay, not a secret
        counts = [rng.randint(1, 3) for _ in range(self.cfg.profile.slots)]
        self.slots = [self.create_topic(c) for c in counts]

    def bound(self, nbytes: int, base: float) -> float:
        return base + _PER_MIB_S * nbytes / 2**20

    def run_step(self, step: Step) -> None:
        kind = step.kind
        self.report.counts[kind] = self.report.counts.get(kind, 0) + 1
        if kind in ("txn", "abort"):
            self._transaction(step)
        elif kind == "plain":
            self._plain(step, self.bootstrap(), self.cfg.answer_s)
        elif kind == "grow":
            self._grow(step)
        elif kind == "delete":
            self._delete(step)
        else:
            self._pause(step)

    def _spread(self, step: Step) -> dict[int, list[bytes]]:
        parts: dict[int, list[bytes]] = {p: [] for p in step.partitions}
        for i in range(step.records):
            parts[step.partitions[i % len(step.partitions)]].append(_value(step, i))
        return parts

    def _transaction(self, step: Step) -> None:
        topic = self.slots[step.slot]
        nbytes = step.records * step.value_bytes
        limit = self.bound(nbytes, self.cfg.answer_s)
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap(),
                "transactional.id": f"edges-{self.tag}-{step.transactional_id}",
                "linger.ms": 5,
                "transaction.timeout.ms": int(limit * 1000) + 60_000,
            }
        )
        parts = self._spread(step)
        names = {p: [_name(v) for v in vs] for p, vs in parts.items()}
        began = time.monotonic()
        try:
            producer.init_transactions(self.cfg.answer_s)
        except KafkaException as exc:
            bound = self.cfg.answer_s
            self.violation(step, f"InitProducerId not answered within {bound:.0f} s: {exc}")
            return
        outcome = self._send_and_end(step, producer, topic, parts, limit)
        took = time.monotonic() - began
        if took > limit:
            self.violation(step, f"the transaction took {took:.1f} s, over its bound {limit:.0f} s")
        if outcome == "committed":
            self.model.committed(topic, names)
            self.written += nbytes
        elif outcome == "aborted":
            self.model.aborted([n for vs in names.values() for n in vs])
        else:
            self.model.uncertain(topic, names)
            self.written += nbytes
        self.report.counts[f"txn {outcome}"] = self.report.counts.get(f"txn {outcome}", 0) + 1

    def _send_and_end(
        self,
        step: Step,
        producer: Producer,
        topic: str,
        parts: dict[int, list[bytes]],
        limit: float,
    ) -> str:
        """Send the transaction's values and end it as the step says (aborted when a send
        failed); its outcome as the client knows it: committed, aborted or uncertain."""
        producer.begin_transaction()
        failed: list[Any] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        for p, values in parts.items():
            for v in values:
                while True:
                    try:
                        producer.produce(topic, value=v, partition=p, on_delivery=report)
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain
                        producer.poll(0.1)
                producer.poll(0)
        left = producer.flush(limit)
        try:
            if left or failed or step.kind == "abort":
                producer.abort_transaction(self.cfg.answer_s)
                return "aborted"
            producer.commit_transaction(limit)
        except KafkaException as exc:
            err = exc.args[0]
            if not err.txn_requires_abort():
                self.say(f"edges: #{step.index} outcome unknown: {err}")
                return "uncertain"
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(self.cfg.answer_s)
            return "aborted"
        return "committed"

    def _plain(self, step: Step, bootstrap: str, limit: float) -> None:
        topic = self.slots[step.slot]
        [partition] = step.partitions
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "delivery.timeout.ms": int(limit * 1000),
            }
        )
        acked: list[str] = []
        failed: list[str] = []

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                acked.append(_name(msg.value()))

        began = time.monotonic()
        for i in range(step.records):
            producer.produce(topic, value=_value(step, i), partition=partition, on_delivery=report)
            producer.poll(0)
        producer.flush(limit + 5)
        took = time.monotonic() - began
        if failed or len(acked) < step.records:
            self.violation(
                step,
                f"{len(acked)} of {step.records} acknowledged in {took:.1f} s, "
                f"first error {failed[:1]}",
            )
        self.model.committed(topic, {partition: acked})

    def _grow(self, step: Step) -> None:
        topic = self.slots[step.slot]
        admin = AdminClient({"bootstrap.servers": self.bootstrap()})
        for future in admin.create_partitions([NewPartitions(topic, step.count)]).values():
            future.result(timeout=self.cfg.answer_s)
        self.model.topic(topic, step.count)
        self.readers[topic].grow(step.count)

    def _delete(self, step: Step) -> None:
        topic = self.slots[step.slot]
        self.readers.pop(topic).close()
        admin = AdminClient({"bootstrap.servers": self.bootstrap()})
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=self.cfg.answer_s)
        self.model.deleted(topic)
        self.slots[step.slot] = self.create_topic(step.count)

    def _pause(self, step: Step) -> None:
        node = self.nodes[step.node]
        os.kill(node.pid, signal.SIGSTOP)
        resumed = threading.Timer(step.seconds, os.kill, (node.pid, signal.SIGCONT))
        resumed.start()
        try:
            self._plain(step, self.bootstrap(without=step.node), step.seconds + self.cfg.answer_s)
        finally:
            resumed.join()

    def _judgeable(self, topic: str, got: dict[int, list[str]]) -> bool:
        return not self.model.waiting_for(topic, got)

    # -- the check --------------------------------------------------------------------------

    def check(self, step: Step) -> None:
        limit = self.cfg.read_s + self.written / 2**20 / 2
        self.written = 0
        for topic, reader in self.readers.items():
            began = time.monotonic()
            reached = reader.read(functools.partial(self._judgeable, topic), limit)
            self.report.figures["longest check s"] = max(
                self.report.figures.get("longest check s", 0.0), time.monotonic() - began
            )
            if not reached:
                waiting = self.model.waiting_for(topic, reader.got)
                self.violation(
                    step,
                    f"read_committed stuck {limit:.0f} s: "
                    + ("; ".join(waiting[:3]) or "no end reached"),
                )
            for v in self.model.check(topic, reader.got):
                self.violation(step, v)


def run_edges(
    cfg: EdgesConfig, service_url: str, admin_url: str, say: Callable[[str], None] = print
) -> EdgesReport:
    """Run the schedule of ``cfg`` against sidecars it starts on the broker given."""
    run = _Run(cfg, service_url, admin_url, say)
    started = time.monotonic()
    say(
        f"edges: seed {cfg.seed}, {cfg.steps} steps, {cfg.profile.nodes} node(s), "
        f"logs in {run.workdir}"
    )
    try:
        run.start()
        run.setup()
        for step in run.steps:
            t0 = time.monotonic()
            try:
                run.run_step(step)
            except Exception as exc:  # a client call that failed outright is a finding
                run.violation(step, f"{type(exc).__name__}: {exc}")
            t1 = time.monotonic()
            run.check(step)
            run.report.done += 1
            say(
                f"edges: {describe(step)} [{t1 - t0:.1f} s + check "
                f"{time.monotonic() - t1:.1f} s, {len(run.report.violations)} violation(s)]"
            )
            if run.report.violations:
                break
    finally:
        run.stop()
        run.report.figures["seconds"] = time.monotonic() - started
        run.report.figures["peak sidecar RSS MiB"] = run._peak_rss
    return run.report
