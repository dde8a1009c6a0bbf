"""Which group state DeleteGroups and OffsetDelete may remove (pure rules)."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.protocol.groups.classic import ClassicGroup, JoinRequest
from kop_dedup.protocol.groups.deletion import (
    check_delete_group,
    subscribed_topics,
    subscription,
    topics_of,
)


def _group(ptype: str = "consumer", metadata: bytes = b"") -> ClassicGroup:
    req = JoinRequest("a", None, "c", "h", 6000, 6000, ptype, (("range", metadata),))
    return ClassicGroup.new().add_pending("a", 0, 6000).join(req, 0)


def test_a_subscription_of_any_version_names_its_topics():
    assert topics_of([subscription(["a", "b"]), subscription(["c"], version=3)]) == {"a", "b", "c"}


@pytest.mark.parametrize("metadata", [b"", b"\x00", b"\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00"])
def test_an_unreadable_subscription_names_no_topics(metadata):
    assert topics_of([subscription(["a"]), metadata]) is None


def test_a_group_with_members_is_not_deleted():
    with pytest.raises(errors.NonEmptyGroup):
        check_delete_group(_group(), None)
    left = _group().leave("a", 1)
    assert left.state == "Empty"
    check_delete_group(left, None)
    check_delete_group(None, None)


def test_offsets_of_topics_a_member_subscribes_to_stay():
    assert subscribed_topics(_group(metadata=subscription(["t"])), None) == {"t"}
    assert subscribed_topics(_group(metadata=b"junk"), None) is None  # every topic
    assert subscribed_topics(_group().leave("a", 1), None) == frozenset()
    assert subscribed_topics(None, None) == frozenset()


def test_offsets_of_a_group_of_another_protocol_type_with_members_stay():
    with pytest.raises(errors.NonEmptyGroup):
        subscribed_topics(_group(ptype="connect"), None)
