"""Which group state DeleteGroups and OffsetDelete may remove, as pure rules (Kafka's
``ClassicGroup.validateDeleteGroup``, ``validateOffsetDelete`` and
``isSubscribedToTopic``), for Kafka classic groups and HTTP groups alike.

* DeleteGroups: a group with members (any state but Empty) is NON_EMPTY_GROUP (68);
  one with no members (a Kafka group that is Empty, an HTTP group nobody joined, or
  only committed offsets) is deleted whole.
* OffsetDelete: a Kafka group with members whose protocol type is not ``consumer`` is
  NON_EMPTY_GROUP for the whole request; else a partition of a topic some member
  subscribes to is GROUP_SUBSCRIBED_TO_TOPIC (86), the others are deleted. The topics
  of a ``consumer`` group are read from each member's subscription (the version-0
  prefix every version of Kafka's consumer protocol starts with); when they cannot be
  read every topic counts as subscribed, as Kafka's.

>>> member = subscription(["a", "b"])
>>> topics_of([member])
frozenset({'a', 'b'})
>>> topics_of([b"\\x00"]) is None
True
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from kop_dedup import errors
from kop_dedup.protocol.groups.classic import ClassicGroup
from kop_dedup.protocol.groups.metadata import Group

__all__ = [
    "CONSUMER_PROTOCOL",
    "check_delete_group",
    "subscribed_topics",
    "subscription",
    "topics_of",
]

CONSUMER_PROTOCOL = "consumer"
"""The protocol type of Kafka consumers (the others, Connect's, are opaque to Kafka)."""


def subscription(topics: Sequence[str], version: int = 0) -> bytes:
    """A consumer protocol subscription naming ``topics`` (no user data): for tests
    and examples."""
    out = struct.pack(">hi", version, len(topics))
    for t in topics:
        raw = t.encode()
        out += struct.pack(">h", len(raw)) + raw
    return out + struct.pack(">i", -1)


def _topics(metadata: bytes) -> list[str] | None:
    try:
        version, count = struct.unpack_from(">hi", metadata, 0)
        if version < 0 or count < 0:
            return None
        at, out = 6, []
        for _ in range(count):
            (n,) = struct.unpack_from(">h", metadata, at)
            if n < 0 or at + 2 + n > len(metadata):
                return None
            out.append(metadata[at + 2 : at + 2 + n].decode())
            at += 2 + n
    except (struct.error, UnicodeDecodeError):
        return None
    return out


def topics_of(subscriptions: Iterable[bytes]) -> frozenset[str] | None:
    """Every topic the subscriptions name; None when one cannot be read."""
    out: set[str] = set()
    for metadata in subscriptions:
        topics = _topics(metadata)
        if topics is None:
            return None
        out.update(topics)
    return frozenset(out)


def check_delete_group(kafka: ClassicGroup | None, http: Group | None) -> None:
    """DeleteGroups: NON_EMPTY_GROUP (68) while the group has members."""
    if (kafka is not None and kafka.members) or (http is not None and http.members):
        raise errors.NonEmptyGroup("the group has members: it can be deleted once they left")


def subscribed_topics(kafka: ClassicGroup | None, http: Group | None) -> frozenset[str] | None:
    """OffsetDelete: the topics whose offsets stay (None: every topic); NON_EMPTY_GROUP
    (68) for a Kafka group with members whose protocol type is not ``consumer``."""
    if kafka is not None and kafka.members:
        if kafka.protocol_type != CONSUMER_PROTOCOL:
            raise errors.NonEmptyGroup(
                f"the group has members of protocol type {kafka.protocol_type!r}: "
                "its offsets are deleted once they left"
            )
        if kafka.protocol is None:
            return None
        return topics_of(m.metadata(kafka.protocol) for m in kafka.members.values())
    if http is not None:
        return frozenset(t for m in http.members.values() for t in m.topics)
    return frozenset()
