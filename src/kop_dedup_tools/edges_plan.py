"""``kop-dedup edges``: the seeded schedule of steps, as pure data (no I/O).

The explorer (:mod:`kop_dedup_tools.edges_run`) looks for the next edge where a bound
meets another mechanism: it drives real Kafka clients through one or more sidecars with
a schedule drawn from a seed, and checks Kafka's guarantees after every step. The
schedule is a function of the seed and the profile alone, so a failure is replayed by
its seed (``kop-dedup edges --seed N`` with the same options), and printed whole.

Steps (each names a topic *slot*: a slot holds one live topic at a time; a deleted one
is replaced by a new topic of a new name in the same slot):

- ``txn``: a transactional producer (one of two transactional ids, so epochs move and
  the previous producer is fenced) writes ``records`` values of ``value_bytes`` spread
  over ``partitions`` of the slot's topic, and commits; sizes are drawn log-uniformly
  from one record to ``max_txn_bytes`` (64 MiB in the long profile), so transactions
  land on both sides of every size bound (the read-ahead's 8 MiB among them);
- ``abort``: the same, aborted: none of it may ever be read;
- ``plain``: an idempotent producer writes ``records`` values to one partition;
- ``grow``: CreatePartitions to ``count`` (producers and the checker's consumer see the
  new partitions, whose leaders are placed among the nodes);
- ``delete``: the slot's topic is deleted and a new one created in its place (what was
  committed to the old one leaves the model);
- ``pause``: node ``node`` is stopped (SIGSTOP) for ``seconds`` (past the broker's
  keep-alive) while an idempotent producer writes ``records`` values through the other
  nodes, then resumed (only with two or more nodes).

>>> profile = Profile(nodes=2, max_txn_bytes=1 << 20)
>>> [describe(s) for s in plan(7, 5, profile)] == [describe(s) for s in plan(7, 5, profile)]
True
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

__all__ = ["KINDS", "Profile", "Step", "describe", "plan"]

KINDS = ("txn", "abort", "plain", "grow", "delete", "pause")

_VALUE_SIZES = (16, 1_000, 100_000)
"""Value sizes a transaction draws from (100 KB: under librdkafka's 1 MB message bound)."""
_MAX_RECORDS = 4_000
"""Records in one step at most (the count of small values stays quick to check)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """What a schedule may contain."""

    nodes: int = 1
    max_txn_bytes: int = 12 << 20
    """A transaction's bytes at most (drawn log-uniformly up to it)."""
    slots: int = 2
    """Topics live at once."""
    max_partitions: int = 6
    pause_seconds: float = 12.0
    """How long a pause lasts: past the broker's keep-alive (about 10 s for the local
    broker, which sets 5 s) so that the paused node is fenced."""
    weights: dict[str, int] = field(
        default_factory=lambda: {
            "txn": 6,
            "abort": 2,
            "plain": 3,
            "grow": 2,
            "delete": 1,
            "pause": 2,
        }
    )


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a schedule (see the module docstring); ``index`` counts from 0."""

    index: int
    kind: str
    slot: int
    partitions: tuple[int, ...] = ()
    records: int = 0
    value_bytes: int = 0
    count: int = 0
    node: int = 0
    seconds: float = 0.0
    transactional_id: int = 0
    """Which of the two transactional ids (``txn`` and ``abort``)."""


def _size(rng: random.Random, max_bytes: int) -> tuple[int, int]:
    """(records, value bytes) of a transaction of a log-uniform size up to ``max_bytes``."""
    target = math.exp(rng.uniform(math.log(16), math.log(max(max_bytes, 17))))
    value = max([v for v in _VALUE_SIZES if v <= target] or [_VALUE_SIZES[0]])
    records = max(1, min(_MAX_RECORDS, round(target / value)))
    if records * value > max_bytes:
        records = max(1, max_bytes // value)
    return records, value


def plan(seed: int, steps: int, profile: Profile) -> list[Step]:
    """The schedule of ``steps`` steps for ``seed`` (the same answer every time)."""
    rng = random.Random(seed)  # noqa: S311 - a schedule to replay, not a secret
    counts = [rng.randint(1, 3) for _ in range(profile.slots)]
    kinds = [k for k in KINDS if profile.weights.get(k, 0) > 0]
    if profile.nodes < 2:
        kinds = [k for k in kinds if k != "pause"]
    out: list[Step] = []
    for index in range(steps):
        kind = rng.choices(kinds, weights=[profile.weights[k] for k in kinds])[0]
        if kind == "grow" and all(c >= profile.max_partitions for c in counts):
            kind = "txn"
        slot = rng.randrange(profile.slots)
        if kind == "grow":
            slot = rng.choice([s for s, c in enumerate(counts) if c < profile.max_partitions])
        count = counts[slot]
        if kind in ("txn", "abort"):
            records, value = _size(rng, profile.max_txn_bytes)
            parts = tuple(sorted(rng.sample(range(count), rng.randint(1, count))))
            out.append(
                Step(
                    index,
                    kind,
                    slot,
                    parts,
                    records,
                    value,
                    transactional_id=rng.randrange(2),
                )
            )
        elif kind == "plain":
            out.append(Step(index, kind, slot, (rng.randrange(count),), rng.randint(1, 200), 64))
        elif kind == "grow":
            counts[slot] = rng.randint(count + 1, profile.max_partitions)
            out.append(Step(index, kind, slot, count=counts[slot]))
        elif kind == "delete":
            counts[slot] = rng.randint(1, 3)
            out.append(Step(index, kind, slot, count=counts[slot]))
        else:  # pause
            node = rng.randrange(profile.nodes)
            out.append(
                Step(
                    index,
                    kind,
                    slot,
                    (rng.randrange(count),),
                    rng.randint(1, 50),
                    64,
                    node=node,
                    seconds=profile.pause_seconds,
                )
            )
    return out


def describe(step: Step) -> str:
    """One line a person can read (and the report prints for a replay)."""
    head = f"#{step.index} {step.kind} slot {step.slot}"
    if step.kind in ("txn", "abort"):
        size = step.records * step.value_bytes
        return (
            f"{head}: {step.records} x {step.value_bytes} B ({size / 2**20:.2f} MiB) to "
            f"partitions {list(step.partitions)} with transactional id #{step.transactional_id}"
        )
    if step.kind == "plain":
        return f"{head}: {step.records} records to partition {step.partitions[0]}"
    if step.kind == "grow":
        return f"{head}: to {step.count} partitions"
    if step.kind == "delete":
        return f"{head}: deleted, a new topic of {step.count} partitions in its place"
    return (
        f"{head}: node #{step.node} stopped {step.seconds:.0f} s while {step.records} "
        f"records go to partition {step.partitions[0]}"
    )
