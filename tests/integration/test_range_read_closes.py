"""A copy's range read (``pulsar/entries.py`` ``read_batches``: the transaction copy
reads the journal's batches back with it) cut short while its worker thread is inside
the client's calls: the Pulsar reader must be closed once that thread returned, never
under it (a close while another thread is inside ``read_next`` on the same reader races
in the C++ client), as the fetch reads, the state tables and the group pulls do.

The old code closed it at once in its ``finally`` (``closed with calls inside: [1]``).
Nothing of Pulsar is replaced: the real reader reads a real topic on the real broker.
"""

from __future__ import annotations

import asyncio

import pulsar.asyncio as pulsar_async
import pytest

from kop_dedup.pulsar import entries
from tests.helpers import uniq
from tests.slow_reads import SlowRead

pytestmark = pytest.mark.integration


def test_a_range_read_cancelled_mid_read_closes_its_reader_once_the_read_returned(
    pulsar, pulsar_reader_client, monkeypatch
):
    topic = f"persistent://public/default/{uniq('range')}"
    producer = pulsar_reader_client.create_producer(topic, batching_enabled=False)
    last = None
    for i in range(5):
        last = producer.send(b"v%d" % i)
    producer.close()
    assert last is not None
    slow = SlowRead(monkeypatch, entries, "_scan", topic, hold_after_read=False)

    async def main() -> None:
        client = pulsar_async.Client(pulsar.service_url)
        try:
            reading = asyncio.ensure_future(
                entries.read_batches(
                    client,
                    topic,
                    after=None,
                    upto=(last.ledger_id(), last.entry_id()),
                    topic_name="t",
                    partition=0,
                    select=lambda _props: True,
                )
            )
            await slow.inside()
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            await slow.close_within(2)  # a close that does not wait comes now
            slow.release()
            await slow.close_within(30)  # a close that waits comes once the read returned
        finally:
            slow.release()
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 90))
    assert slow.closes, "the reader was never closed"
    assert slow.closes == [0] * len(slow.closes), f"closed with calls inside: {slow.closes}"
