"""A committed transaction larger than a reader's read-ahead (8 MiB) in one partition is
read whole by read_committed readers, without holding it all in memory (issue 35).

The reader keeps back what lies beyond the last stable offset while a copy holds it, so
that it can see the copy whole; past its bound it reads on without keeping (remembering
where it stopped keeping), and once the copy closes it reads that part again from the
log. On the build before, a reader that had kept 8 MiB stopped reading: the copy could
never close in what it read and read_committed consumers got nothing, for good (0 of
121 records in 60 s for 120 records of 100 KB).

Both transports: Kafka Fetch (``pulsar/fetching.py``) with a confluent-kafka consumer,
and HTTP pulls of a group (``pulsar/reading.py``).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import pytest

from tests.helpers import uniq
from tests.integration.groups import configure, join, pull
from tests.integration.kafka_consume import create, produce
from tests.integration.kafka_txn import read_committed, transactional_producer, txn_id

pytestmark = [pytest.mark.integration]

VALUE_BYTES = 100_000


def _commit_big_transaction(bootstrap: str, topic: str, records: int, tag: str) -> None:
    """``records`` values of 100 KB in one committed transaction, one per batch."""
    producer = transactional_producer(
        bootstrap, txn_id("big"), **{"linger.ms": 0, "batch.size": 2 * VALUE_BYTES}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(records):
        value = f"{tag}-{i:05d}-".encode().ljust(VALUE_BYTES, b"x")
        producer.produce(topic, value=value, partition=0)
        producer.poll(0)
    assert producer.flush(120) == 0
    producer.commit_transaction(120)
    assert producer.errors == []


@pytest.mark.parametrize("records", [120, 660], ids=["11MiB", "63MiB"])
def test_read_committed_reads_a_committed_transaction_larger_than_the_read_ahead(
    sidecar_kafka: str, records: int
) -> None:
    topic = create(sidecar_kafka)
    _commit_big_transaction(sidecar_kafka, topic, records, "t")
    produce(sidecar_kafka, topic, [(0, b"after", b"after")])

    started = time.monotonic()
    got = read_committed(sidecar_kafka, topic, 1, expect=records + 1, timeout=60)
    took = time.monotonic() - started

    assert [g.offset for g in got] == list(range(records + 1))
    assert [g.value[:8] for g in got[:-1]] == [  # type: ignore[index]
        f"t-{i:05d}-".encode() for i in range(records)
    ]
    assert got[-1].value == b"after"
    # the bound: 121 records (11 MiB) read within 10 s; more, at 3 MB/s at least
    assert took < max(10.0, records / 30), f"read {records + 1} records in {took:.1f}s"


def test_a_group_pull_reads_a_committed_transaction_larger_than_the_read_ahead(
    sidecar_kafka: str, sidecar: Any
) -> None:
    records = 200  # 20 MB: more than a first pull (50 records) and 8 MiB read on past it
    topic = create(sidecar_kafka)
    _commit_big_transaction(sidecar_kafka, topic, records, "h")
    produce(sidecar_kafka, topic, [(0, b"after", b"after")])

    group = uniq("big")
    offsets: list[int] = []
    with httpx.Client(base_url=sidecar.url, timeout=60) as g:
        configure(g, group)
        member = join(g, group, [topic])["memberId"]
        deadline = time.monotonic() + 10 + records / 60
        while len(offsets) < records + 1:
            assert time.monotonic() < deadline, f"pulled {len(offsets)} of {records + 1}"
            answer = pull(g, group, member, 50, wait_ms=500)
            offsets.extend(r["offset"] for r in answer["records"])
            last = answer["records"][-1] if answer["records"] else None
    assert offsets == list(range(records + 1))
    assert last is not None
    assert base64.b64decode(last["value"]) == b"after"
