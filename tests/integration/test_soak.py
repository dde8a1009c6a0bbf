"""A short ``kop-dedup soak`` (issue 25's exactly-once soak) on the session's broker.

One run per module: Kafka's TransactionalMessageCopier and the librdkafka copier copy a
seeded input through two sidecars while one fault of each kind but the broker's SIGKILL
lands (sidecar SIGKILL, sidecar SIGTERM, broker SIGSTOP, takeover: the broker's restart
alone would take 20-40 s of the suite's budget; the long schedules of ``kop-dedup soak``
have it); the tests below judge the run's report, one property each. Transactions of
100 records in batches of 2 make each copy land as about 50 entries per partition, so a
read_committed end inside one would be seen in every run without the last stable offset.
It needs the launcher's broker (it kills it): with ``PULSAR_SERVICE_URL`` set it skips. A failure prints the
report, whose first lines name the seed and the command that replays the schedule; the
logs are under pytest's basetemp (``soak-*``).
"""

from __future__ import annotations

from typing import Any

import pytest

from kop_dedup_tools.soak import SoakConfig, SoakReport, run_soak
from kop_dedup_tools.soak_faults import FAULT_KINDS

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SEED = 25
KINDS = sorted(set(FAULT_KINDS) - {"broker-kill"})


@pytest.fixture(scope="module")
def report(pulsar: Any, tmp_path_factory: pytest.TempPathFactory) -> SoakReport:
    cfg = SoakConfig(
        seed=SEED,
        faults=len(KINDS),
        kinds=KINDS,
        gap_s=(1.0, 3.0),
        records=800,
        wave_records=400,
        partitions=2,
        java_copiers=1,
        rdkafka_copiers=2,
        transaction_size=100,
        batch_records=2,  # many batches per partition and transaction: the LSO matters
        drain_s=120.0,
        progress_s=10.0,
        workdir=tmp_path_factory.mktemp(f"soak-{SEED}"),
        sidecar_settings={"coordinator_adopt_interval_ms": "500"},
    )
    found = run_soak(cfg, broker=pulsar.local)
    print(f"\n{found.text()}")
    return found


def failing(report: SoakReport, *names: str) -> list[str]:
    return [
        f"{c.name}: {c.violations} of {c.checked}: {c.examples}"
        for name in names
        for c in report.check(name)
        if not c.ok
    ]


def test_every_fault_kind_was_applied_and_the_copiers_finished(report: SoakReport) -> None:
    assert sorted(f.kind for f in report.faults) == KINDS
    assert [f for f in report.faults if f.error] == []
    assert report.stalled == []
    assert {p.name for p in report.pipelines} == {"java", "librdkafka"}
    assert all(p.records == report.input_records for p in report.pipelines)


def test_the_watcher_saw_read_committed_ends_from_both_sources(report: SoakReport) -> None:
    assert report.answers["list-offsets"] > 0
    assert report.answers["consumer-eof"] > 0


def test_no_copy_is_duplicated_lost_reordered_or_aborted(report: SoakReport) -> None:
    assert failing(report, "duplicates", "lost", "order", "aborted", "offsets") == []


def test_no_read_committed_end_lies_inside_a_transaction(report: SoakReport) -> None:
    assert report.check("lso")
    assert failing(report, "lso") == []
