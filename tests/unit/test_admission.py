"""ByteBudget: the in-flight request bytes bound."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kop_dedup.admission import ByteBudget


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_a_request_that_fits_is_admitted_at_once_and_gives_its_bytes_back():
    budget = ByteBudget(100)
    async with budget.hold(60):
        assert (budget.in_use, budget.waiting) == (60, 0)
    assert budget.in_use == 0


@pytest.mark.anyio
async def test_a_request_over_the_budget_waits_until_bytes_are_given_back():
    budget = ByteBudget(100)
    await budget.acquire(60)
    second = asyncio.create_task(budget.acquire(50))
    await _settle()
    assert not second.done()
    assert budget.waiting == 1
    budget.release(60)
    await _settle()
    assert second.done()
    assert budget.in_use == 50


@pytest.mark.anyio
async def test_waiters_are_admitted_in_arrival_order():
    budget = ByteBudget(100)
    await budget.acquire(60)
    big = asyncio.create_task(budget.acquire(90))
    await _settle()
    small = asyncio.create_task(budget.acquire(10))  # would fit, but comes later
    await _settle()
    assert not big.done()
    assert not small.done()
    budget.release(60)
    await _settle()
    assert big.done()
    assert small.done()
    assert budget.in_use == 100


@pytest.mark.anyio
async def test_a_request_larger_than_the_budget_is_admitted_alone():
    budget = ByteBudget(100)
    await budget.acquire(1)
    huge = asyncio.create_task(budget.acquire(1_000))
    await _settle()
    assert not huge.done()
    budget.release(1)
    await _settle()
    assert huge.done()
    assert budget.in_use == 100
    budget.release(1_000)
    assert budget.in_use == 0


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_the_queue_and_lets_the_next_in():
    budget = ByteBudget(100)
    await budget.acquire(60)
    big = asyncio.create_task(budget.acquire(90))
    await _settle()
    small = asyncio.create_task(budget.acquire(30))
    await _settle()
    big.cancel()
    await _settle()
    assert small.done()
    assert budget.in_use == 90
    assert budget.waiting == 0


@pytest.mark.anyio
async def test_a_waiter_cancelled_right_after_its_grant_gives_the_bytes_back():
    budget = ByteBudget(100)
    await budget.acquire(100)
    waiter = asyncio.create_task(budget.acquire(40))
    await _settle()
    budget.release(100)  # grants the waiter, which has not resumed yet
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert budget.in_use == 0
    assert budget.waiting == 0


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ByteBudget(0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 150), min_size=1, max_size=25),
    holds=st.lists(st.integers(0, 3), min_size=25, max_size=25),
)
def test_never_over_budget_unless_alone_and_everyone_gets_in(sizes, holds):
    async def main() -> None:
        budget = ByteBudget(100)
        peak_ok = True

        async def request(i: int, n: int) -> None:
            nonlocal peak_ok
            async with budget.hold(n):
                holders[i] = n
                peak_ok &= len(holders) == 1 or sum(holders.values()) <= budget.capacity
                for _ in range(holds[i]):
                    await asyncio.sleep(0)
                del holders[i]

        holders: dict[int, int] = {}
        await asyncio.wait_for(
            asyncio.gather(*(request(i, n) for i, n in enumerate(sizes))), timeout=5
        )
        assert peak_ok
        assert budget.in_use == 0
        assert budget.waiting == 0

    asyncio.run(main())
