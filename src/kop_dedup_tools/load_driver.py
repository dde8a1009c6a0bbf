"""The load driver: retrying idempotent Kafka producers played against the sidecar.

Each producer (a producer id from ``/v1/init-producer-id``, or one given)
writes ``batches`` batches of ``records`` records to every partition of every
topic, with up to ``in_flight`` batches in flight per (producer, partition),
the way a Kafka client with ``enable.idempotence`` does. Every batch is
retried with the same producer id, epoch and sequences until a definite
answer, bounded by ``delivery_timeout_s``:

* 0 (stored) and 46 DUPLICATE_SEQUENCE_NUMBER (stored before) are delivered;
* retriable codes (3, 6, 7, 19, 51, 56), HTTP 5xx/408/429, refused or reset
  connections and client timeouts are retried with backoff; transport errors
  and 5xx move the producer to the next sidecar URL (producers start spread
  round-robin over the URLs);
* 45 OUT_OF_ORDER_SEQUENCE_NUMBER is retried while an earlier batch of the
  same partition is still unresolved (it is being retried, so the gap is
  expected: what Java's producer and librdkafka do); on the head-of-line
  batch it is a sequence desync: counted as fatal, and the producer stops;
* any other code is fatal for that batch (counted); the partition stops
  taking new batches, since its sequence can no longer continue.

Record values name ``pid:partition:sequence:`` (padded) so
:func:`~kop_dedup_tools.load_verify.verify` can read every partition back and count
what was lost, duplicated, out of order or corrupted.

>>> report = asyncio.run(run_load(LoadConfig(urls=("http://127.0.0.1:8090",), topics=("t",))))
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from kop_dedup.protocol.records import SEQ_MODULUS
from kop_dedup_tools.load_types import (
    RETRIABLE_CODES,
    LoadConfig,
    LoadError,
    LoadReport,
    Ranges,
    Slot,
)
from kop_dedup_tools.measure import latency_summary_ms

__all__ = ["LoadRun", "run_load"]

_DELIVERED = (0, 46)
_OUT_OF_ORDER = 45
_FAIL_OVER_STATUS = frozenset({408, 429})


class _Cursor:
    """A producer's sidecar URL: sticky, moves on to the next when one fails."""

    __slots__ = ("_i", "_urls")

    def __init__(self, urls: tuple[str, ...], start: int) -> None:
        self._urls, self._i = urls, start

    @property
    def current(self) -> str:
        return self._urls[self._i % len(self._urls)]

    def fail_over(self, url: str) -> bool:
        """Move on from ``url`` unless a concurrent request already did."""
        if len(self._urls) > 1 and url == self.current:
            self._i += 1
            return True
        return False


@dataclass(slots=True)
class _Producer:
    pid: int
    cursor: _Cursor
    stopped: bool = False


@dataclass(slots=True)
class _Lane:
    """One producer's batches on one partition."""

    topic: str
    partition: int
    producer: _Producer
    window: asyncio.Semaphore
    unresolved: set[int] = field(default_factory=set)
    delivered: set[int] = field(default_factory=set)
    given_up: set[int] = field(default_factory=set)
    stopped: bool = False

    @property
    def slot(self) -> Slot:
        return (self.topic, self.partition, self.producer.pid)


def _value(pid: int, partition: int, seq: int, size: int) -> bytes:
    return f"{pid}:{partition}:{seq}:".encode().ljust(size, b".")


def _runs(indices: Iterable[int], first: int, records: int) -> Ranges:
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        start = first + i * records
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + records)
        else:
            out.append((start, records))
    return tuple(out)


class LoadRun:
    """One run; all state lives on the event loop that runs it."""

    def __init__(self, cfg: LoadConfig, stop: threading.Event | None) -> None:
        self.cfg, self.stop = cfg, stop
        self.started = time.monotonic()
        self.stop_at = None if cfg.duration_s is None else self.started + cfg.duration_s
        self.producers: list[_Producer] = []
        self.lanes: list[_Lane] = []
        self.tally: Counter[str] = Counter()
        self.retry_reasons: Counter[str] = Counter()
        self.fatal: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.finished = False
        self.elapsed: float | None = None
        self.client: httpx.AsyncClient | None = None

    # -- reporting

    def snapshot(self) -> LoadReport:
        cfg = self.cfg
        return LoadReport(
            producer_ids=tuple(p.pid for p in self.producers),
            sent_batches=self.tally["sent_batches"],
            sent_records=self.tally["sent_batches"] * cfg.records,
            acknowledged=self.tally["acknowledged"],
            duplicates=self.tally["duplicates"],
            requests=self.tally["requests"],
            retries=sum(self.retry_reasons.values()),
            retry_reasons=dict(self.retry_reasons),
            fatal=dict(self.fatal),
            desynced_producers=tuple(p.pid for p in self.producers if p.stopped),
            failovers=self.tally["failovers"],
            elapsed_s=round(
                self.elapsed if self.elapsed is not None else time.monotonic() - self.started, 3
            ),
            latency_ms=latency_summary_ms(self.latencies),
            delivered={
                ln.slot: _runs(ln.delivered, cfg.first_sequence, cfg.records) for ln in self.lanes
            },
            uncertain={
                ln.slot: _runs(ln.given_up, cfg.first_sequence, cfg.records)
                for ln in self.lanes
                if ln.given_up
            },
            finished=self.finished,
        )

    def _stopping(self) -> bool:
        if self.stop is not None and self.stop.is_set():
            return True
        return self.stop_at is not None and time.monotonic() >= self.stop_at

    async def _progress(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.progress_every_s)
            r = self.snapshot()
            print(
                f"load: {r.elapsed_s:6.1f}s sent {r.sent_batches} batches, acked "
                f"{r.acknowledged}, duplicate {r.duplicates}, retries {r.retries}, "
                f"fatal {sum(r.fatal.values())}, {r.records_per_s} rec/s",
                file=sys.stderr,
                flush=True,
            )

    # -- HTTP

    async def _post(self, cursor: _Cursor, path: str, content: bytes) -> tuple[Any, str]:
        """(parsed JSON or None, why not): None means retry, or a fatal reason."""
        assert self.client is not None
        url = cursor.current
        self.tally["requests"] += 1
        try:
            r = await self.client.post(
                f"{url}{path}", content=content, headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as exc:  # refused, reset, timed out, broken pipe
            self.tally["failovers"] += cursor.fail_over(url)
            return None, f"http:{type(exc).__name__}"
        if r.status_code != 200:
            if r.status_code >= 500 or r.status_code in _FAIL_OVER_STATUS:
                self.tally["failovers"] += cursor.fail_over(url)
                return None, f"http:{r.status_code}"
            return None, f"fatal-http:{r.status_code}"
        try:
            return r.json(), ""
        except ValueError:
            return None, "http:bad-json"

    # -- producers

    async def _init_producer(self, index: int) -> _Producer:
        cursor = _Cursor(self.cfg.urls, index)
        if self.cfg.producer_ids:
            return _Producer(self.cfg.producer_ids[index], cursor)
        deadline = time.monotonic() + self.cfg.delivery_timeout_s
        backoff, last = 0.05, ""
        while time.monotonic() < deadline:
            answer, why = await self._post(cursor, "/v1/init-producer-id", b"{}")
            if isinstance(answer, dict) and answer.get("errorCode") == 0:
                return _Producer(int(answer["producerId"]), cursor)
            last = why or f"answer {answer}"
            if why.startswith("fatal"):
                break
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
        raise LoadError(f"no producer id from {', '.join(self.cfg.urls)}: {last}")

    def _body(self, lane: _Lane, index: int) -> bytes:
        cfg = self.cfg
        pid, p = lane.producer.pid, lane.partition
        base = (cfg.first_sequence + index * cfg.records) % SEQ_MODULUS
        seqs = [(base + i) % SEQ_MODULUS for i in range(cfg.records)]
        return json.dumps(
            {
                "timeoutMs": cfg.request_timeout_ms,
                "batches": [
                    {
                        "topic": lane.topic,
                        "partition": p,
                        "producerId": pid,
                        "producerEpoch": cfg.epoch,
                        "baseSequence": base,
                        "lastSequence": seqs[-1],
                        "records": [
                            {"value": base64.b64encode(_value(pid, p, s, cfg.value_size)).decode()}
                            for s in seqs
                        ],
                    }
                ],
            }
        ).encode()

    @staticmethod
    def _judge(answer: Any, why: str, earlier_unresolved: bool) -> tuple[str, str]:
        """(what to do, why) for one attempt: delivered, retry, fatal or desync."""
        if answer is None:
            if why.startswith("fatal"):
                return "fatal", why.removeprefix("fatal-")
            return "retry", why
        try:
            code = int(answer["results"][0]["errorCode"])
        except (KeyError, IndexError, TypeError, ValueError):
            return "retry", "http:bad-answer"
        if code in _DELIVERED:
            return "delivered", str(code)
        if code == _OUT_OF_ORDER:
            # behind a batch that is being retried the gap is expected (Kafka clients
            # retry it too); on the head of the line it is a desync
            return ("retry", "45-behind-retried-batch") if earlier_unresolved else ("desync", "45")
        return ("retry", f"code:{code}") if code in RETRIABLE_CODES else ("fatal", str(code))

    async def _batch(self, lane: _Lane, index: int) -> None:
        """Send one batch until a definite answer or its delivery timeout."""
        content = self._body(lane, index)
        self.tally["sent_batches"] += 1
        started = time.monotonic()
        deadline = started + self.cfg.delivery_timeout_s
        backoff = 0.05
        while True:
            answer, why = await self._post(lane.producer.cursor, "/v1/produce", content)
            earlier = any(i < index for i in lane.unresolved)
            action, why = self._judge(answer, why, earlier)
            if action == "delivered":
                self.tally["acknowledged" if why == "0" else "duplicates"] += 1
                lane.delivered.add(index)
                self.latencies.append(time.monotonic() - started)
                return
            if action != "retry":
                self._give_up(lane, index, why, desync=action == "desync")
                return
            if time.monotonic() + backoff >= deadline:
                self._give_up(lane, index, "delivery_timeout", uncertain=True)
                return
            self.retry_reasons[why] += 1
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
            backoff = min(backoff * 2, 1.0)

    def _give_up(
        self, lane: _Lane, index: int, reason: str, *, desync: bool = False, uncertain: bool = False
    ) -> None:
        """A batch ends without delivery: its partition (or, on a desync, its producer) takes
        no new batch, since the sequence cannot go on from a batch that failed."""
        self.fatal[reason] += 1
        lane.stopped = True
        if desync:
            lane.producer.stopped = True
        if uncertain:
            lane.given_up.add(index)  # no definite answer: it may or may not be stored

    async def _play(self, lane: _Lane) -> None:
        tasks: list[asyncio.Task[None]] = []

        async def one(index: int) -> None:
            try:
                await self._batch(lane, index)
            finally:
                lane.unresolved.discard(index)
                lane.window.release()

        for index in range(self.cfg.batches):
            await lane.window.acquire()
            if self._stopping() or lane.stopped or lane.producer.stopped:
                lane.window.release()
                break
            lane.unresolved.add(index)
            tasks.append(asyncio.create_task(one(index)))
        await asyncio.gather(*tasks)

    async def run(self) -> LoadReport:
        cfg = self.cfg
        n = len(cfg.producer_ids) or cfg.producers
        limits = httpx.Limits(
            max_connections=cfg.connections, max_keepalive_connections=cfg.connections
        )
        timeout = httpx.Timeout(cfg.request_timeout_ms / 1000 + 5, connect=5, pool=None)
        headers = {"authorization": f"Bearer {cfg.token}"} if cfg.token else {}
        progress = None
        async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
            self.client = client
            self.producers = list(await asyncio.gather(*(self._init_producer(i) for i in range(n))))
            self.lanes = [
                _Lane(topic, p, producer, asyncio.Semaphore(cfg.in_flight))
                for producer in self.producers
                for topic in cfg.topics
                for p in range(cfg.partitions)
            ]
            if cfg.progress_every_s > 0:
                progress = asyncio.create_task(self._progress())
            try:
                await asyncio.gather(*(self._play(lane) for lane in self.lanes))
            finally:
                if progress is not None:
                    progress.cancel()
        self.elapsed = time.monotonic() - self.started
        self.finished = True
        return self.snapshot()


async def run_load(config: LoadConfig, *, stop: threading.Event | None = None) -> LoadReport:
    """Play the load to the end (all batches, ``duration_s``, or ``stop`` set) and report.

    Setting ``stop`` starts no new batch; batches in flight still get their
    definite answer (or reach their delivery timeout). Raises
    :class:`LoadError` when no sidecar hands out producer ids.
    """
    return await LoadRun(config, stop).run()
