"""``kop-dedup load``: play retrying idempotent Kafka producers against the sidecar.

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

Record values name ``pid:partition:sequence:`` (padded) so :func:`verify`
can read every partition back and count what was lost, duplicated, out of
order or corrupted.

In-process use (tests, notebooks)::

    report = asyncio.run(run_load(LoadConfig(urls=("http://127.0.0.1:8090",), topics=("t",))))
    print(verify("pulsar://127.0.0.1:6650", ["t"], report).to_dict())

    with BackgroundLoad(config) as load:       # in a thread with its own loop
        load.wait_for(lambda r: r.answered >= 20, timeout=60)
        ...                                    # inject a fault
        load.stop()                            # no new batches; in-flight ones finish
    report = load.report
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Self

import httpx

from kop_dedup.cli import add_pulsar_url_options
from kop_dedup.protocol.records import SEQ_MODULUS, unwrap
from kop_dedup.pulsar.wire import PROP_PRODUCER_ID, PROP_SEQUENCE
from kop_dedup_tools.measure import latency_summary_ms
from kop_dedup_tools.topics import create_topic

__all__ = [
    "RETRIABLE_CODES",
    "BackgroundLoad",
    "LoadConfig",
    "LoadError",
    "LoadReport",
    "Slot",
    "VerifyReport",
    "add_cli",
    "run_load",
    "verify",
]

RETRIABLE_CODES = frozenset({3, 6, 7, 19, 51, 56})
"""Kafka codes a client retries with the same producer id, epoch and sequence."""
_DELIVERED = (0, 46)
_OUT_OF_ORDER = 45
_FAIL_OVER_STATUS = frozenset({408, 429})

Slot = tuple[str, int, int]
"""(Kafka topic, partition, producer id): one sequence of batches."""
Ranges = tuple[tuple[int, int], ...]
"""(first extended sequence, count) runs, ascending."""


class LoadError(RuntimeError):
    """The load could not start (no producer id from any sidecar)."""


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """What to play. Per (producer, topic, partition): ``batches`` batches of ``records``."""

    urls: tuple[str, ...]
    topics: tuple[str, ...]
    partitions: int = 1
    producers: int = 4
    producer_ids: tuple[int, ...] = ()
    """Use these producer ids instead of asking ``/v1/init-producer-id`` (then
    ``producers`` is ignored)."""
    epoch: int = 0
    first_sequence: int = 0
    """Sequence of each partition's first record (a producer without state there may
    start anywhere; near 2**31 - 1 it exercises the wraparound)."""
    batches: int = 50
    records: int = 10
    in_flight: int = 5
    value_size: int = 32
    request_timeout_ms: int = 10_000
    """``timeoutMs`` of every produce request; the HTTP client waits 5 s longer."""
    delivery_timeout_s: float = 120.0
    """Per batch, from its first send: past it the batch is given up (fatal)."""
    duration_s: float | None = None
    """Start no new batch after this long (None: send them all)."""
    connections: int = 64
    token: str | None = None
    progress_every_s: float = 5.0
    """Print a progress line to stderr this often (0: never)."""

    def __post_init__(self) -> None:
        if not self.urls or not self.topics:
            raise ValueError("a load needs at least one sidecar URL and one topic")
        if min(self.partitions, self.records, self.in_flight, self.connections) < 1:
            raise ValueError("partitions, records, in_flight and connections must be >= 1")
        if not 0 <= self.first_sequence < SEQ_MODULUS:
            raise ValueError(f"first_sequence must be in 0..{SEQ_MODULUS - 1}")

    @property
    def lanes(self) -> int:
        """(producer, topic, partition) sequences the load plays."""
        n = len(self.producer_ids) or self.producers
        return n * len(self.topics) * self.partitions


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What the producers were told. ``delivered`` is what :func:`verify` must read back
    exactly once; ``uncertain`` batches were given up without a definite answer (they may
    or may not be stored)."""

    producer_ids: tuple[int, ...] = ()
    sent_batches: int = 0
    sent_records: int = 0
    acknowledged: int = 0
    duplicates: int = 0
    requests: int = 0
    retries: int = 0
    retry_reasons: dict[str, int] = field(default_factory=dict)
    fatal: dict[str, int] = field(default_factory=dict)
    desynced_producers: tuple[int, ...] = ()
    failovers: int = 0
    elapsed_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    """Per batch, first send to definite answer: p50, p99, max."""
    delivered: dict[Slot, Ranges] = field(default_factory=dict)
    uncertain: dict[Slot, Ranges] = field(default_factory=dict)
    finished: bool = False

    @property
    def answered(self) -> int:
        """Batches with a definite answer (0 or 46)."""
        return self.acknowledged + self.duplicates

    @property
    def delivered_records(self) -> int:
        return sum(n for runs in self.delivered.values() for _, n in runs)

    @property
    def records_per_s(self) -> float:
        return round(self.delivered_records / self.elapsed_s, 1) if self.elapsed_s else 0.0

    @property
    def ok(self) -> bool:
        return not self.fatal

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the counters, without the per-slot ranges."""
        d = {k: v for k, v in asdict(self).items() if k not in ("delivered", "uncertain")}
        d["delivered_records"] = self.delivered_records
        d["records_per_s"] = self.records_per_s
        d["uncertain_records"] = sum(n for runs in self.uncertain.values() for _, n in runs)
        return d


# -- the driver --------------------------------------------------------------------


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


class _Load:
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
    return await _Load(config, stop).run()


class BackgroundLoad:
    """:func:`run_load` in a thread with its own event loop; watch it while it runs.

    ``snapshot()`` is a live :class:`LoadReport`; ``stop()`` asks for no new
    batches; ``join()`` waits for the final report (and re-raises the load's
    exception, if any).
    """

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._load: _Load | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._report: LoadReport | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kop-dedup-load", daemon=True)

    def _main(self) -> None:
        async def body() -> LoadReport:
            self._loop = asyncio.get_running_loop()
            self._load = _Load(self.config, self._stop)
            self._ready.set()
            return await self._load.run()

        try:
            self._report = asyncio.run(body())
        except BaseException as exc:  # handed to join()
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait(30)
        return self

    def snapshot(self) -> LoadReport:
        if self._report is not None:
            return self._report
        load, loop = self._load, self._loop
        if load is None or loop is None:
            return LoadReport()

        async def take() -> LoadReport:
            return load.snapshot()

        try:
            return asyncio.run_coroutine_threadsafe(take(), loop).result(10)
        except RuntimeError:  # the loop closed in between: the final report is there
            return self._report if self._report is not None else LoadReport()

    def wait_for(
        self, predicate: Callable[[LoadReport], bool], timeout: float, poll: float = 0.05
    ) -> LoadReport:
        """Poll until ``predicate(snapshot)`` holds; TimeoutError past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.snapshot()
            if predicate(report):
                return report
            if self._error is not None:
                raise self._error
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise TimeoutError(f"load did not get there within {timeout}s: {report.to_dict()}")
            time.sleep(poll)

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> LoadReport:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the load did not finish within {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return self._report

    @property
    def report(self) -> LoadReport:
        return self.join(0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._thread.join(self.config.delivery_timeout_s + 30)


# -- reading back ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What reading the topics back found, for the load's producers."""

    read: int
    """Records of the load's producers read back."""
    expected: int
    """Records the producers were told were delivered."""
    lost: int
    """Delivered but not read back."""
    duplicated: int
    """Extra copies read (a record read 3 times counts 2)."""
    out_of_order: int
    """Records read after a higher sequence of the same producer on the same partition."""
    unexpected: int
    """Records never sent, or not delivered nor given up (should be impossible)."""
    uncertain_stored: int
    """Records of batches given up without an answer that are stored after all."""
    corrupt: int
    """Records whose value does not name their producer, partition and sequence."""
    other: int
    """Records of other producers on the same topics (ignored)."""
    seconds: float

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.unexpected) and (
            not self.corrupt
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _seqs(runs: Ranges) -> set[int]:
    return {(first + i) % SEQ_MODULUS for first, n in runs for i in range(n)}


def verify(
    service_url: str,
    topics: Sequence[str],
    expected: LoadReport | Mapping[Slot, Ranges],
    *,
    partitions: int | None = None,
    uncertain: Mapping[Slot, Ranges] | None = None,
    tenant: str = "public",
    namespace: str = "kafka",
    read_timeout_ms: int = 30_000,
) -> VerifyReport:
    """Read each partition of ``topics`` from the earliest; compare with what was delivered.

    ``expected`` is a :class:`LoadReport` (its ``delivered`` and ``uncertain``)
    or a mapping of slot -> delivered runs. ``partitions`` defaults to the
    highest partition the expectation names, plus one.
    """
    import pulsar  # noqa: PLC0415 - the CLI's load path does not need the client

    if isinstance(expected, LoadReport):
        uncertain = expected.uncertain if uncertain is None else uncertain
        expected = expected.delivered
    want = {slot: _seqs(runs) for slot, runs in expected.items()}
    maybe = {slot: _seqs(runs) for slot, runs in (uncertain or {}).items()}
    pids = {pid for _, _, pid in [*want, *maybe]}
    started = time.monotonic()
    seen: Counter[tuple[Slot, int]] = Counter()
    out_of_order = corrupt = other = 0
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        for topic in topics:
            count = partitions or 1 + max((p for t, p, _ in want if t == topic), default=0)
            for p in range(count):
                reader = client.create_reader(
                    f"persistent://{tenant}/{namespace}/{topic}-partition-{p}",
                    pulsar.MessageId.earliest,
                )
                last: dict[int, int] = {}
                try:
                    while reader.has_message_available():
                        msg = reader.read_next(read_timeout_ms)
                        props = msg.properties()
                        pid = int(props.get(PROP_PRODUCER_ID, "-1"))
                        if pid not in pids:
                            other += 1
                            continue
                        seq = int(props[PROP_SEQUENCE])
                        ext = unwrap(seq, last.get(pid))
                        if pid in last and ext < last[pid]:
                            out_of_order += 1
                        last[pid] = max(ext, last.get(pid, ext))
                        seen[((topic, p, pid), seq)] += 1
                        if not msg.data().startswith(f"{pid}:{p}:{seq}:".encode()):
                            corrupt += 1
                finally:
                    reader.close()
    finally:
        client.close()
    expected_keys = {(slot, s) for slot, seqs in want.items() for s in seqs}
    maybe_keys = {(slot, s) for slot, seqs in maybe.items() for s in seqs}
    return VerifyReport(
        read=sum(seen.values()),
        expected=len(expected_keys),
        lost=sum(1 for key in expected_keys if key not in seen),
        duplicated=sum(c - 1 for c in seen.values() if c > 1),
        out_of_order=out_of_order,
        unexpected=sum(1 for key in seen if key not in expected_keys and key not in maybe_keys),
        uncertain_stored=sum(1 for key in seen if key in maybe_keys),
        corrupt=corrupt,
        other=other,
        seconds=round(time.monotonic() - started, 3),
    )


# -- the command -------------------------------------------------------------------


def _handler(args: argparse.Namespace) -> int:
    topics = tuple(args.topic)
    if args.pulsar_admin_url:
        for topic in topics:
            create_topic(
                args.pulsar_admin_url, topic, partitions=args.partitions, namespace=args.namespace
            )
    cfg = LoadConfig(
        urls=tuple(args.url or ["http://127.0.0.1:8090"]),
        topics=topics,
        partitions=args.partitions,
        producers=args.producers,
        producer_ids=tuple(args.producer_id or ()),
        epoch=args.epoch,
        first_sequence=args.first_sequence,
        batches=args.batches,
        records=args.records,
        in_flight=args.in_flight,
        value_size=args.value_size,
        request_timeout_ms=args.request_timeout_ms,
        delivery_timeout_s=args.delivery_timeout,
        duration_s=args.duration,
        connections=args.connections,
        token=os.environ.get("KOP_DEDUP_TOKEN"),
        progress_every_s=args.progress_every,
    )
    report = asyncio.run(run_load(cfg))
    out: dict[str, Any] = {"load": report.to_dict()}
    ok = report.ok
    if args.verify:
        tenant, namespace = args.namespace.split("/", 1)
        v = verify(args.pulsar_service_url, topics, report, tenant=tenant, namespace=namespace)
        out["verify"] = v.to_dict()
        ok = ok and v.ok
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for section, values in out.items():
            print(f"{section}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    return 0 if ok else 1


def add_cli(subparsers: Any) -> None:
    """Register ``kop-dedup load``."""
    p = subparsers.add_parser(
        "load",
        help="play retrying idempotent Kafka producers against the sidecar",
        description="Play idempotent Kafka producers that retry every batch with the same "
        "producer id, epoch and sequences until a definite answer (up to --in-flight "
        "batches per partition, failing over between --url's), then optionally read the "
        "topics back (--verify). Exit status 1 when a batch failed or verification did.",
    )
    add = p.add_argument
    add("--url", action="append", help="sidecar URL; repeat for fail-over (default :8090)")
    add("--topic", action="append", required=True, help="Kafka topic; repeat for several")
    add("--partitions", type=int, default=1, help="partitions written per topic")
    add("--producers", type=int, default=4, help="producer ids to ask for")
    add("--producer-id", type=int, action="append", help="use this producer id (repeat)")
    add("--epoch", type=int, default=0)
    add("--first-sequence", type=int, default=0, help="sequence of each partition's first record")
    add("--batches", type=int, default=50, help="per producer and partition")
    add("--records", type=int, default=10, help="per batch")
    add("--in-flight", type=int, default=5, help="batches in flight per producer and partition")
    add("--value-size", type=int, default=32, help="bytes per record value")
    add("--request-timeout-ms", type=int, default=10_000, help="timeoutMs of each request")
    add("--delivery-timeout", type=float, default=120.0, help="seconds per batch, then fatal")
    add("--duration", type=float, default=None, help="start no batch after N seconds")
    add("--connections", type=int, default=64, help="HTTP connections (keep-alive)")
    add("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    add("--verify", action="store_true", help="read the topics back and compare")
    add_pulsar_url_options(
        p,
        optional_admin=True,
        service_help="Pulsar service URL for --verify",
        admin_help="create the topics with --partitions first through this admin URL (else "
        "the sidecar auto-creates them with its default partition count)",
    )
    add("--namespace", default="public/kafka", help="tenant/namespace of the topics")
    add("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_handler)
