"""Subscriptions by regular expression of the consumer group protocol (KIP-848's
SubscribedTopicRegex) as pure rules: compiling (128 as Kafka words it), resolving whole
names, the group subscribing to what a regex resolved to, a new resolution bumping the
epoch, and the group's document keeping it."""

from __future__ import annotations

import pytest

from kop_dedup import errors
from kop_dedup.protocol.groups.consumer import Beat, ConsumerGroup
from kop_dedup.protocol.groups.regex import (
    MAX_REGEX_CHARS,
    compile_regex,
    resolve,
    visible_only,
)

TOPICS = ["a1", "a2", "b1", "xa1"]
COUNTS = {"a1": 2, "a2": 1, "b1": 1, "a3": 1}


def _join(g: ConsumerGroup, member: str, regex: str, now: int = 0):  # type: ignore[no-untyped-def]
    beat = Beat(member, 0, regex=regex, owned=frozenset())
    return g.heartbeat(beat, COUNTS, now, resolved=resolve([regex], TOPICS))


@pytest.mark.parametrize("bad", ["a(", "(?<=a)b", "a{2,1}", "x" * (MAX_REGEX_CHARS + 1)])
def test_regex_that_does_not_compile_is_128_with_kafkas_message(bad: str) -> None:
    with pytest.raises(errors.InvalidRegularExpression) as caught:
        compile_regex(bad)
    assert caught.value.errno == 128
    assert str(caught.value).startswith(f"SubscribedTopicRegex `{bad}` is not a valid regular")


def test_regex_matches_whole_names_only() -> None:
    assert resolve(["a.*", "^b1$", "1"], TOPICS) == {
        "a.*": frozenset({"a1", "a2"}),
        "^b1$": frozenset({"b1"}),
        "1": frozenset(),
    }


def test_resolution_keeps_only_the_allowed_topics() -> None:
    got = visible_only(resolve(["a.*"], TOPICS), ["a2", "b1"])
    assert got == {"a.*": frozenset({"a2"})}


def test_member_joining_with_a_regex_is_assigned_what_it_resolved_to() -> None:
    g, m = _join(ConsumerGroup.new(), "m", "a.*")
    assert (m.epoch, sorted(m.assigned)) == (1, [("a1", 0), ("a1", 1), ("a2", 0)])
    assert m.regex == "a.*"
    assert g.subscribed_topics() == {"a1", "a2"}


def test_join_needs_topic_names_or_a_regex() -> None:
    with pytest.raises(errors.InvalidRequest):
        ConsumerGroup.new().heartbeat(Beat("m", 0, owned=frozenset()), COUNTS, 0)
    with pytest.raises(errors.InvalidRequest):
        ConsumerGroup.new().heartbeat(Beat("m", 0, regex="", owned=frozenset()), COUNTS, 0)


def test_topic_created_later_joins_at_the_next_resolution_with_a_new_epoch() -> None:
    g, m = _join(ConsumerGroup.new(), "m", "a.*")
    same, unchanged = g.heartbeat(Beat("m", m.epoch), COUNTS, 1_000)
    assert unchanged.epoch == m.epoch
    later = resolve(["a.*"], [*TOPICS, "a3"])
    g2, m2 = same.heartbeat(Beat("m", m.epoch), COUNTS, 11_000, resolved=later)
    assert m2.epoch == m.epoch + 1
    assert sorted(m2.assigned) == [("a1", 0), ("a1", 1), ("a2", 0), ("a3", 0)]
    assert g2.resolved_ms == 11_000


def test_topic_no_longer_matched_is_revoked() -> None:
    g, m = _join(ConsumerGroup.new(), "m", "a.*")
    fewer = resolve(["a.*"], ["a1", "b1"])
    g2, m2 = g.heartbeat(Beat("m", m.epoch), COUNTS, 11_000, resolved=fewer)
    assert g2.epoch == g.epoch + 1
    assert sorted(m2.assigned) == [("a1", 0), ("a1", 1)]
    assert m2.revoking == frozenset({("a2", 0)})


def test_names_and_regex_subscribe_to_the_union() -> None:
    beat = Beat("m", 0, topics=("b1",), regex="a2", owned=frozenset())
    _, m = ConsumerGroup.new().heartbeat(beat, COUNTS, 0, resolved=resolve(["a2"], TOPICS))
    assert sorted(m.assigned) == [("a2", 0), ("b1", 0)]


def test_member_moving_from_regex_to_names_drops_the_regex() -> None:
    g, m = _join(ConsumerGroup.new(), "m", "a.*")
    g2, m2 = g.heartbeat(Beat("m", m.epoch, topics=("b1",), regex=""), COUNTS, 1_000)
    assert m2.regex is None
    assert g2.epoch == g.epoch + 1
    assert g2.resolved == {}  # no member subscribes to it any more


def test_two_members_of_one_regex_share_its_partitions() -> None:
    g, _ = _join(ConsumerGroup.new(), "m1", "a.*")
    g, _ = _join(g, "m2", "a.*")
    assert sorted(len(a) for a in g.target.values()) == [1, 2]
    assert frozenset().union(*g.target.values()) == {("a1", 0), ("a1", 1), ("a2", 0)}


def test_resolution_survives_the_groups_document() -> None:
    g, _ = _join(ConsumerGroup.new(), "m", "a.*", now=5)
    again = ConsumerGroup.from_doc(g.to_doc())
    assert again == g
    assert again is not None
    assert again.members["m"].regex == "a.*"
