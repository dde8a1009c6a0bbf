"""``kop-dedup bench --streams-restart``: how long a Kafka Streams application
(``exactly_once_v2``) takes to start again over a changelog of ``--changelog-mib`` MiB,
against a real Apache Kafka broker (one KRaft node started for the run) and through the
sidecar's Kafka listener (one sidecar), in one run.

Per side (:func:`measure_side`): a topic of ``--streams-partitions`` partitions gets
``records = changelog MiB / --streams-value-bytes`` small input records (key ``k<i %
keys>``, value ``<i>``; ``--streams-keys`` keys, by default a quarter of the records, so
each key is written about four times and the store, the changelog's compacted view, is
about a quarter of it); the application (:mod:`kop_dedup_tools.bench.streams_app`) widens
each value to ``--streams-value-bytes`` bytes and keeps each key's latest in a RocksDB
store, so its changelog grows by one record of that size per input record (the record
cache off). Once it has processed every record (a progress line every 10 s):

1. **clean**: SIGTERM (a last commit, the checkpoints written, the group left), then the
   same application id and state directory started again;
2. **killed**: once that run is RUNNING, a tenth more input, and SIGKILL as soon as
   it says it processes it (a transaction open), then started again;
3. **new dir**: SIGTERM, then started with an empty state directory (as on another
   machine): every store restored from its changelog's start. This is what every start
   cost through the listener before its transactional Produce answers carried offsets
   (``KAFKA_TRANSACTION_PRODUCE_OFFSETS=none``: no checkpoint, the store wiped).

Each restart reports the seconds from the JVM's start to RUNNING and from its first
restore to its last (the restore listener), the records restored (bytes: records x value
bytes), the checkpoint offsets found in the state directory before it, and the
changelog's ends (the share restored is of the ends, which on Kafka count the
transaction markers too); each figure carries the load average at its start. On Kafka
a clean restart restores nothing (the checkpoint is the changelog's end); through the listener
a Produce in a transaction is answered with a floor of its offset
(``KAFKA_TRANSACTION_PRODUCE_OFFSETS=floor``), so the checkpoint lies a little behind
the end and the restart replays that suffix. After a SIGKILL, Streams 4.1 restores from
the checkpoint it wrote when the killed run finished its own restore (taken from the
restore consumer's position, so exact on both sides): what was written since.

Results: ``<out>/streams-restart.json`` and the table printed. Not run in CI (minutes
to an hour at 1 GiB):

>>> kop-dedup bench --streams-restart --changelog-mib 1024 --out bench-results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kop_dedup_tools.bench.kafka_clients import create, real_kafka
from kop_dedup_tools.bench.results import machine
from kop_dedup_tools.bench.streams_app import StoreApp, checkpoints, processed_of, restore_of
from kop_dedup_tools.bench.support import say, start_sidecar, step
from kop_dedup_tools.sidecar import SidecarProcess

__all__ = ["Plan", "Restart", "add_cli", "measure_side", "plan", "render", "run"]

MIB = 1 << 20
SIDES = ("kafka", "listener")
TITLE = "Kafka Streams (exactly_once_v2) restarts: a real Kafka vs the kop-dedup listener"
_PROGRESS_S = 10.0


@dataclass(frozen=True)
class Plan:
    """What the fill writes: ``records`` changelog records of ``value_bytes`` over
    ``keys`` keys and ``partitions`` partitions."""

    records: int
    keys: int
    value_bytes: int
    partitions: int

    @property
    def changelog_mib(self) -> float:
        return self.records * self.value_bytes / MIB

    @property
    def store_mib(self) -> float:
        """The store's size once filled (each key's latest value)."""
        return min(self.keys, self.records) * self.value_bytes / MIB


def plan(changelog_mib: float, value_bytes: int, keys: int = 0, partitions: int = 2) -> Plan:
    """The fill for a changelog of about ``changelog_mib`` MiB (values only): records of
    ``value_bytes`` over ``keys`` keys (0: a quarter of the records, at least one)."""
    if changelog_mib <= 0 or value_bytes <= 0 or partitions <= 0 or keys < 0:
        raise ValueError("the changelog size, value size and partitions must be positive")
    records = math.ceil(changelog_mib * MIB / value_bytes)
    return Plan(records, keys or max(1, records // 4), value_bytes, partitions)


@dataclass
class Restart:
    """One start of the application after a stop (``how``: clean or killed)."""

    how: str
    to_running_s: float
    restore_s: float
    restored: int
    restored_mib: float
    checkpoints: dict[int, int]
    ends: dict[int, int]
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    load: float = 0.0


def _load() -> float:
    return round(os.getloadavg()[0], 1)


def _ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4().hex}"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=60)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def _produce_input(bootstrap: str, topic: str, fill: Plan) -> None:
    """The small input records: key ``k<i % keys>``, value ``<i>``."""
    from confluent_kafka import Producer  # noqa: PLC0415

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 50,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    for i in range(fill.records):
        while True:
            try:
                producer.produce(topic, key=f"k{i % fill.keys}".encode(), value=str(i).encode())
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(600):
        raise RuntimeError("the input was not delivered within 600 s")


def _fill(side: str, app: StoreApp, fill: Plan, timeout_s: float) -> dict[str, Any]:
    """Start the application and wait until it has processed every input record, with a
    progress line every 10 s."""
    load0 = _load()
    app.start()
    first_running = app.wait_running(600)
    started = time.monotonic()
    said = started
    while (done := processed_of(app.lines())) < fill.records:
        app.check()
        now = time.monotonic()
        if now - started > timeout_s:
            raise RuntimeError(f"{side}: {done:,} of {fill.records:,} records in {timeout_s:.0f}s")
        if now - said >= _PROGRESS_S:
            said = now
            mib = done * fill.value_bytes / MIB
            say(
                f"bench: streams-restart: {side}: filled {done:,} of {fill.records:,} records "
                f"({mib:.0f} of {fill.changelog_mib:.0f} MiB) in {now - started:.0f}s, "
                f"{mib / (now - started):.1f} MiB/s, load {_load()}"
            )
        time.sleep(0.5)
    seconds = time.monotonic() - started
    return {
        "first_running_s": round(first_running, 2),
        "fill_s": round(seconds, 1),
        "fill_mib_per_s": round(fill.changelog_mib / seconds, 2) if seconds else None,
        "load_at_start": load0,
        "load_at_end": _load(),
    }


def _restart(
    side: str, how: str, app: StoreApp, bootstrap: str, fill: Plan, *, new_state: bool = False
) -> Restart:
    """Start ``app`` again after its stop or kill (``new_state``: with an empty state
    directory); what the restart restored and took."""
    found = {} if new_state else checkpoints(app.state / app.application_id, app.changelog)
    ends = _ends(bootstrap, app.changelog, fill.partitions)
    load = _load()
    say(f"bench: streams-restart: {side}: {how} restart, checkpoints {found}, ends {ends}")
    app.start(new_state=new_state)
    to_running = app.wait_running(3600)
    restore = restore_of(app.lines())
    out = Restart(
        how,
        round(to_running, 2),
        round(restore.seconds, 2),
        restore.total,
        round(restore.total * fill.value_bytes / MIB, 1),
        found,
        ends,
        restore.ranges,
        load,
    )
    say(
        f"bench: streams-restart: {side}: {how} restart RUNNING after {out.to_running_s}s, "
        f"{out.restored:,} records ({out.restored_mib} MiB) restored in {out.restore_s}s"
    )
    return out


def _delete(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answers are in
    for future in admin.delete_topics(topics).values():
        try:
            future.result(60)
        except Exception as exc:  # the run's figures stand; a topic left is said
            say(f"bench: streams-restart: a topic was not deleted: {exc}")


def _kill_while_processing(
    side: str, app: StoreApp, bootstrap: str, topic: str, fill: Plan
) -> dict[str, int]:
    """More input (a tenth of the fill, 2,000 records at least), and SIGKILL at the first
    sign that the application processes it (it says so each second): a transaction
    open, the store ahead of its checkpoints. What it had processed of how many."""
    more = replace(fill, records=max(2_000, fill.records // 10))
    _produce_input(bootstrap, topic, more)
    deadline = time.monotonic() + 600
    while (done := processed_of(app.lines())) == 0:
        app.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side}: none of {more.records} more records in 600s")
        time.sleep(0.05)
    app.kill()
    say(f"bench: streams-restart: {side}: SIGKILL after {done:,} of {more.records:,} more records")
    return {"processed_before_kill": done, "more_records": more.records}


def measure_side(
    side: str, bootstrap: str, fill: Plan, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Fill, stop cleanly and restart, kill and restart, on one side; its figures."""
    topic = f"bench-streams-in-{uuid.uuid4().hex[:8]}"
    app = StoreApp(
        workdir / side,
        bootstrap,
        f"bench-streams-{uuid.uuid4().hex[:8]}",
        topic,
        value_bytes=fill.value_bytes,
        commit_interval_ms=args.commit_interval_ms,
    )
    try:
        with step(f"{side}: the input topic"):
            create(bootstrap, topic, fill.partitions)
            _produce_input(bootstrap, topic, fill)
        with step(f"{side}: the fill"):
            figures = _fill(side, app, fill, args.fill_timeout_s)
        with step(f"{side}: a clean stop and restart"):
            if not app.stop():
                raise RuntimeError(f"{side}: Streams did not close within its grace")
            clean = _restart(side, "clean", app, bootstrap, fill)
        with step(f"{side}: a SIGKILL while processing, and restart"):
            figures.update(_kill_while_processing(side, app, bootstrap, topic, fill))
            killed = _restart(side, "killed", app, bootstrap, fill)
        with step(f"{side}: a clean stop and a start with a new state directory"):
            if not app.stop():
                raise RuntimeError(f"{side}: Streams did not close within its grace")
            fresh = _restart(side, "new dir", app, bootstrap, fill, new_state=True)
        app.stop()
    finally:
        app.kill()
        _delete(bootstrap, [topic, app.changelog])
    return {**figures, "restarts": [asdict(r) for r in (clean, killed, fresh)]}


def render(fill: Plan, sides: dict[str, dict[str, Any]]) -> str:
    """The table of a run: a row per side and restart."""
    head = (
        f"{TITLE}\n{fill.changelog_mib:,.0f} MiB of changelog: {fill.records:,} records of "
        f"{fill.value_bytes:,} B over {fill.keys:,} keys (store {fill.store_mib:,.0f} MiB), "
        f"{fill.partitions} partitions\n"
    )
    cols = (
        f"{'side':<9} {'fill s':>7} {'restart':<7} {'checkpoint/end':>21} {'restored':>10} "
        f"{'MiB':>7} {'share':>6} {'restore s':>9} {'to RUNNING s':>12} {'load':>5}"
    )
    rows = [head, cols, "-" * len(cols)]
    for side, figures in sides.items():
        for r in figures["restarts"]:
            marks = f"{sum(r['checkpoints'].values()):,}/{sum(r['ends'].values()):,}"
            end = sum(r["ends"].values())
            share = r["restored"] / end if end else 0.0
            rows.append(
                f"{side:<9} {figures['fill_s']:>7.1f} {r['how']:<7} {marks:>21} "
                f"{r['restored']:>10,} {r['restored_mib']:>7.1f} {share:>6.1%} "
                f"{r['restore_s']:>9.1f} {r['to_running_s']:>12.1f} {r['load']:>5.1f}"
            )
    return "\n".join(rows)


def run(args: argparse.Namespace, out: Path, broker: dict[str, Any]) -> None:
    """Both sides in one run (``--streams-sides``), Kafka first."""
    fill = plan(
        args.changelog_mib, args.streams_value_bytes, args.streams_keys, args.streams_partitions
    )
    say(
        f"bench: streams-restart: {fill.records:,} records of {fill.value_bytes:,} B "
        f"({fill.changelog_mib:,.0f} MiB) over {fill.keys:,} keys per side, load {_load()}"
    )
    args.against_kafka = "kafka" in args.streams_sides
    sides: dict[str, dict[str, Any]] = {}
    workdir = out.resolve() / "streams-restart"
    with real_kafka(args, out) as kafka:
        if kafka:
            sides["kafka"] = measure_side("kafka", kafka["bootstrap"], fill, args, workdir)
        if "listener" in args.streams_sides:
            sc: SidecarProcess = start_sidecar(args)
            try:
                sides["listener"] = measure_side(
                    "listener", sc.kafka_bootstrap, fill, args, workdir
                )
            finally:
                sc.stop()
    results = {
        "mode": "streams-restart",
        "title": TITLE,
        "machine": machine(),
        "broker": broker,
        "setup": {
            **asdict(fill),
            "commit_interval_ms": args.commit_interval_ms,
            "kafka": kafka or None,
        },
        "sides": sides,
    }
    path = out / "streams-restart.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{render(fill, sides)}\n\nwrote {path}")


def add_cli(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--streams-restart",
        action="store_true",
        help="a Kafka Streams exactly_once_v2 application's restart over a changelog of "
        "--changelog-mib MiB, after a clean stop and after a SIGKILL, against a real "
        "Kafka and through the listener (streams-restart.json)",
    )
    p.add_argument("--changelog-mib", type=float, default=1024.0, help="--streams-restart's")
    p.add_argument(
        "--streams-value-bytes", type=int, default=4096, help="--streams-restart's value size"
    )
    p.add_argument(
        "--streams-keys",
        type=int,
        default=0,
        help="--streams-restart's key space (default: a quarter of the records)",
    )
    p.add_argument("--streams-partitions", type=int, default=2, help="--streams-restart's")
    p.add_argument(
        "--streams-sides",
        nargs="+",
        choices=SIDES,
        default=list(SIDES),
        help="--streams-restart's targets (default both)",
    )
    p.add_argument(
        "--commit-interval-ms",
        type=int,
        default=100,
        help="--streams-restart: Streams' commit.interval.ms (100: its exactly-once default)",
    )
    p.add_argument(
        "--fill-timeout-s", type=float, default=3600.0, help="--streams-restart's fill, at most"
    )
