"""What one connection's Produce requests may hold inflated at once
(``KAFKA_MAX_CONNECTION_INFLATED_BYTES``): a request reserves its own bound before it
inflates, keeps what it inflated until answered, and waits while earlier ones hold too
much (Kafka's ``queued.max.request.bytes``: the client waits, memory does not grow)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kop_dedup import errors
from kop_dedup.transports.kafka import produce

MIB = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _session(request_bytes: int, connection_bytes: int) -> SimpleNamespace:
    settings = SimpleNamespace(
        kafka_max_request_inflated_bytes=request_bytes,
        kafka_max_connection_inflated_bytes=connection_bytes,
    )
    return SimpleNamespace(settings=settings, extra={})


@pytest.mark.anyio
async def test_a_request_waits_while_the_connections_earlier_ones_hold_its_bound():
    session = _session(request_bytes=4 * MIB, connection_bytes=6 * MIB)
    second_in = asyncio.Event()

    async def second() -> None:
        async with produce._inflating(session) as budget:
            second_in.set()
            budget.take(MIB)

    async with produce._inflating(session) as first:
        first.take(3 * MIB)
        waiting = asyncio.create_task(second())
        await asyncio.sleep(0.05)
        assert not second_in.is_set()  # 4 MiB reserved of 6: no room for another 4
        first.settle()  # inflating over: 3 MiB held until answered, 1 MiB handed back
        await asyncio.sleep(0.05)
        assert not second_in.is_set()  # 3 + 4 > 6: still waits
    await asyncio.wait_for(waiting, 1)  # answered: its room is the next request's
    held = session.extra[produce.__name__]
    assert held.in_use == 0


@pytest.mark.anyio
async def test_a_request_past_its_own_bound_is_message_too_large():
    session = _session(request_bytes=2 * MIB, connection_bytes=8 * MIB)
    async with produce._inflating(session) as budget:
        budget.take(2 * MIB)
        with pytest.raises(errors.MessageTooLarge, match="KAFKA_MAX_REQUEST_INFLATED_BYTES"):
            budget.take(1)
