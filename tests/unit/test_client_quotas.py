"""Kafka's client quotas as pure rules (:mod:`kop_dedup.protocol.client_quotas`): the
validation AlterClientQuotas answers with (Kafka 4.1's messages, checked on the wire
by tests/integration/test_kafka_client_quotas.py), the DescribeClientQuotas filter, and
the byte-rate throttle."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.protocol.client_quotas import (
    SAMPLE_S,
    WINDOW_SAMPLES,
    ByteRate,
    check_alteration,
    check_filter,
    matches,
    throttle_ms,
)

P = "producer_byte_rate"


@pytest.mark.parametrize(
    ("entity", "ops", "problem"),
    [
        ([("user", "a")], [(P, 1024.0, False)], None),
        ([("user", None)], [(P, 0.0, True)], None),
        ([], [], "Invalid empty client quota entity"),
        ([("bogus", "a")], [], "Unhandled client quota entity type: bogus"),
        ([("user", "")], [], "Empty user not supported"),
        ([("user", "a")], [("bogus", 1.0, False)], "Invalid configuration key bogus"),
        ([("user", "a")], [(P, -5.0, False)], f"Quota {P} must be greater than 0"),
        ([("user", "a")], [(P, 0.0, False)], f"Quota {P} must be greater than 0"),
        ([("user", "a")], [(P, 1.5, False)], f"{P} cannot be a fractional value."),
        (
            [("user", "a")],
            [(P, 1.0, False), (P, 2.0, False)],
            "Ignoring duplicate entity ClientQuotaEntity(entries={user=a})",
        ),
    ],
)
def test_alterations_are_refused_with_kafkas_messages(entity, ops, problem):
    assert check_alteration(entity, ops) == problem


@pytest.mark.parametrize(
    ("entity", "ops"),
    [
        ([("client-id", "c")], [(P, 1.0, False)]),
        ([("user", "a"), ("client-id", "c")], [(P, 1.0, False)]),
        ([("user", "a")], [("request_percentage", 20.0, False)]),
    ],
)
def test_what_is_not_served_is_refused_saying_so(entity, ops):
    problem = check_alteration(entity, ops)
    assert problem is not None
    assert "served here" in problem


def test_filters_match_users_as_kafka_does():
    everyone = check_filter([], strict=False)
    assert matches(everyone, "a")
    assert matches(everyone, None)
    assert not matches(check_filter([], strict=True), "a")  # an entity of no component
    one = check_filter([("user", 0, "a")], strict=False)
    assert matches(one, "a")
    assert not matches(one, "b")
    default = check_filter([("user", 1, None)], strict=True)
    assert matches(default, None)
    assert not matches(default, "a")
    assert not matches(check_filter([("client-id", 2, None)], strict=False), "a")


@pytest.mark.parametrize(
    ("components", "error", "message"),
    [
        ([("bogus", 2, None)], errors.UnsupportedVersion, "Unsupported entity type bogus"),
        (
            [("user", 0, None)],
            errors.InvalidRequest,
            "Request specified MATCH_TYPE_EXACT, but set match string to null.",
        ),
        (
            [("user", 2, None), ("user", 2, None)],
            errors.InvalidRequest,
            "Entity type user cannot appear more than once in the filter.",
        ),
        ([("user", 7, None)], errors.UnsupportedVersion, "Unknown match type 7"),
    ],
)
def test_malformed_filters_get_kafkas_codes(components, error, message):
    with pytest.raises(error) as raised:
        check_filter(components, strict=False)
    assert raised.value.message == message


def test_throttle_is_the_time_for_the_rate_to_fall_back_and_at_most_the_window():
    assert throttle_ms(rate=1000.0, quota=1000.0, window_s=10.0) == 0
    assert throttle_ms(rate=1200.0, quota=1000.0, window_s=10.0) == 2000
    assert throttle_ms(rate=1e9, quota=1.0, window_s=10.0) == int(WINDOW_SAMPLES * SAMPLE_S * 1000)


def test_the_rate_is_over_at_least_all_samples_but_one_and_forgets_old_samples():
    rates = ByteRate()
    key = ("alice", P)
    assert rates.record(key, 10_000, now=100.0) == 1_000.0  # 10,000 bytes over 10 s
    assert rates.record(key, 10_000, now=105.5) == 2_000.0
    assert rates.window_s(key, 105.5) == 10.0
    # 20 s later both samples have left the window
    assert rates.record(key, 1_000, now=125.0) == 100.0
