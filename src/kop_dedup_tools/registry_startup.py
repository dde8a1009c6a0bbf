"""``kop-dedup registry-startup``: how long a sidecar's registry takes to start.

Writes ``--records`` epoch records over ``--keys`` producer ids into the
``producer-epochs`` topic of a fresh system namespace (automatic compaction off),
then times a fresh :class:`~kop_dedup.coordination.registry.Registry` start
``--runs`` times before and after asking the broker to compact the topic, and
prints the figures::

    kop-dedup registry-startup --records 100000 --keys 1000 \\
        --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080

Each run uses a new client and a new registry (what a restarted sidecar does)
and ends when ``Registry.start()`` returns: the epochs are replayed and the
produce path may trust them. The namespace is deleted afterwards unless
``--keep``. Needs a running broker with deduplication allowed
(``kop-dedup pulsar`` starts one).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pulsar
import pulsar.asyncio as pulsar_async

from kop_dedup.cli import add_pulsar_url_options
from kop_dedup.coordination.registry import Registry
from kop_dedup.pulsar.admin import PulsarAdmin
from kop_dedup.pulsar.naming import Naming

__all__ = ["Run", "add_cli", "delete_namespace", "measure"]

_WRITE_AT_ONCE = 5_000
_COMPACTION_WAIT_S = 300.0


@dataclass(frozen=True, slots=True)
class Run:
    phase: str
    seconds: float
    records_read: int
    slots_skipped: int
    keys: int


def _client(service_url: str) -> Any:
    return pulsar_async.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


async def _write(service_url: str, topic: str, records: int, keys: int) -> float:
    """``records`` records over ``keys`` producer ids, epochs rising in topic order."""
    client = _client(service_url)
    started = time.perf_counter()
    try:
        producer = await client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=1000,
            batching_max_publish_delay_ms=5,
            max_pending_messages=2 * _WRITE_AT_ONCE,
        )
        for start in range(0, records, _WRITE_AT_ONCE):
            await asyncio.gather(
                *(
                    producer.send(str(i // keys + 1).encode(), partition_key=str(i % keys))
                    for i in range(start, min(start + _WRITE_AT_ONCE, records))
                )
            )
        await producer.close()
    finally:
        await client.close()
    return time.perf_counter() - started


async def _start_once(service_url: str, namespace: str, phase: str) -> Run:
    client = _client(service_url)
    try:
        registry = Registry(client, namespace, "startup")
        started = time.perf_counter()
        await registry.start()
        seconds = time.perf_counter() - started
        table = registry.epochs._table
        run = Run(phase, seconds, table.records_read, table.slots_skipped, len(registry.epochs))
        await registry.close()
    finally:
        await client.close()
    return run


async def _compact(admin: PulsarAdmin, topic: str) -> float:
    started = time.perf_counter()
    await admin.compact(topic)
    while (status := await admin.compaction_status(topic)) != "SUCCESS":
        if status == "ERROR" or time.perf_counter() - started > _COMPACTION_WAIT_S:
            raise RuntimeError(f"compaction of {topic} did not succeed: {status}")
        await asyncio.sleep(0.2)
    return time.perf_counter() - started


async def measure(
    service_url: str,
    admin_url: str,
    *,
    records: int,
    keys: int,
    runs: int = 3,
    tenant: str = "public",
    keep: bool = False,
) -> tuple[str, float, float, list[Run]]:
    """(namespace, write seconds, compaction seconds, runs before and after compaction)."""
    namespace = f"{tenant}/kop-dedup-startup-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://{namespace}/producer-epochs"
    admin = PulsarAdmin(admin_url, Naming(tenant, "kafka", "startup"))
    try:
        await admin.ensure_namespace(namespace, deduplication=True, infinite_retention=True)
        await admin.set_compaction_threshold(namespace, 0)  # "before" stays uncompacted
        wrote = await _write(service_url, topic, records, keys)
        results = [await _start_once(service_url, namespace, "before") for _ in range(runs)]
        compacted = await _compact(admin, topic)
        results += [await _start_once(service_url, namespace, "after") for _ in range(runs)]
    finally:
        if not keep:
            await delete_namespace(admin_url, namespace)
        await admin.close()
    return namespace, wrote, compacted, results


async def delete_namespace(admin_url: str, namespace: str, *, attempts: int = 10) -> None:
    """Delete the namespace and its topics (the broker refuses a forced namespace delete).
    A topic still busy (a compaction the tool asked for, a reader closing) makes the
    broker refuse the namespace for a moment: topics and namespace are deleted again,
    a few times, before giving up with a message."""
    async with httpx.AsyncClient(base_url=admin_url.rstrip("/"), timeout=60) as http:
        resp = None
        for attempt in range(attempts):
            listed = await http.get(f"/admin/v2/namespaces/{namespace}/topics")
            if listed.status_code == 404:
                return
            for topic in listed.json():
                path = topic.removeprefix("persistent://")
                await http.delete(f"/admin/v2/persistent/{path}", params={"force": "true"})
            partitioned = await http.get(f"/admin/v2/persistent/{namespace}/partitioned")
            for topic in partitioned.json() if partitioned.status_code == 200 else []:
                path = topic.removeprefix("persistent://")
                await http.delete(
                    f"/admin/v2/persistent/{path}/partitions", params={"force": "true"}
                )
            resp = await http.delete(f"/admin/v2/namespaces/{namespace}")
            if resp.status_code < 400:
                return
            await asyncio.sleep(0.2 * (attempt + 1))
        if resp is not None:
            print(f"could not delete {namespace}: {resp.status_code} {resp.text}")


def _report(
    args: argparse.Namespace, namespace: str, wrote: float, compacted: float, runs: list[Run]
) -> str:
    title = (
        f"registry start-up: {args.records:,} epoch records over {args.keys:,} producer ids "
        f"({namespace}; written in {wrote:.1f} s, compacted in {compacted:.1f} s)"
    )
    lines = [title, "phase   run  seconds  records read  slots skipped   keys"]
    for phase in ("before", "after"):
        for i, run in enumerate(r for r in runs if r.phase == phase):
            lines.append(
                f"{phase:<7} {i + 1:>3}  {run.seconds:7.3f}  {run.records_read:>12,}  "
                f"{run.slots_skipped:>13,}  {run.keys:>5,}"
            )
    for phase in ("before", "after"):
        times = [r.seconds for r in runs if r.phase == phase]
        lines.append(f"{phase} compaction: {min(times):.2f}-{max(times):.2f} s")
    return "\n".join(lines)


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "registry-startup",
        help="time a registry start over N epoch records, before and after compaction",
    )
    add_pulsar_url_options(p)
    p.add_argument("--records", type=int, default=100_000, help="epoch records to write")
    p.add_argument("--keys", type=int, default=1_000, help="distinct producer ids among them")
    p.add_argument("--runs", type=int, default=3, help="timed starts before and after")
    p.add_argument("--tenant", default="public")
    p.add_argument("--keep", action="store_true", help="keep the namespace afterwards")

    def handler(args: argparse.Namespace) -> int:
        if not 0 < args.keys <= args.records:
            raise ValueError("--keys must be in 1..--records")
        namespace, wrote, compacted, runs = asyncio.run(
            measure(
                args.pulsar_service_url,
                args.pulsar_admin_url,
                records=args.records,
                keys=args.keys,
                runs=args.runs,
                tenant=args.tenant,
                keep=args.keep,
            )
        )
        print(_report(args, namespace, wrote, compacted, runs))
        return 0

    p.set_defaults(func=handler)
