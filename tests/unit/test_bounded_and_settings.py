"""The bounded map behind the sidecar's memory, and the settings that size the queues."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kop_dedup.bounded import BoundedMap
from kop_dedup.settings import Settings


@given(st.integers(min_value=1, max_value=20), st.lists(st.integers(0, 50), max_size=300))
def test_a_bounded_map_never_holds_more_than_its_capacity_and_keeps_the_most_recent(cap, keys):
    m = BoundedMap[int, int](cap)
    for k in keys:
        m[k] = k
    assert len(m) <= cap
    recent = list(dict.fromkeys(reversed(keys)))[:cap]
    assert set(m) == set(recent)
    assert (m.dropped > 0) == (len(set(keys)) > cap)


def test_reading_an_entry_makes_it_recent():
    m = BoundedMap[str, int](2)
    m["a"], m["b"] = 1, 2
    assert m.get("a") == 1
    m["c"] = 3
    assert set(m) == {"a", "c"}
    assert m.dropped == 1


def test_the_client_queue_is_sized_for_every_batch_in_flight():
    s = Settings(max_batch_records=200, max_inflight_batches=5)
    assert s.producer_queue_records == 1000


def test_a_queue_past_the_bound_is_refused_with_the_product_named():
    with pytest.raises(ValidationError, match="max_batch_records x max_inflight_batches"):
        Settings(max_batch_records=100_000, max_inflight_batches=20)


def test_a_batch_byte_limit_over_the_brokers_message_limit_is_refused():
    with pytest.raises(ValidationError, match="pulsar_max_message_bytes"):
        Settings(max_batch_bytes=4 << 20, pulsar_max_message_bytes=1 << 20)


@pytest.mark.parametrize("field", ["tenant", "namespace", "system_namespace"])
def test_a_tenant_or_namespace_given_as_a_path_is_refused_by_its_setting(field):
    """The sidecar puts the tenant before a namespace itself: ``public/bench`` for the
    system namespace started, and failed at start-up with the admin API's 405 for
    ``public/public/bench``. Refused here, by the setting's name, before anything."""
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: "public/bench"})
    assert getattr(Settings(**{field: "bench-fc_1.x"}), field) == "bench-fc_1.x"
