"""The explorer's CI profile (``kop-dedup edges``, issue 35): a seeded schedule of
transactions from one record to past the read-ahead's 8 MiB, aborted ones, idempotent
records, partitions added, a topic deleted and created again, and (two nodes) a node
stopped past the broker's keep-alive, through real sidecar processes with
confluent-kafka, checked after every step (nothing committed lost or read twice, nothing
aborted read, read_committed reaching the end within its bound, every client call
within its bound).

The seeds are chosen for coverage, not for passing: each schedule holds every kind of
step and a committed transaction over 8 MiB in one partition (asserted below, so a change of the planner
that loses one fails here). A failure prints the seed and the schedule; the long
profile is ``kop-dedup edges --steps 200 --max-txn-mib 64`` (docs/operations/soak.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kop_dedup_tools.edges_plan import KINDS, Profile, plan
from kop_dedup_tools.edges_run import EdgesConfig, run_edges

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CI_PROFILES = {
    "one-node": (20261350, 12, Profile(nodes=1, max_txn_bytes=12 << 20)),
    "two-nodes": (20261434, 10, Profile(nodes=2, max_txn_bytes=12 << 20)),
}


@pytest.mark.parametrize("name", sorted(CI_PROFILES))
def test_the_explorers_ci_profile_finds_no_violation(
    name: str, pulsar: Any, tmp_path: Path
) -> None:
    seed, steps, profile = CI_PROFILES[name]
    schedule = plan(seed, steps, profile)
    kinds = {s.kind for s in schedule}
    assert kinds >= set(KINDS) - ({"pause"} if profile.nodes < 2 else set()), kinds
    assert any(  # one partition's share of a committed transaction past the read-ahead
        s.kind == "txn" and s.records * s.value_bytes / len(s.partitions) > 8 << 20
        for s in schedule
    )

    report = run_edges(
        EdgesConfig(seed=seed, steps=steps, profile=profile, workdir=tmp_path),
        pulsar.service_url,
        pulsar.admin_url,
        say=print,
    )
    print(report.text())
    assert report.ok, report.text()
