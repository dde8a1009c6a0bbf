"""``kop-dedup load``: play idempotent Kafka producers against one or more sidecars.

Each producer (a producer id from ``/v1/init-producer-id``) writes ``batches``
batches of ``records`` records to every partition of a topic, keeping up to
``in_flight`` batches in flight per partition, the way a Kafka client with
``enable.idempotence`` does. Every batch is retried with the same producer
id, epoch and sequences until a definite answer: 0 (stored) or 46 (stored
before) count as delivered; retriable codes, HTTP errors, refused or reset
connections and timeouts are retried with backoff, failing over to the next
sidecar URL; 45 is retried while an earlier batch of the same partition is
still unresolved (its gap is being retried, as the Java client does) and is
fatal otherwise. Values name ``pid:partition:sequence`` so :func:`verify` can
read everything back and count what was lost, duplicated or reordered.

>>> report = asyncio.run(run_load(LoadConfig(urls=("http://127.0.0.1:8090",), topic="t")))
>>> verify("pulsar://127.0.0.1:6650", "t", partitions=1, expected=report.expected)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from kop_dedup.wire import PROP_PRODUCER_ID, PROP_SEQUENCE

__all__ = ["LoadConfig", "LoadReport", "VerifyReport", "add_cli", "run_load", "verify"]

_SEQ = 1 << 31
_RETRIABLE = {3, 6, 7, 19, 51, 56}


@dataclass(frozen=True)
class LoadConfig:
    urls: tuple[str, ...]
    topic: str
    partitions: int = 1
    producers: int = 4
    batches: int = 50
    """Batches per producer and partition."""
    records: int = 10
    in_flight: int = 5
    value_size: int = 32
    request_timeout_ms: int = 10_000
    delivery_timeout_s: float = 180.0
    duration_s: float | None = None
    """Stop starting new batches after this long (None: send them all)."""
    token: str | None = None
    progress_every_s: float = 5.0


@dataclass
class LoadReport:
    sent_batches: int = 0
    sent_records: int = 0
    acknowledged: int = 0
    duplicates: int = 0
    retries: int = 0
    requests: int = 0
    fatal: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    producer_ids: list[int] = field(default_factory=list)
    expected: dict[str, list[int]] = field(default_factory=dict)
    """"pid:partition" -> [number of records delivered] (sequences 0..n-1)."""

    @property
    def delivered_records(self) -> int:
        return sum(v[0] for v in self.expected.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["delivered_records"] = self.delivered_records
        d["records_per_s"] = (
            round(self.delivered_records / self.elapsed_s, 1) if self.elapsed_s else 0
        )
        d.pop("expected")
        return d


class _Urls:
    def __init__(self, urls: tuple[str, ...]) -> None:
        self._urls = urls
        self._i = 0

    @property
    def current(self) -> str:
        return self._urls[self._i % len(self._urls)]

    def fail_over(self, url: str) -> None:
        if url == self.current:
            self._i += 1


class _Partition:
    """One producer's sequence on one partition: which batches are unresolved."""

    def __init__(self) -> None:
        self.unresolved: set[int] = set()


async def _post(
    client: httpx.AsyncClient,
    urls: _Urls,
    path: str,
    body: dict[str, Any],
) -> tuple[str, dict[str, Any] | None]:
    url = urls.current
    try:
        r = await client.post(f"{url}{path}", json=body)
    except (httpx.TransportError, OSError):
        urls.fail_over(url)
        return url, None
    if r.status_code != 200:
        if r.status_code >= 500 or r.status_code in (408, 429):
            urls.fail_over(url)
        return url, None
    return url, dict(r.json())


def _value(pid: int, partition: int, seq: int, size: int) -> str:
    text = f"{pid}:{partition}:{seq}:".encode()
    return base64.b64encode(text.ljust(size, b".")).decode()


async def _produce_one(
    cfg: LoadConfig,
    client: httpx.AsyncClient,
    urls: _Urls,
    report: LoadReport,
    pid: int,
    partition: int,
    index: int,
    state: _Partition,
    deadline: float,
) -> bool:
    base = (index * cfg.records) % _SEQ
    body = {
        "timeoutMs": cfg.request_timeout_ms,
        "batches": [
            {
                "topic": cfg.topic,
                "partition": partition,
                "producerId": pid,
                "producerEpoch": 0,
                "baseSequence": base,
                "lastSequence": (base + cfg.records - 1) % _SEQ,
                "records": [
                    {"value": _value(pid, partition, base + i, cfg.value_size)}
                    for i in range(cfg.records)
                ],
            }
        ],
    }
    report.sent_batches += 1
    report.sent_records += cfg.records
    backoff = 0.05
    while True:
        report.requests += 1
        url, answer = await _post(client, urls, "/v1/produce", body)
        code = None if answer is None else int(answer["results"][0]["errorCode"])
        if code == 0:
            report.acknowledged += 1
            return True
        if code == 46:
            report.duplicates += 1
            return True
        earlier_unresolved = any(i < index for i in state.unresolved)
        retriable = code is None or code in _RETRIABLE or (code == 45 and earlier_unresolved)
        if not retriable or time.monotonic() > deadline:
            key = f"{code}" if retriable is False else "delivery_timeout"
            report.fatal[key] = report.fatal.get(key, 0) + 1
            return False
        if code in (6, 7) or code is None:
            urls.fail_over(url)
        report.retries += 1
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 1.0)


async def _producer(
    cfg: LoadConfig,
    client: httpx.AsyncClient,
    urls: _Urls,
    report: LoadReport,
    pid: int,
    partition: int,
    stop_at: float | None,
) -> None:
    state = _Partition()
    window = asyncio.Semaphore(cfg.in_flight)
    delivered: dict[int, bool] = {}

    async def one(index: int) -> None:
        try:
            deadline = time.monotonic() + cfg.delivery_timeout_s
            delivered[index] = await _produce_one(
                cfg, client, urls, report, pid, partition, index, state, deadline
            )
        finally:
            state.unresolved.discard(index)
            window.release()

    tasks = []
    for index in range(cfg.batches):
        if stop_at is not None and time.monotonic() > stop_at:
            break
        await window.acquire()
        state.unresolved.add(index)
        tasks.append(asyncio.create_task(one(index)))
    await asyncio.gather(*tasks)
    # records 0..n-1 are expected where every batch up to n was delivered
    n = 0
    while delivered.get(n):
        n += 1
    report.expected[f"{pid}:{partition}"] = [n * cfg.records]


async def run_load(
    cfg: LoadConfig,
    stop: threading.Event | None = None,
    report: LoadReport | None = None,
) -> LoadReport:
    """Run the producers to the end (or ``duration_s``/``stop``) and report.

    Pass ``report`` to watch its counters from another thread while it runs.
    """
    report = report if report is not None else LoadReport()
    urls = _Urls(cfg.urls)
    headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
    limits = httpx.Limits(max_connections=cfg.producers * cfg.partitions * cfg.in_flight + 4)
    timeout = httpx.Timeout(cfg.request_timeout_ms / 1000 + 10)
    started = time.monotonic()
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
        for _ in range(cfg.producers):
            for attempt in itertools.count():
                _, answer = await _post(client, urls, "/v1/init-producer-id", {})
                if answer is not None and answer["errorCode"] == 0:
                    report.producer_ids.append(int(answer["producerId"]))
                    break
                if attempt > 100:
                    raise RuntimeError(f"no producer id from {cfg.urls}: {answer}")
                await asyncio.sleep(0.2)
        stop_at = None if cfg.duration_s is None else started + cfg.duration_s
        progress = asyncio.create_task(_progress(cfg, report, started))
        watcher = asyncio.create_task(_watch_stop(stop))
        work = asyncio.gather(
            *(
                _producer(cfg, client, urls, report, pid, p, stop_at)
                for pid in report.producer_ids
                for p in range(cfg.partitions)
            )
        )
        try:
            await work
        finally:
            progress.cancel()
            watcher.cancel()
    report.elapsed_s = round(time.monotonic() - started, 3)
    return report


async def _watch_stop(stop: threading.Event | None) -> None:
    if stop is None:
        return
    while not stop.is_set():  # noqa: ASYNC110 - a threading.Event from another thread
        await asyncio.sleep(0.1)
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.cancel()


async def _progress(cfg: LoadConfig, report: LoadReport, started: float) -> None:
    while True:
        await asyncio.sleep(cfg.progress_every_s)
        print(
            f"load: {time.monotonic() - started:5.1f}s sent {report.sent_batches} batches, "
            f"acked {report.acknowledged}, duplicate {report.duplicates}, "
            f"retries {report.retries}, fatal {sum(report.fatal.values())}",
            file=sys.stderr,
            flush=True,
        )


@dataclass
class VerifyReport:
    read: int
    expected: int
    lost: int
    duplicated: int
    out_of_order: int
    foreign: int
    """Records read that the load did not expect (e.g. beyond a producer's delivered prefix)."""

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.out_of_order == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def verify(
    service_url: str,
    topic: str,
    *,
    partitions: int,
    expected: dict[str, list[int]],
    tenant: str = "public",
    namespace: str = "kafka",
) -> VerifyReport:
    """Read every partition from the earliest and compare with what the load delivered."""
    import pulsar  # noqa: PLC0415

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    seen: Counter[tuple[int, int, int]] = Counter()
    out_of_order = 0
    try:
        for p in range(partitions):
            reader = client.create_reader(
                f"persistent://{tenant}/{namespace}/{topic}-partition-{p}",
                pulsar.MessageId.earliest,
            )
            last: dict[int, int] = {}
            try:
                while reader.has_message_available():
                    msg = reader.read_next(30_000)
                    props = msg.properties()
                    pid, seq = int(props[PROP_PRODUCER_ID]), int(props[PROP_SEQUENCE])
                    if seq <= last.get(pid, -1):
                        out_of_order += 1
                    last[pid] = seq
                    seen[(pid, p, seq)] += 1
            finally:
                reader.close()
    finally:
        client.close()
    want = {
        (int(k.split(":")[0]), int(k.split(":")[1]), s)
        for k, (n,) in expected.items()
        for s in range(n)
    }
    return VerifyReport(
        read=sum(seen.values()),
        expected=len(want),
        lost=sum(1 for key in want if key not in seen),
        duplicated=sum(c - 1 for c in seen.values() if c > 1),
        out_of_order=out_of_order,
        foreign=sum(1 for key in seen if key not in want),
    )


def _create_topic(admin_url: str, topic: str, partitions: int) -> None:
    """Create the partitioned topic up front, so its partition count is the load's."""
    path = f"/admin/v2/persistent/public/kafka/{topic}/partitions"
    r = httpx.put(f"{admin_url.rstrip('/')}{path}", json=partitions, timeout=30)
    if r.status_code not in (204, 409):
        raise RuntimeError(f"creating {topic} with {partitions} partitions: {r.text}")


def _handler(args: argparse.Namespace) -> int:
    if args.admin_url:
        _create_topic(args.admin_url, args.topic, args.partitions)
    cfg = LoadConfig(
        urls=tuple(args.url),
        topic=args.topic,
        partitions=args.partitions,
        producers=args.producers,
        batches=args.batches,
        records=args.records,
        in_flight=args.in_flight,
        value_size=args.value_size,
        request_timeout_ms=args.request_timeout_ms,
        delivery_timeout_s=args.delivery_timeout,
        duration_s=args.duration,
        token=os.environ.get("KOP_DEDUP_TOKEN"),
    )
    report = asyncio.run(run_load(cfg))
    out: dict[str, Any] = {"load": report.to_dict()}
    ok = not report.fatal
    if args.verify:
        v = verify(
            args.service_url, args.topic, partitions=args.partitions, expected=report.expected
        )
        out["verify"] = v.to_dict()
        ok = ok and v.ok
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for section, values in out.items():
            print(section + ": " + ", ".join(f"{k}={v}" for k, v in values.items()))
    return 0 if ok else 1


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "load",
        help="play retrying idempotent Kafka producers against the sidecar",
        description="Play idempotent Kafka producers that retry every batch until a definite "
        "answer (up to --in-flight batches per partition), optionally verify the topic.",
    )
    p.add_argument(
        "--url",
        action="append",
        default=None,
        help="sidecar URL; repeat for fail-over (default http://127.0.0.1:8090)",
    )
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--batches", type=int, default=50, help="per producer and partition")
    p.add_argument("--records", type=int, default=10, help="per batch")
    p.add_argument("--in-flight", type=int, default=5)
    p.add_argument("--value-size", type=int, default=32)
    p.add_argument("--request-timeout-ms", type=int, default=10_000)
    p.add_argument("--delivery-timeout", type=float, default=180.0, help="seconds per batch")
    p.add_argument("--duration", type=float, default=None, help="stop sending after N seconds")
    p.add_argument("--verify", action="store_true", help="read the topic back and compare")
    p.add_argument(
        "--service-url",
        default=os.environ.get("KOP_DEDUP_PULSAR_SERVICE_URL", "pulsar://127.0.0.1:6650"),
    )
    p.add_argument(
        "--admin-url",
        default=None,
        help="create the topic with --partitions first (else the sidecar "
        "auto-creates it with its default partition count)",
    )
    p.add_argument("--json", action="store_true")

    def fix_urls(args: argparse.Namespace) -> int:
        args.url = args.url or ["http://127.0.0.1:8090"]
        return _handler(args)

    p.set_defaults(func=fix_urls, url=None)
