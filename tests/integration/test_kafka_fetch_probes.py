"""A fetch that empties more partitions than it asks about at once: one past the bound.

A fetch of many partitions reads what each reader's client holds without asking the
broker, then asks whether more is there (GetLastMessageId) for all the partitions it
emptied at once, ``_PROBES_IN_FLIGHT`` (64) at a time (``transports/kafka/fetch.py``
``_probe``). Here 100 partitions are emptied in one fetch, so the asks go in two rounds:
every partition must be asked (none left unasked, whose next fetch would have to ask it
again), none twice while the broker's "nothing more" is within ``end_ttl_s``, every
record delivered once, in order, and what comes later (on the last partition and the
first) pushed to a long poll. Real consumers and the wire, real Pulsar.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import _pulsar
import pytest

from kop_dedup.pulsar.reader_pool import PoolLimits
from kop_dedup.transports.kafka import fetch as kafka_fetch
from tests.integration.kafka_consume import batches, create, fetch_request, produce
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration

PARTITIONS = 100  # past _PROBES_IN_FLIGHT (64), and _MANY_PARTITIONS (16)
EACH = 3


def _asked(monkeypatch: pytest.MonkeyPatch, topic: str) -> list[int]:
    """The partitions of ``topic`` asked of the broker whether more is there, in order
    (a spy on the client's calls; the sidecar's own tables are not counted)."""
    asked: list[int] = []
    stem = f"/{topic}-partition-"
    for name in ("has_message_available", "has_message_available_async"):
        original = getattr(_pulsar.Reader, name)

        def counted(self: Any, *args: Any, _original: Any = original) -> Any:
            of = self.topic()
            if stem in of:
                asked.append(int(of.rsplit("-", 1)[1]))
            return _original(self, *args)

        monkeypatch.setattr(_pulsar.Reader, name, counted)
    return asked


def _records(answer: Any) -> dict[int, list[tuple[int, bytes | None]]]:
    """The records of an answer per partition, as (offset, value); every partition
    answered without an error."""
    out: dict[int, list[tuple[int, bytes | None]]] = {}
    for part in answer.responses[0].partitions:
        assert part.error_code == 0, part
        got = [(r.offset, r.value) for b in batches(part.records) for r in b]
        if got:
            out[part.partition_index] = got
    return out


def _take(answer: Any, got: dict[int, list[tuple[int, bytes | None]]], at: dict[int, int]) -> None:
    """Add an answer's records to ``got``; the next fetch of each partition at the offset
    after its last record, as a consumer does."""
    for p, records in _records(answer).items():
        got.setdefault(p, []).extend(records)
        at[p] = records[-1][0] + 1


def _probes_ended(deadline_s: float = 30.0) -> None:
    """Once the asks a fetch stopped waiting for (its deadline passed) have ended."""
    deadline = time.monotonic() + deadline_s
    while kafka_fetch._probing and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kafka_fetch._probing, "the fetch's late asks did not end"


def test_a_fetch_emptying_more_partitions_than_asks_in_flight_skips_none(sidecar, monkeypatch):
    address = sidecar.kafka_bootstrap
    topic = create(address, PARTITIONS)
    values = {p: [f"v{p}-{i}".encode() for i in range(EACH)] for p in range(PARTITIONS)}
    produce(address, topic, [(p, b"k", values[p][i]) for i in range(EACH) for p in values])
    asked = _asked(monkeypatch, topic)
    at = dict.fromkeys(range(PARTITIONS), 0)
    got: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    # the first fetch opens 100 readers (placed by admin calls): 24 s seen at load 40
    with WireClient(address, timeout=120) as client:
        # every record once, in order: the fetches that empty the 100 client queues
        deadline = time.monotonic() + 120
        while any(n < EACH for n in at.values()) and time.monotonic() < deadline:
            _take(client.call(fetch_request(topic, at), 12), got, at)
        assert got == {p: list(enumerate(v)) for p, v in values.items()}

        # caught up: one fetch asks every partition not known drained, once; the 100
        # emptied ones go in two rounds of at most 64
        pool = sidecar.kafka._shared.readers
        monkeypatch.setattr(pool, "limits", PoolLimits(end_ttl_s=60.0))
        asked.clear()
        answer = client.call(fetch_request(topic, at, max_wait_ms=300), 12)
        assert _records(answer) == {}
        assert [p.high_watermark for p in answer.responses[0].partitions] == [EACH] * PARTITIONS
        _probes_ended()
        twice = {p: n for p, n in collections.Counter(asked).items() if n > 1}
        assert twice == {}, f"asked more than once within end_ttl_s: {twice}"
        # none left unasked: a fetch within end_ttl_s asks nothing
        once = list(asked)
        answer = client.call(fetch_request(topic, at, max_wait_ms=300), 12)
        assert _records(answer) == {}
        _probes_ended()
        assert asked == once, f"asked again within end_ttl_s: {asked[len(once) :]}"

        # the last partition and the first get one record each while a long poll waits
        asked.clear()
        late = [(PARTITIONS - 1, b"k", b"late-last"), (0, b"k", b"late-first")]
        timer = threading.Timer(1.0, produce, (address, topic, late))
        timer.start()
        more: dict[int, list[tuple[int, bytes | None]]] = {}
        try:
            started = time.monotonic()
            answer = client.call(fetch_request(topic, at, max_wait_ms=20_000), 12)
            elapsed = time.monotonic() - started
            _take(answer, more, at)
        finally:
            timer.join()
        assert 0.9 < elapsed < 15, elapsed  # pushed: answered when the first came
        deadline = time.monotonic() + 30
        while len(more) < 2 and time.monotonic() < deadline:
            _take(client.call(fetch_request(topic, at), 12), more, at)
        assert more == {0: [(EACH, b"late-first")], PARTITIONS - 1: [(EACH, b"late-last")]}
        _probes_ended()
        counts = collections.Counter(asked)
        # only the two that got a record are asked again (what came after the broker's
        # "nothing more"), each once
        assert set(counts) <= {0, PARTITIONS - 1}, counts
        assert all(n == 1 for n in counts.values()), counts
