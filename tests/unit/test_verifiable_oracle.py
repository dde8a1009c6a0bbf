"""The at-least-once oracle of the VerifiableConsumer fault test without a JVM: what
Kafka's VerifiableConsumer prints (4.1.2's event shapes), judged; each rule catches the
fault it is for, and a clean run with a hand-over passes."""

from __future__ import annotations

from typing import Any

from tests.kafka_verifiable import judge

T = "t"


def assigned(at: int, *parts: int) -> dict[str, Any]:
    return {
        "timestamp": at,
        "name": "partitions_assigned",
        "partitions": [{"topic": T, "partition": p} for p in parts],
    }


def revoked(at: int, *parts: int) -> dict[str, Any]:
    return {**assigned(at, *parts), "name": "partitions_revoked"}


def read(at: int, p: int, low: int, high: int) -> list[dict[str, Any]]:
    records = [
        {
            "timestamp": at,
            "name": "record_data",
            "topic": T,
            "partition": p,
            "offset": o,
            "key": None,
            "value": f"{p}-{o}",
        }
        for o in range(low, high + 1)
    ]
    summary = {
        "topic": T,
        "partition": p,
        "count": high - low + 1,
        "minOffset": low,
        "maxOffset": high,
    }
    return [
        *records,
        {
            "timestamp": at,
            "name": "records_consumed",
            "count": high - low + 1,
            "partitions": [summary],
        },
    ]


def commit(at: int, p: int, offset: int, error: str | None = None) -> dict[str, Any]:
    e = {
        "timestamp": at,
        "name": "offsets_committed",
        "success": error is None,
        "offsets": [{"topic": T, "partition": p, "offset": offset}],
    }
    return e if error is None else {**e, "error": error}


PRODUCED = [f"0-{o}" for o in range(10)]
ENDS = {(T, 0): 10}
FIRST = [assigned(1, 0), *read(2, 0, 0, 4), commit(3, 0, 5)]
REBALANCED = "Commit cannot be completed since the group has already rebalanced"


def test_a_hand_over_with_a_re_read_and_a_rebalance_failure_passes():
    first = [*FIRST, *read(4, 0, 5, 6), commit(9, 0, 7, REBALANCED), revoked(10, 0)]
    second = [assigned(8, 0), *read(8, 0, 5, 9), commit(9, 0, 10)]
    verdict = judge([first, second], PRODUCED, ENDS)
    assert verdict.violations == []
    assert (verdict.consumed, verdict.duplicates, verdict.failed_commits) == (12, 2, 1)


def test_a_record_never_read_and_an_end_never_committed_are_caught():
    verdict = judge([[*FIRST, *read(4, 0, 5, 8), commit(5, 0, 9)]], PRODUCED, ENDS)
    assert verdict.missing == 1
    assert any("never consumed" in v for v in verdict.violations)
    assert any("not 10" in v for v in verdict.violations)


def test_a_commit_going_back_across_members_is_caught():
    first = [*FIRST, *read(4, 0, 5, 9), commit(5, 0, 10)]
    zombie = [assigned(1, 0), *read(2, 0, 0, 2), commit(6, 0, 3)]
    verdict = judge([first, zombie], PRODUCED, ENDS)
    assert any("went back from 10 to 3" in v for v in verdict.violations)


def test_a_new_owner_starting_behind_the_last_commit_is_caught():
    second = [assigned(5, 0), *read(6, 0, 2, 9), commit(7, 0, 10)]
    verdict = judge([FIRST, second], PRODUCED, ENDS)
    assert any("started at 2, behind the offset 5" in v for v in verdict.violations)


def test_a_gap_a_commit_past_the_position_and_a_plain_failure_are_caught():
    member = [
        *FIRST,
        *read(4, 0, 6, 9),  # 5 skipped
        commit(5, 0, 10),
        commit(6, 0, 11),  # past what it read
        commit(7, 0, 10, "Timeout of 60000ms expired before successfully committing offsets"),
    ]
    verdict = judge([member], PRODUCED, ENDS)
    assert any("from 6, expected 5" in v for v in verdict.violations)
    assert any("past its position" in v for v in verdict.violations)
    assert any("outside a rebalance" in v for v in verdict.violations)
