"""How the produce service awaits a shared future (a catch-up, a batch's receipt)
until a deadline without cancelling it."""

from __future__ import annotations

import asyncio
import time

import pytest

from kop_dedup.produce.service import _within


def test_the_outcome_comes_back_once_the_future_is_done():
    async def go() -> str:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_result, "receipt")
        return await _within(future, time.monotonic() + 5)

    assert asyncio.run(go()) == "receipt"


def test_a_failure_is_raised_as_itself():
    async def go() -> None:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(ValueError("refused"))
        await _within(future, time.monotonic() + 5)

    with pytest.raises(ValueError, match="refused"):
        asyncio.run(go())


def test_the_deadline_raises_timeout_and_leaves_the_future_to_its_other_waiters():
    async def go() -> tuple[bool, int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await _within(future, time.monotonic() + 0.01)
        impatient = asyncio.ensure_future(_within(future, time.monotonic() + 5))
        await asyncio.sleep(0)
        impatient.cancel()
        await asyncio.sleep(0)
        cancelled = future.cancelled()
        future.set_result(7)
        return cancelled, await _within(future, time.monotonic() + 5)

    assert asyncio.run(go()) == (False, 7)
