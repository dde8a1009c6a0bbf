"""The HTTP bodies-in-flight budget (pure): one past it is refused, alone always fits."""

from __future__ import annotations

from kop_dedup.transports.http.admitted import InFlight


def test_one_byte_past_the_budget_beside_another_holder_is_refused():
    budget = InFlight(100)
    assert budget.take(60)
    assert budget.take(40)  # exactly full
    budget.release(40)
    assert not budget.take(41)
    assert (budget.in_use, budget.refused) == (60, 1)


def test_a_holder_alone_fits_whatever_its_size_and_grows_alone():
    budget = InFlight(100)
    assert budget.take(150)
    assert budget.take(50, held=150)  # a chunk more of the same streamed body
    assert not budget.take(1)  # another holder does not fit
    budget.release(200)
    assert budget.in_use == 0


def test_a_streamed_body_beside_another_is_refused_at_the_chunk_past_the_budget():
    budget = InFlight(100)
    assert budget.take(80)
    assert budget.take(10, held=0)
    assert budget.take(10, held=10)
    assert not budget.take(1, held=20)
