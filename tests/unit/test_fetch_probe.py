"""A fetch of many partitions reads what each reader's client holds without asking the
broker (``EntryReader.read(ask=False)``) and asks apart (:meth:`EntryReader.probe`); the
client is a stand-in (tests/unit/test_fetch_reading.py), the fetch over a real broker is
tests/integration/test_kafka_fetch_many.py."""

from __future__ import annotations

import asyncio

from kop_dedup.pulsar.fetching import EntryReader
from tests.unit.test_fetch_reading import _Log, _messages, _Positions


def test_a_reader_the_broker_said_drained_a_moment_ago_is_not_asked_again():
    """``read(ask=False)`` takes what the client holds and asks nothing; :meth:`probe`
    asks once; a read within ``fresh_s`` of the broker's "nothing more" that finds
    nothing stays drained without asking; past it, it is to be asked again."""
    reader = EntryReader(_Log(_messages([2])), _Positions({}), "t", 0, (5, 0, 0))  # type: ignore[arg-type]
    got = asyncio.run(reader.read(1 << 20, ask=False))
    client = reader._reader._reader  # type: ignore[union-attr]
    assert [len(e.records) for e in got] == [2]
    assert (reader.unasked, reader.drained, client.calls.count("has")) == (True, False, 0)
    asyncio.run(reader.probe())
    assert (reader.unasked, reader.drained, client.calls.count("has")) == (False, True, 1)
    assert asyncio.run(reader.read(1 << 20, ask=False, fresh_s=60.0)) == []
    assert (reader.unasked, reader.drained, client.calls.count("has")) == (False, True, 1)
    assert asyncio.run(reader.read(1 << 20, ask=False, fresh_s=0.0)) == []
    assert (reader.unasked, reader.drained, client.calls.count("has")) == (True, False, 1)
    assert reader.read_offset == 2
