"""Group members of each Kafka client, each on a thread of its own (or a process, to be
killed): subscribe to a topic in a group, commit after each batch, record what they
read and what they were assigned, until stopped."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["Member", "killable_member", "split", "wait_until"]

SESSION_MS = 3000
HEARTBEAT_MS = 300


def wait_until(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or check}")


class Member:
    """One consumer in a group on its own thread: ``kind`` is confluent, kafka-python or
    aiokafka. ``seen`` holds (partition, offset) of each record read; ``assigned`` the
    partitions it holds now."""

    def __init__(self, kind: str, bootstrap: str, topic: str, group: str) -> None:
        self.kind, self.bootstrap, self.topic, self.group = kind, bootstrap, topic, group
        self.seen: list[tuple[int, int]] = []
        self.assigned: frozenset[int] = frozenset()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"member-{kind}")

    def start(self) -> Member:
        self._thread.start()
        return self

    def halt(self) -> None:
        """Stop (a LeaveGroup as it closes), checking nothing: for cleanup."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def stop(self) -> None:
        self.halt()
        assert not self._thread.is_alive(), f"{self.kind} did not stop"
        assert self.errors == [], self.errors

    def _run(self) -> None:
        try:
            {"confluent": self._confluent, "kafka-python": self._kafka_python}.get(
                self.kind, lambda: asyncio.run(self._aiokafka())
            )()
        except BaseException as exc:
            self.errors.append(exc)

    def _confluent(self) -> None:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        c.subscribe([self.topic])
        try:
            while not self._stop.is_set():
                msgs = c.consume(100, 0.2)
                got = [(m.partition(), m.offset()) for m in msgs if m.error() is None]
                if got:
                    self.seen.extend(got)
                    c.commit(asynchronous=False)
                self.assigned = frozenset(tp.partition for tp in c.assignment())
        finally:
            c.close()

    def _kafka_python(self) -> None:
        from kafka import KafkaConsumer

        c = KafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
        )
        try:
            while not self._stop.is_set():
                batch = c.poll(timeout_ms=200)
                got = [(tp.partition, m.offset) for tp, ms in batch.items() for m in ms]
                if got:
                    self.seen.extend(got)
                    c.commit()
                self.assigned = frozenset(tp.partition for tp in c.assignment())
        finally:
            c.close()

    async def _aiokafka(self) -> None:
        from aiokafka import AIOKafkaConsumer

        c = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
        )
        await c.start()
        try:
            while not self._stop.is_set():
                batch = await c.getmany(timeout_ms=200)
                got = [(tp.partition, m.offset) for tp, ms in batch.items() for m in ms]
                if got:
                    self.seen.extend(got)
                    await c.commit()
                self.assigned = frozenset(tp.partition for tp in c.assignment())
        finally:
            await c.stop()


_SCRIPT = f"""
import sys
from kafka import KafkaConsumer
c = KafkaConsumer(sys.argv[2], bootstrap_servers=sys.argv[1], group_id=sys.argv[3],
                  enable_auto_commit=False, auto_offset_reset="earliest",
                  session_timeout_ms={SESSION_MS}, heartbeat_interval_ms={HEARTBEAT_MS})
while True:
    c.poll(timeout_ms=200)
"""


def killable_member(bootstrap: str, topic: str, group: str) -> subprocess.Popen[str]:
    """A kafka-python member in a process of its own (SIGKILL it: no LeaveGroup)."""
    return subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, bootstrap, topic, group],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def split(members: list[Member], partitions: int) -> bool:
    """Every partition held by exactly one member, every member holding some."""
    held = [m.assigned for m in members]
    union: set[int] = set().union(*held)
    return all(held) and sum(len(h) for h in held) == partitions and union == set(range(partitions))
