"""The pending-offset markers' pure parts: their keys, which markers lie on a
partition, and whether a committed transaction's offset replaces the committed one."""

from __future__ import annotations

import json

import pytest

from kop_dedup.coordination.groups.pending import (
    STAGED_FIELD,
    marker_key,
    markers_of,
    shared_key,
    supersedes,
)
from kop_dedup.coordination.groups.view import key


def test_each_transaction_has_its_own_marker_key_beside_the_shared_one():
    assert json.loads(marker_key("g", "t", 3, "tx", 7)) == ["p", "g", "t", 3, "tx", 7]
    assert marker_key("g", "t", 3, "tx", 7) != marker_key("g", "t", 3, "tx", 8)
    assert marker_key("g", "t", 3, "tx", 7) != marker_key("g", "t", 3, "ty", 7)
    assert shared_key("g", "t", 3) == key("p", "g", "t", 3)


def test_the_markers_of_a_partition_are_its_own_and_the_shared_one_only():
    docs = [
        (["o", "g", "t", 0], {"offset": 1}),
        (["p", "g", "t", 0], {"transactionalId": "a"}),
        (["p", "g", "t", 0, "a", 1], {"transactionalId": "a"}),
        (["p", "g", "t", 0, "b", 4], {"transactionalId": "b"}),
        (["p", "g", "t", 1, "a", 1], {"transactionalId": "a"}),
        (["p", "g", "u", 0, "a", 1], {"transactionalId": "a"}),
    ]
    found = [k for k, _ in markers_of(docs, "t", 0)]
    assert found == [
        key("p", "g", "t", 0),
        marker_key("g", "t", 0, "a", 1),
        marker_key("g", "t", 0, "b", 4),
    ]


@pytest.mark.parametrize(
    ("marker", "committed", "expected"),
    [
        ({"after": 0, "seq": 1}, None, True),  # nothing committed, nothing since
        ({"after": 4, "seq": 1}, {"v": 4}, True),  # nothing committed since the mark
        ({"after": 4, "seq": 3}, {"v": 6}, False),  # a plain commit since: it stands
        ({"after": 4, "seq": 3}, {"v": 6, STAGED_FIELD: 2}, True),  # staged before this one
        ({"after": 4, "seq": 3}, {"v": 6, STAGED_FIELD: 5}, False),  # staged after this one
        ({"after": 4}, {"v": 4}, True),  # an earlier version's marker, nothing since
        ({"after": 4}, {"v": 6, STAGED_FIELD: 0}, False),  # an earlier version's: any stands
        ({"after": 4, "seq": 1}, {"v": 6, STAGED_FIELD: 0}, True),  # staged under the old layout
    ],
)
def test_a_transaction_s_offset_replaces_only_what_was_written_before_its_staging(
    marker, committed, expected
):
    assert supersedes(marker, committed) is expected
