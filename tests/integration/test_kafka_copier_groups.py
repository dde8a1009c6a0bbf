"""Exactly-once consume-transform-produce judged the way Kafka's own system test
(``transactions_test.py``) judges it: Kafka's TransactionalMessageCopier in group mode
(its read_committed consumer subscribes in a group, the group assigns it partitions,
and each transaction commits the consumed offsets with the consumer's group metadata),
copying a seeded topic through a fault: the sidecar SIGKILLed and restarted, or a
copier SIGKILLed and restarted with the same transactional id. Then a read_committed
reader of the output must find exactly the input's records, each once, in order per
partition; the note reports the counts."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_conformance import Records, Target, keys_values, records
from tests.kafka_perf_copier import copier_report, start_transactional_message_copier
from tests.kafka_tools import ToolProcess
from tests.sidecar import ProcessSidecar

pytestmark = pytest.mark.integration

PARTITIONS = 2
PER_PARTITION = 400


def copied_so_far(copiers: list[ToolProcess]) -> int:
    """Records the copiers report in committed transactions so far."""
    total = 0
    for copier in copiers:
        statuses = copier_report(copier.events()).statuses
        total += statuses[-1].total_processed if statuses else 0
    return total


def wait_for_progress(copiers: list[ToolProcess], at_least: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while copied_so_far(copiers) < at_least:
        assert time.monotonic() < deadline, f"the copiers copied {copied_so_far(copiers)}"
        assert any(c.running() for c in copiers), "every copier exited before the fault"
        time.sleep(0.2)


def start_copier(target: Target, source: str, out: str, tid: str, group: str, tmp: Path):
    return start_transactional_message_copier(
        target.bootstrap,
        source,
        0,  # ignored in group mode: the group assigns the partitions
        out,
        tid,
        group,
        tmp,
        transaction_size=50,
        use_group_metadata=True,
        group_mode=True,
    )


def seeded(target: Target) -> tuple[str, str, Records]:
    source = target.create_topic(partitions=PARTITIONS, stem="in")
    out = target.create_topic(partitions=PARTITIONS, stem="out")
    seed = records(PARTITIONS, PER_PARTITION)
    assert not [r for r in target.produce(source, seed, enable_idempotence=True) if r.error]
    return source, out, seed


def judged(target: Target, out: str, seed: Records, fault: str) -> dict[str, Any]:
    """The oracle: the output read read_committed holds the input's records once each,
    in the input's order per partition."""
    got = keys_values(target.read(out, PARTITIONS))
    want = {p: tuple((k, v) for q, k, v in seed if q == p) for p in range(PARTITIONS)}
    seen = Counter(kv for recs in got.values() for kv in recs)
    inputs = {kv for recs in want.values() for kv in recs}
    counts = {
        "fault": fault,
        "input": sum(len(r) for r in want.values()),
        "output": sum(len(r) for r in got.values()),
        "duplicates": sum(n - 1 for n in seen.values() if n > 1),
        "missing": len(inputs - set(seen)),
    }
    print(f"\ncopier counts: {counts}")
    assert (counts["duplicates"], counts["missing"]) == (0, 0), counts
    assert got == want, "the output is out of the input's order"
    return counts


def finished(copiers: list[ToolProcess], timeout: float = 240) -> None:
    for copier in copiers:
        run = copier.wait(timeout=timeout)
        report = copier_report(run.events, run)
        assert run.returncode == 0, run.stderr_tail()
        assert report.shutdown_complete


def test_copiers_in_a_group_copy_exactly_once_through_a_sidecar_sigkill(pulsar, tmp_path):
    sc = ProcessSidecar(pulsar, tmp_path).start()
    copiers: list[ToolProcess] = []
    try:
        target = Target("sidecar", sc.kafka_bootstrap, timeout=60)
        source, out, seed = seeded(target)
        group = target.unique("copiers")
        copiers = [
            start_copier(target, source, out, target.unique(f"copier-{i}"), group, tmp_path)
            for i in range(PARTITIONS)
        ]
        wait_for_progress(copiers, 150)
        sc.kill()
        sc.start()
        finished(copiers)
        judged(target, out, seed, "sidecar SIGKILL mid-copy")
    finally:
        for copier in copiers:
            copier.kill()
        sc.stop()


def test_a_copier_sigkilled_and_restarted_copies_exactly_once(sidecar_kafka, tmp_path):
    target = Target("sidecar", sidecar_kafka, timeout=60)
    source, out, seed = seeded(target)
    group, tid = target.unique("copiers"), target.unique("copier")
    first = start_copier(target, source, out, tid, group, tmp_path)
    again: list[ToolProcess] = []
    try:
        wait_for_progress([first], 200)
        first.kill()
        # the same transactional id fences the dead one's open transaction (aborted)
        # and the group hands its partitions to the new member from committed offsets
        again = [start_copier(target, source, out, tid, group, tmp_path)]
        finished(again)
        judged(target, out, seed, "copier SIGKILL mid-copy, restarted")
    finally:
        for copier in [first, *again]:
            copier.kill()
