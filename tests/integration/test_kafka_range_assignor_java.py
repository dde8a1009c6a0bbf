"""The server-side ``range`` assignor against Kafka's own (``org.apache.kafka.coordinator.
group.assignor.RangeAssignor`` of the Kafka 4.1 jars, run by ``tests/java/RangeJudge.java``):
the same sequences of members joining and leaving (some static, with an instance id;
subscriptions alike and not), the targets compared step by step."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from kop_dedup.protocol.groups.assignors import range_assign
from kop_dedup_tools import kafka_jars

pytestmark = [pytest.mark.integration]

_JUDGE = Path(__file__).parent.parent / "java" / "RangeJudge.java"
COUNTS = {"t": 4, "u": 3, "v": 7}


def _steps(rng: random.Random, n: int) -> list[tuple[dict[str, tuple[str, ...]], dict[str, str]]]:
    members: dict[str, tuple[str, ...]] = {}
    instances: dict[str, str] = {}
    same = rng.random() < 0.5
    out = []
    for _ in range(n):
        if members and (len(members) > 5 or rng.random() < 0.35):
            gone = rng.choice(sorted(members))
            members.pop(gone)
            instances.pop(gone, None)
        else:
            m = f"m{rng.randrange(100):02d}"
            members[m] = (
                ("t", "u")
                if same
                else tuple(sorted(rng.sample(sorted(COUNTS), rng.randint(1, len(COUNTS)))))
            )
            if rng.random() < 0.4:
                instances[m] = f"i{rng.randrange(100):02d}"
        if members:
            out.append((dict(members), dict(instances)))
    return out


def _arg(members: dict[str, tuple[str, ...]], instances: dict[str, str]) -> str:
    return ";".join(
        m + (f"@{instances[m]}" if m in instances else "") + ":" + ",".join(ts)
        for m, ts in members.items()
    )


def _line(got: dict[str, frozenset[tuple[str, int]]]) -> str:
    return ";".join(
        f"{m}=" + ",".join(f"{t}-{p}" for t, p in sorted(a)) for m, a in sorted(got.items())
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_range_assignor_matches_kafkas_over_joins_and_leaves(seed: int) -> None:
    steps = _steps(random.Random(seed), 12)
    counts = ",".join(f"{t}={n}" for t, n in COUNTS.items())
    java = kafka_jars.java_tool("java")
    judged = subprocess.run(
        [java, "-cp", kafka_jars.classpath(), str(_JUDGE), counts, *(_arg(*s) for s in steps)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    previous: dict[str, frozenset[tuple[str, int]]] = {}
    ours = []
    for members, instances in steps:
        previous = range_assign(members, COUNTS, previous, instances)
        ours.append(_line(previous))
    assert ours == judged
