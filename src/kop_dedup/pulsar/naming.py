"""Kafka topic/partition -> Pulsar topic, and Pulsar producer names.

>>> names = Naming("public", "kafka", "kop")
>>> names.partition_topic("orders", 3)
'persistent://public/kafka/orders-partition-3'
>>> names.producer_name(17, 0)
'kop-17-0'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kop_dedup.errors import InvalidTopic

__all__ = ["MAX_TOPIC_LENGTH", "Naming", "check_admin_path", "validate_topic"]

MAX_TOPIC_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
_PARTITION_SUFFIX = "-partition-"


def validate_topic(topic: str) -> None:
    """Raise InvalidTopic unless ``topic`` is a legal Kafka topic name we can map.

    Kafka's rules (1..249 chars of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``),
    plus one of ours: ``-partition-`` is Pulsar's partition suffix and would
    make the mapping ambiguous.
    """
    if not topic or len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopic(f"topic name must be 1..{MAX_TOPIC_LENGTH} characters, got {len(topic)}")
    if topic in {".", ".."}:
        raise InvalidTopic(f"topic name {topic!r} is not allowed")
    if not _LEGAL.match(topic):
        raise InvalidTopic(f"topic name {topic!r} has characters outside [a-zA-Z0-9._-]")
    if _PARTITION_SUFFIX in topic:
        raise InvalidTopic(f"topic name {topic!r} contains the reserved '{_PARTITION_SUFFIX}'")


_UNSAFE_SEGMENTS = {"", ".", ".."}
_UNSAFE_ESCAPES = ("%2f", "%2e", "%25", "%5c")


def check_admin_path(path: str) -> None:
    """Raise InvalidTopic for an admin path (``/admin/v2/...``, before ``?``) that could
    step out of the resource it names: a ``.``, ``..`` or empty segment, an encoded
    ``/``, ``.``, ``%`` or backslash, a backslash (httpx and Jetty collapse ``..``)."""
    route = path.split("?", 1)[0]
    lowered = route.lower()
    if (
        not route.startswith("/admin/")
        or any(s in _UNSAFE_SEGMENTS for s in route.split("/")[1:])
        or "\\" in route
        or any(e in lowered for e in _UNSAFE_ESCAPES)
    ):
        raise InvalidTopic("a name that cannot be mapped to a Pulsar resource")


@dataclass(frozen=True, slots=True)
class Naming:
    tenant: str
    namespace: str
    producer_prefix: str

    @property
    def namespace_path(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    def topic(self, topic: str) -> str:
        """The partitioned Pulsar topic behind Kafka topic ``topic``."""
        return f"persistent://{self.tenant}/{self.namespace}/{topic}"

    def partition_topic(self, topic: str, partition: int) -> str:
        return f"{self.topic(topic)}{_PARTITION_SUFFIX}{partition}"

    def producer_name(self, producer_id: int, epoch: int) -> str:
        """Pulsar producer name for an idempotent Kafka producer at one epoch."""
        return f"{self.producer_prefix}-{producer_id}-{epoch}"

    def parse_producer_name(self, name: str) -> tuple[int, int] | None:
        """(producer id, epoch) from a name made by :meth:`producer_name`, else None."""
        head = f"{self.producer_prefix}-"
        if not name.startswith(head):
            return None
        pid, sep, epoch = name[len(head) :].rpartition("-")
        if not sep or not pid.isdigit() or not epoch.isdigit():
            return None
        return int(pid), int(epoch)
