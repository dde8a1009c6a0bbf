"""How long a batch waits for its turn inside ProduceService, on a controlled clock.

No Pulsar here: the batch's send is replaced, since what is tested is only when the
sequencing loop lets a batch go. Publishing and dedup are tested against the real
broker in tests/integration.
"""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

import pytest

from kop_dedup.produce import service as service_module
from kop_dedup.produce.service import Channel, ProduceService
from kop_dedup.protocol.records import KafkaBatch, KafkaRecord


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def bare_service(sent: list[int]) -> ProduceService:
    """A ProduceService with only what its sequencing loop uses; sends are recorded."""
    svc = object.__new__(ProduceService)
    svc.closing = False

    async def send(
        channel: Channel, batch: KafkaBatch, last: int, deadline: float, *, resend: bool
    ) -> str:
        sent.append(last)
        return "1:0:-1:0"

    svc._send = send  # type: ignore[method-assign]
    return svc


@pytest.mark.anyio
async def test_a_fresh_start_above_zero_goes_when_the_reorder_window_ends_on_a_slow_clock(
    monkeypatch,
):
    """A producer with no state that starts above sequence 0 waits out the reorder
    window, then goes. The loop once read the clock twice per turn: on a machine slow
    enough for the window to end between the two readings, the first said "window
    still open: wait" and the second "window over: wait until the deadline", and the
    batch was answered REQUEST_TIMED_OUT 30 s later (seen in CI). Here the clock moves
    0.6 s between readings and the window ends at 1.5 s, between the old loop's
    second and third reading."""
    readings = itertools.count(0.0, 0.6)
    monkeypatch.setattr(service_module, "time", SimpleNamespace(monotonic=lambda: next(readings)))
    sent: list[int] = []
    svc = bare_service(sent)
    channel = Channel(("persistent://public/kafka/t-partition-0", 7, 0))  # reads 0.0
    batch = KafkaBatch("t", 0, 7, 0, 5, 5, (KafkaRecord(None, b"v"),))
    channel.arrived.append(batch.base_sequence)
    answer = await asyncio.wait_for(
        svc._sequence(channel, batch, deadline=100.0, gap_deadline=1.5), timeout=10
    )
    assert answer == "1:0:-1:0"
    assert sent == [5]
