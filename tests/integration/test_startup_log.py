"""A sidecar's start says in one INFO line per state log which partitions it took,
not one line per partition (the details are at DEBUG)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.helpers import uniq, wait_until
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration


def test_a_start_sums_up_the_state_partitions_it_took_in_one_info_line_per_log(pulsar, caplog):
    system = uniq("sys")  # a system namespace of its own: every state partition is free
    caplog.set_level(logging.DEBUG, logger="kop_dedup")

    def mine(level: int) -> list[Any]:
        return [
            r
            for r in caplog.records
            if r.levelno == level
            and r.name.startswith(("kop_dedup.coordination", "kop_dedup.pulsar"))
            and system in r.getMessage()
            and "partition" in r.getMessage()
        ]

    with ThreadSidecar(pulsar, system_namespace=system, txn_log_partitions=8, offsets_partitions=8):
        # every partition taken (at DEBUG now; each was an INFO line before)
        owned = lambda: [  # noqa: E731
            r
            for r in caplog.records
            if "owns partition" in r.getMessage() and system in r.getMessage()
        ]
        wait_until("all 16 state partitions to be taken", lambda: len(owned()) >= 16)
        wait_until("the INFO summaries", lambda: len(mine(logging.INFO)) >= 2, timeout=10)
        infos = [r.getMessage() for r in mine(logging.INFO)]
    assert len(infos) == 2, infos
    details = owned()
    assert len(details) == 16, [r.getMessage() for r in details]
    assert all(r.levelno == logging.DEBUG for r in details), [r.getMessage() for r in details]
    assert any(m.startswith("transaction log: took 8 of 8 partitions") for m in infos), infos
    assert any(m.startswith("consumer groups: took 8 of 8 partitions") for m in infos), infos
